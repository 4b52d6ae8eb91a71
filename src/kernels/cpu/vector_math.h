// f32 math on whole vectors: exp, expm1, log, erf, sigmoid, tanh, softplus,
// Gelu and the small helpers they share, for vector_kernels_isa.cc only.
//
// Written once with GCC vector types at the native width of the instruction
// set the including file is compiled for (4 lanes for baseline x86-64, 8 with
// AVX2, 16 with AVX-512); every function is branch-free, so a lane computes
// the same whatever its neighbours hold. The polynomial coefficients come from
// scripts/fit_vector_math.py. Everything lives in a namespace named after the
// instruction set: these inline functions are compiled differently in each
// compilation, and sharing a name across them would let the linker keep an
// AVX-512 copy for the baseline path.
//
// Conventions: clamps are written so that NaN passes them (a comparison with
// NaN is false), and NaN then propagates through the arithmetic. Lanes of a
// branch that a select discards may compute inf or NaN; kernels never read the
// floating-point exception flags (-fno-trapping-math).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#define KILN_VECTOR_NS avx512
#define KILN_VECTOR_BYTES 64
#elif defined(__AVX2__) && defined(__FMA__)
#define KILN_VECTOR_NS avx2
#define KILN_VECTOR_BYTES 32
#else
#define KILN_VECTOR_NS generic
#define KILN_VECTOR_BYTES 16
#endif

namespace kiln::vec::KILN_VECTOR_NS {

using F32 = float __attribute__((vector_size(KILN_VECTOR_BYTES)));
// Integer lanes; also what comparing F32s gives: -1 where true, 0 where false.
using I32 = int32_t __attribute__((vector_size(KILN_VECTOR_BYTES)));
// F32's lanes widened to double (two native vectors).
using F64 = double __attribute__((vector_size(2 * KILN_VECTOR_BYTES)));
inline constexpr int kLanes = KILN_VECTOR_BYTES / 4;

inline constexpr float kInf = __builtin_inff();
inline constexpr float kNaN = __builtin_nanf("");

// ------------------------------------------------------------------ basics

inline F32 splat(float v) { return v - F32{}; }  // v - 0 is v for every v, -0 and NaN included
inline I32 splat(int32_t v) { return v - I32{}; }
inline F32 load(const float* p) {
  F32 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, F32 v) { std::memcpy(p, &v, sizeof v); }
// The first `count` (< kLanes) lanes from p, the others `fill`.
inline F32 loadPartial(const float* p, int64_t count, float fill) {
  float lanes[kLanes];
  for (float& lane : lanes) lane = fill;
  std::memcpy(lanes, p, static_cast<size_t>(count) * sizeof(float));
  return load(lanes);
}
inline void storePartial(float* p, F32 v, int64_t count) {
  float lanes[kLanes];
  store(lanes, v);
  std::memcpy(p, lanes, static_cast<size_t>(count) * sizeof(float));
}

inline F32 fromBits(I32 v) { return __builtin_bit_cast(F32, v); }
inline I32 toBits(F32 v) { return __builtin_bit_cast(I32, v); }
inline F32 toFloat(I32 v) { return __builtin_convertvector(v, F32); }
inline F32 toFloat(F64 v) { return __builtin_convertvector(v, F32); }
inline F64 toDouble(F32 v) { return __builtin_convertvector(v, F64); }

inline F32 select(I32 mask, F32 a, F32 b) { return mask ? a : b; }
inline I32 select(I32 mask, I32 a, I32 b) { return mask ? a : b; }
inline F32 abs(F32 x) { return fromBits(toBits(x) & 0x7fffffff); }
inline F32 copySign(F32 magnitude, F32 sign) {
  return fromBits((toBits(magnitude) & 0x7fffffff) | (toBits(sign) & static_cast<int32_t>(0x80000000u)));
}
inline F32 atLeast(F32 x, float lo) { return select(x < lo, splat(lo), x); }
inline F32 atMost(F32 x, float hi) { return select(x > hi, splat(hi), x); }
inline F32 sqrt(F32 x) {
  F32 r;
  for (int i = 0; i < kLanes; ++i) r[i] = __builtin_sqrtf(x[i]);  // vectorised: (v)sqrtps
  return r;
}
// a * b + c rounded once. One instruction where the instruction set has FMA
// (kHasFma: the AVX builds); a call per lane in the baseline build.
inline constexpr bool kHasFma =
#if defined(__FMA__)
    true;
#else
    false;
#endif
inline F32 fusedMultiplyAdd(F32 a, F32 b, F32 c) {
  F32 r;
  for (int i = 0; i < kLanes; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);  // vectorised: vfmadd
  return r;
}
// x / d rounded as the division rounds it, for d whose reciprocal r (= 1 / d
// rounded) is finite and normal and |x / d| < 2^24: two Newton steps from
// x * r, each an exact residual and an FMA. The first makes the quotient
// faithful (within an ulp); from a faithful quotient and a correctly rounded
// reciprocal the second gives the correctly rounded one (Markstein's
// theorem). Several times the throughput of a division, on the FMA builds.
inline F32 divideByReciprocal(F32 x, F32 d, F32 r) {
  F32 q = x * r;
  q = fusedMultiplyAdd(fusedMultiplyAdd(-q, d, x), r, q);
  return fusedMultiplyAdd(fusedMultiplyAdd(-q, d, x), r, q);
}
// Round toward -inf / +inf. From 2^23 on every float is an integer (and NaN
// and inf fail the test), so they stay, and only the others go through int
// (whose range they fit); copySign keeps floor(-0) = -0 and ceil(-0.5) = -0.
inline F32 truncateSmall(F32 x, I32 small) {
  return toFloat(__builtin_convertvector(select(small, x, F32{}), I32));
}
inline F32 floor(F32 x) {
  const I32 small = abs(x) < 8388608.0f;
  const F32 t = truncateSmall(x, small);
  return select(small, copySign(t - select(t > x, splat(1.0f), F32{}), x), x);
}
inline F32 ceil(F32 x) {
  const I32 small = abs(x) < 8388608.0f;
  const F32 t = truncateSmall(x, small);
  return select(small, copySign(t + select(t < x, splat(1.0f), F32{}), x), x);
}

// c0 + x (c1 + x (c2 + ...)); coefficients lowest degree first.
template <typename V, typename C>
inline V horner(V, C c) {
  return c - V{};
}
template <typename V, typename C, typename... Rest>
inline V horner(V x, C c, Rest... rest) {
  return horner(x, rest...) * x + c;
}

// -------------------------------------------------------------- exp, expm1

// ln 2 in two parts: kLn2Hi has 9 significant bits, so n * kLn2Hi is exact
// for every exponent n a float has.
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;  // ln 2 - kLn2Hi

// e^(hi + lo) = 2^n (1 + q) with n = round(hi / ln 2) and q = e^r - 1,
// r = hi + lo - n ln 2 in about [-ln2/2, ln2/2]. lo is a small correction of
// hi (below hi's rounding error); most callers pass 0. Needs |hi| < 2^21
// (callers clamp far tighter).
struct ExpReduced {
  I32 n;
  F32 q;
};
inline ExpReduced reduceExp(F32 hi, F32 lo) {
  constexpr float kLog2e = 1.44269504f;
  constexpr float kRounder = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer, left in the low bits
  const F32 biased = hi * kLog2e + kRounder;
  const F32 n = biased - kRounder;
  const F32 r = (hi - n * kLn2Hi) - n * kLn2Lo + lo;  // hi - n * kLn2Hi is exact
  const F32 q = r + r * r *
                        horner(r, 5.000000044e-01f, 1.666666637e-01f, 4.166636104e-02f, 8.333389346e-03f,
                               1.394061696e-03f, 1.984587715e-04f);
  return {toBits(biased) - toBits(splat(kRounder)), q};
}

// 2^n for n in [-126, 127].
inline F32 pow2(I32 n) { return fromBits((n + 127) << 23); }

// m 2^n for n in [-252, 254] and m in [0.5, 2], in two exact halves so that
// results near overflow and in the subnormal range round once, correctly.
inline F32 scaleByPow2(F32 m, I32 n) {
  const I32 half = n >> 1;
  return m * pow2(half) * pow2(n - half);
}

// e^(hi + lo) 2^scale (see reduceExp for lo), scale in [0, 64]. Within 1
// ulp. A scale keeps a result that would be subnormal in the normal range,
// for a caller that multiplies it before scaling back.
inline F32 expHiLo(F32 hi, F32 lo, int32_t scale = 0) {
  // e^89 overflows, and e^-120 = 8e-53 is so far below the smallest
  // subnormal (1.4e-45) that even times 2^24 and a factor of a million it
  // rounds to 0. The clamps keep n in [-174, 128] and turn -inf into 0.
  const ExpReduced e = reduceExp(atMost(atLeast(hi, -120.0f), 89.0f), lo);
  return scaleByPow2(1.0f + e.q, e.n + scale);
}
inline F32 exp(F32 x) { return expHiLo(x, F32{}); }

// e^x - 1 without the cancellation of exp(x) - 1 near 0.
inline F32 expm1(F32 x) {
  // Below -25, e^x - 1 rounds to -1.
  const ExpReduced e = reduceExp(atMost(atLeast(x, -25.0f), 89.0f), F32{});
  // 2^n (1 + q) - 1 = 2^n q + (2^n - 1): one rounding while 2^n - 1 is exact
  // (n <= 24). Beyond, subtracting 1 from e^x rounds once anyway.
  const F32 s = pow2(select(e.n < 25, e.n, splat(24)));
  const F32 near = e.q * s + (s - 1.0f);
  const F32 far = scaleByPow2(1.0f + e.q, e.n) - 1.0f;
  return select(e.n < 25, near, far);
}

// --------------------------------------------------------------------- log

// log(2^e (1 + f)) for f in [-0.25, 0.5] and integral e: log1p(f) is
// f - f^2/2 + f^3 P(f), summed smallest first. Within 1 ulp.
inline F32 logReduced(F32 e, F32 f) {
  const F32 f2 = f * f;
  const F32 p = horner(f, 3.333333986e-01f, -2.500016527e-01f, 1.999960486e-01f, -1.665529658e-01f,
                       1.427623880e-01f, -1.272777913e-01f, 1.170066081e-01f, -9.116187215e-02f,
                       3.767288694e-02f);
  const F32 tail = f2 * f * p - 0.5f * f2 + e * kLn2Lo;
  return (f + tail) + e * kLn2Hi;
}

inline F32 log(F32 x) {
  // Subnormals first move up into the normal range.
  const I32 subnormal = x < 1.17549435e-38f;
  const F32 xn = select(subnormal, x * 8388608.0f, x);  // 2^23
  // x = 2^e m with m in [0.75, 1.5): subtracting the bits of 0.75 moves the
  // exponent's boundary from 1 there; f = m - 1 is then exact. (The bits of
  // |x|: a sign bit would overflow the subtraction, and x < 0 gives NaN
  // below anyway.)
  const I32 bits = toBits(abs(xn)) - 0x3f400000;
  const I32 e = (bits >> 23) - (subnormal & 23);
  const F32 m = fromBits((bits & 0x007fffff) + 0x3f400000);
  const F32 y = logReduced(toFloat(e), m - 1.0f);
  // log(+inf) = inf, log(0) = -inf, log(x < 0) = NaN, log(NaN) = NaN.
  const F32 special = select(x == 0.0f, splat(-kInf), splat(kNaN));
  return select(x > 0.0f, select(x == kInf, x, y), special);
}

// log(1 + y) for y in [0, 1].
inline F32 log1pUnit(F32 y) {
  // 1 + y = 2^e (1 + f): below 0.5, e = 0 and f = y; above, e = 1 and
  // f = (y - 1) / 2. Both are exact, so log1p keeps every bit of a tiny y.
  const I32 upper = y >= 0.5f;
  return logReduced(select(upper, splat(1.0f), F32{}), select(upper, (y - 1.0f) * 0.5f, y));
}

// ----------------------------------------------------------------- erf, Gelu

// erf(u) / u as a polynomial in v = u^2, for |u| < 0.935.
inline F32 erfOverU(F32 v) {
  return horner(v, 1.128379167e+00f, -3.761263283e-01f, 1.128368177e-01f, -2.685864772e-02f, 5.199192879e-03f,
                -8.122078240e-04f, 8.283908751e-05f);
}

// From here on erf rounds to 1 in f32.
inline constexpr float kErfOne = 3.925f;

// log(erfc(u)) for u in [0.9, kErfOne] (u above is taken as kErfOne).
inline F32 logErfc(F32 u) {
  return horner(atMost(u, kErfOne), 1.692039205e-04f, -1.129488400e+00f, -6.334008643e-01f, -1.082203681e-01f,
                2.508060548e-02f, -4.156250446e-03f, 4.313925809e-04f, -2.082852768e-05f);
}

inline F32 erf(F32 x) {
  const F32 small = x * erfOverU(x * x);
  const F32 large = copySign(1.0f - exp(logErfc(abs(x))), x);
  return select(abs(x) < 0.921875f, small, large);
}

// x Phi(x) for x in [-14.5, -0.6], Phi the standard normal distribution
// function: x G(-x) exp(-x^2 / 2). exp is ill-conditioned here (a relative
// error d of x^2/2 becomes x^2/2 d of the result), so x^2 / 2 is computed
// exactly in double and handed to exp as a rounded part and its remainder. G,
// a polynomial in s = 1 / (1.5 - x), is evaluated in double too: its
// coefficients are large and of both signs. Multiplying by x before exp keeps
// results just above the subnormal range from passing through it.
inline F32 xGaussianTail(F32 x) {
  const F64 xd = toDouble(x);
  const F64 a = -0.5 * xd * xd;  // exact: x has 24 significant bits
  const F32 hi = toFloat(a);
  const F32 lo = toFloat(a - toDouble(hi));
  const F64 s = 1.0 / (1.5 - xd);
  const F64 g = horner(s, -4.6621710310985750e-07, 3.9898010937957418e-01, 5.9706468573872917e-01,
                       5.2658122786497519e-01, -8.2106336564041160e-01, 1.1880071728413157e+00,
                       -2.2210684643416606e+01, 9.4882710777147494e+01, -2.0098284945046657e+02,
                       2.4495097619596439e+02, -1.6621033256047534e+02, 4.9124566802391030e+01);
  return toFloat(xd * g) * expHiLo(hi, lo);
}

// x Phi(x) = x (1 + erf(x / sqrt 2)) / 2, in three ranges so that each keeps
// its relative accuracy: below -0.6 the Gaussian tail (1 + erf would cancel);
// up to 1.3 the erf polynomial in x^2 / 2 (exact enough, unlike a rounded
// x / sqrt 2); above, 1 - erfc / 2.
inline F32 gelu(F32 x) {
  constexpr float kSqrtHalf = 0.707106781f;
  constexpr float kHalfSqrtHalf = 0.353553391f;
  const F32 xc = atLeast(x, -14.5f);  // below, x Phi(x) rounds to -0 (and -inf gives -0, not NaN)
  const F32 middle = 0.5f + xc * (kHalfSqrtHalf * erfOverU(xc * xc * 0.5f));
  const F32 upper = 1.0f - 0.5f * exp(logErfc(xc * kSqrtHalf));
  return select(xc < -0.6f, xGaussianTail(xc), xc * select(xc < 1.3f, middle, upper));
}

// ---------------------------------------------------- sigmoid and its kin

// 1 / (1 + e^-x) as (x >= 0 ? 1 : e) / (1 + e) with e = e^-|x|: e never
// overflows, and for very negative x the result keeps its tiny value.
inline F32 sigmoid(F32 x) {
  const F32 e = exp(-abs(x));
  return select(x >= 0.0f, splat(1.0f), e) / (1.0f + e);
}

// Gelu's tanh form x (1 + tanh(u)) / 2 = x sigmoid(2u), u = sqrt(2/pi)
// (x + 0.044715 x^3). e^-|2u| is ill-conditioned like xGaussianTail's exp,
// so 2u is computed in double and handed over in two parts. For x < 0 the
// result x e / (1 + e) may be normal while e is subnormal, so e is computed
// scaled by 2^24 and the product scaled back last.
inline F32 geluTanh(F32 x) {
  constexpr double kScale = 1.5957691216057308;  // 2 sqrt(2 / pi)
  // Below -20 the result rounds to -0 (and -inf gives -0, not NaN); above 20,
  // sigmoid(2u) rounds to 1 (and inf gives inf).
  const F32 xc = atLeast(x, -20.0f);
  const F32 xw = atMost(xc, 20.0f);
  const F64 d = toDouble(xw);
  const F64 a = -toDouble(abs(xw)) * (kScale + (kScale * 0.044715) * d * d);  // -|2u|, as sign(u) = sign(x)
  const F32 hi = toFloat(a);
  const F32 scaled = expHiLo(hi, toFloat(a - toDouble(hi)), 24);
  const F32 denominator = 1.0f + scaled * 0x1p-24f;
  return select(xc >= 0.0f, xc / denominator, xc * scaled / denominator * 0x1p-24f);
}

// tanh |x| = E / (E + 2) with E = e^(2|x|) - 1: no cancellation near 0, and
// from 9 on tanh rounds to 1.
inline F32 tanh(F32 x) {
  const F32 big = expm1(2.0f * atMost(abs(x), 9.0f));
  return copySign(big / (big + 2.0f), x);
}

// log(1 + e^x) = max(x, 0) + log1p(e^-|x|): nothing overflows, and for very
// negative x the result keeps its tiny value.
inline F32 softplus(F32 x) { return select(x > 0.0f, x, F32{}) + log1pUnit(exp(-abs(x))); }

}  // namespace kiln::vec::KILN_VECTOR_NS
