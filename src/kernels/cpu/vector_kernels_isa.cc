// One instruction set's VectorKernels table (see vector_kernels.h).
//
// CMake compiles this file three times, with the flags of baseline x86-64,
// AVX2 + FMA and AVX-512 (src/kernels/CMakeLists.txt); vector_math.h derives
// the vector width and the namespace from those flags. The AVX compilations
// may only run after vectorKernelsFor has checked the CPU, so this file must
// not define anything that other files could call by accident: everything is
// in the instruction set's own namespace, and the table is a constant built at
// compile time (no code runs at start-up).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/vector_kernels.h"
#include "kernels/cpu/vector_math.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace kiln::vec {
namespace KILN_VECTOR_NS {
namespace {

constexpr Isa kIsa = kLanes == 16 ? Isa::kAvx512 : kLanes == 8 ? Isa::kAvx2 : Isa::kGeneric;

// ------------------------------------------------------------------ loops

// Operands of mapArrays: an array read a vector at a time (lanes past its end
// hold `fill`), or one value in every lane.
struct Stream {
  const float* p;
  float fill = 0;
  F32 at(int64_t i) const { return load(p + i); }
  F32 tail(int64_t i, int64_t count) const { return loadPartial(p + i, count, fill); }
};
struct Repeat {
  F32 v;
  F32 at(int64_t) const { return v; }
  F32 tail(int64_t, int64_t) const { return v; }
};

// y[i] = f(in[i]...) for i in [0, n): whole vectors, then the last partial
// one through padded lanes, so that a tail element is computed exactly as any
// other. Every vector is read before it is written: y may be an input.
template <typename F, typename... In>
inline void mapArrays(float* y, int64_t n, F f, In... in) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, f(in.at(i)...));
  if (i < n) storePartial(y + i, f(in.tail(i, n - i)...), n - i);
}

// Combiners of foldArray, for vectors and for single floats. Max and Min
// propagate NaN, as numpy's max and min do.
struct Add {
  template <typename T>
  T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  F32 operator()(F32 a, F32 b) const { return select((a > b) | (a != a), a, b); }
  float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};
struct Min {
  F32 operator()(F32 a, F32 b) const { return select((a < b) | (a != a), a, b); }
  float operator()(float a, float b) const { return (a < b || a != a) ? a : b; }
};

// The lanes of v folded with combine, pairwise: a short dependency chain
// (log2 kLanes steps), and sums that round less than a running one.
template <typename Combine>
inline float foldLanes(F32 v, Combine combine) {
  float lanes[kLanes];
  store(lanes, v);
  for (int half = kLanes / 2; half > 0; half /= 2) {
    for (int i = 0; i < half; ++i) lanes[i] = combine(lanes[i], lanes[i + half]);
  }
  return lanes[0];
}

// map(x[i]) for i in [0, n) folded with combine, where lanes past the end
// hold `fill` and map(fill) must be combine's identity. Four vectors of
// partial results let the operations overlap, and a sum of 4 * kLanes partial
// sums rounds less than a running sum.
template <typename Map, typename Combine>
inline float foldArray(const float* x, int64_t n, float fill, Map map, Combine combine) {
  const F32 identity = map(splat(fill));
  F32 acc[4] = {identity, identity, identity, identity};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int k = 0; k < 4; ++k) acc[k] = combine(acc[k], map(load(x + i + k * kLanes)));
  }
  for (; i + kLanes <= n; i += kLanes) acc[0] = combine(acc[0], map(load(x + i)));
  if (i < n) acc[1] = combine(acc[1], map(loadPartial(x + i, n - i, fill)));
  return foldLanes(combine(combine(acc[0], acc[1]), combine(acc[2], acc[3])), combine);
}

// ------------------------------------------------------------ unary maps

template <F32 (*kF)(F32)>
void unaryOf(const float* x, float* y, int64_t n, float, float) {
  mapArrays(y, n, kF, Stream{x});
}

F32 relu(F32 v) { return select(v < 0.0f, F32{}, v); }
F32 neg(F32 v) { return -v; }
F32 reciprocal(F32 v) { return 1.0f / v; }
F32 hardSwish(F32 v) {
  const F32 w = v * (1.0f / 6.0f) + 0.5f;
  return v * select(w < 0.0f, F32{}, select(w > 1.0f, splat(1.0f), w));
}

void leakyRelu(const float* x, float* y, int64_t n, float alpha, float) {
  mapArrays(y, n, [alpha](F32 v) { return select(v < 0.0f, alpha * v, v); }, Stream{x});
}
void elu(const float* x, float* y, int64_t n, float alpha, float) {
  mapArrays(y, n, [alpha](F32 v) { return select(v < 0.0f, alpha * expm1(v), v); }, Stream{x});
}
void hardSigmoid(const float* x, float* y, int64_t n, float alpha, float beta) {
  mapArrays(
      y, n,
      [alpha, beta](F32 v) {
        const F32 w = alpha * v + beta;
        return select(w < 0.0f, F32{}, select(w > 1.0f, splat(1.0f), w));
      },
      Stream{x});
}
// As ONNX's Clip: min above max gives max; NaN passes through.
void clip(const float* x, float* y, int64_t n, float lo, float hi) {
  mapArrays(
      y, n,
      [lo, hi](F32 v) {
        const F32 w = select(v < lo, splat(lo), v);
        return select(w > hi, splat(hi), w);
      },
      Stream{x});
}

// ----------------------------------------------------------- binary maps

struct AddOp {
  static F32 apply(F32 a, F32 b) { return a + b; }
};
struct SubOp {
  static F32 apply(F32 a, F32 b) { return a - b; }
};
struct MulOp {
  static F32 apply(F32 a, F32 b) { return a * b; }
};
struct DivOp {
  static F32 apply(F32 a, F32 b) { return a / b; }
};
struct MaxOp {
  static F32 apply(F32 a, F32 b) { return Max{}(a, b); }
};
struct MinOp {
  static F32 apply(F32 a, F32 b) { return Min{}(a, b); }
};
struct SquareOp {  // pow(a, 2) is exactly a * a
  static F32 apply(F32 a, F32) { return a * a; }
};
struct SqrtOp {  // pow(a, 0.5): unlike sqrt, pow(-0, 0.5) = +0 (so + 0) and pow(-inf, 0.5) = +inf
  static F32 apply(F32 a, F32) { return select(a == -kInf, splat(kInf), sqrt(a) + 0.0f); }
};

template <typename Op, Operands kOperands>
void binaryRow(const float* a, const float* b, float* y, int64_t n) {
  if (n == 0) return;  // a scalar operand may have no element to read then
  if constexpr (kOperands == Operands::kBoth) {
    mapArrays(y, n, Op::apply, Stream{a}, Stream{b});
  } else if constexpr (kOperands == Operands::kScalarB) {
    mapArrays(y, n, Op::apply, Stream{a}, Repeat{splat(*b)});
  } else {
    mapArrays(y, n, Op::apply, Repeat{splat(*a)}, Stream{b});
  }
}

// ------------------------------------------------------------ row helpers

float sum(const float* x, int64_t n) {
  return foldArray(x, n, 0.0f, [](F32 v) { return v; }, Add{});
}
float sumSquares(const float* x, int64_t n, float center) {
  return foldArray(
      x, n, center,
      [center](F32 v) {
        const F32 d = v - center;
        return d * d;
      },
      Add{});
}
float max(const float* x, int64_t n) {
  return foldArray(x, n, -kInf, [](F32 v) { return v; }, Max{});
}
float min(const float* x, int64_t n) {
  return foldArray(x, n, kInf, [](F32 v) { return v; }, Min{});
}
float expSum(const float* x, float* y, int64_t n, float shift) {
  const auto shifted_exp = [shift](F32 v) { return exp(v - shift); };
  if (y == nullptr) return foldArray(x, n, -kInf, shifted_exp, Add{});  // exp(-inf) = 0
  F32 total{};
  mapArrays(
      y, n,
      [&](F32 v) {
        const F32 e = shifted_exp(v);
        total += e;
        return e;
      },
      Stream{x, -kInf});
  return foldLanes(total, Add{});
}
void affine(const float* x, float* y, int64_t n, float a, float b) {
  mapArrays(y, n, [a, b](F32 v) { return a * v + b; }, Stream{x});
}
void quantize8(const float* x, uint8_t* y, int64_t n, float scale, float zero, bool signed_bytes) {
  // Past +-1024, every quotient saturates whatever its rounding: clamped
  // there first (NaN passes), the quotient fits divideByReciprocal's range.
  // Adding and subtracting 1.5 * 2^23 then rounds half to even; the
  // comparisons send NaN to 0. i8 is computed as u8 shifted by 128
  // (clamp(q + z, -128, 127) = clamp(q + z + 128, 0, 255) - 128) and its top
  // bit flipped on the way out.
  constexpr float kRounder = 12582912.0f;
  const float shifted_zero = zero + (signed_bytes ? 128.0f : 0.0f);
  const uint8_t flip = signed_bytes ? 0x80 : 0;
  const float reciprocal = 1.0f / scale;
  const bool by_reciprocal = kHasFma && __builtin_isnormal(reciprocal) && __builtin_isnormal(scale);
  const float bound = 1024.0f * __builtin_fabsf(scale);
  using U8 = uint8_t __attribute__((vector_size(kLanes)));
  const auto quantize = [=](F32 v) {
    F32 q;
    if (by_reciprocal) {
      q = divideByReciprocal(atMost(atLeast(v, -bound), bound), splat(scale), splat(reciprocal));
    } else {
      q = v / scale;
    }
    q = ((q + kRounder) - kRounder) + shifted_zero;
    q = q > 255.0f ? F32{} + 255.0f : q;
    q = q >= 0.0f ? q : F32{};
    // In [0, 255]: the narrowing keeps the value (vpmovdb, or packs).
    return __builtin_convertvector(__builtin_convertvector(q, I32), U8) ^ flip;
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const U8 q = quantize(load(x + i));
    __builtin_memcpy(y + i, &q, sizeof q);
  }
  if (i < n) {
    const U8 q = quantize(loadPartial(x + i, n - i, 0.0f));
    __builtin_memcpy(y + i, &q, static_cast<size_t>(n - i));
  }
}
void dequantize8(const uint8_t* x, float* y, int64_t n, float scale, float zero, bool signed_bytes) {
  // i8 bytes read as u8 with the top bit flipped are v + 128.
  const uint8_t flip = signed_bytes ? 0x80 : 0;
  const float z = zero + (signed_bytes ? 128.0f : 0.0f);
  using U8 = uint8_t __attribute__((vector_size(kLanes)));
  const auto convert = [&](U8 v) { return (__builtin_convertvector(__builtin_convertvector(v ^ flip, I32), F32) - z) * scale; };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    U8 v;
    __builtin_memcpy(&v, x + i, sizeof v);
    const F32 out = convert(v);
    __builtin_memcpy(y + i, &out, sizeof out);
  }
  if (i < n) {
    U8 v{};
    __builtin_memcpy(&v, x + i, static_cast<size_t>(n - i));
    const F32 out = convert(v);
    __builtin_memcpy(y + i, &out, static_cast<size_t>(n - i) * sizeof(float));
  }
}
#if defined(__AVX512F__)
// lookup8 with AVX-512 VBMI (Ice Lake, Sapphire Rapids, Zen 4 on): two
// two-table byte permutes pick from entries 0-127 and 128-255 by each byte's
// low seven bits, its top bit chooses between them; 64 bytes a step, the
// table loaded once for all rows. The
// target attribute enables the instructions in this function only; lookup8
// calls it after asking the CPU.
#define KILN_VBMI __attribute__((target("avx512bw,avx512vbmi")))
KILN_VBMI __m512i lookup64(__m512i v, __m512i t0, __m512i t1, __m512i t2, __m512i t3) {
  const __m512i low = _mm512_permutex2var_epi8(t0, v, t1);
  const __m512i high = _mm512_permutex2var_epi8(t2, v, t3);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), low, high);
}
KILN_VBMI void lookup8Vbmi(const uint8_t* x, int64_t x_stride, uint8_t* y, int64_t y_stride, int64_t rows, int64_t n,
                           const uint8_t* table) {
  const __m512i t0 = _mm512_loadu_si512(table), t1 = _mm512_loadu_si512(table + 64);
  const __m512i t2 = _mm512_loadu_si512(table + 128), t3 = _mm512_loadu_si512(table + 192);
  const __mmask64 tail = (uint64_t{1} << (n % 64)) - 1;
  for (int64_t r = 0; r < rows; ++r, x += x_stride, y += y_stride) {
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) _mm512_storeu_si512(y + i, lookup64(_mm512_loadu_si512(x + i), t0, t1, t2, t3));
    if (i < n) _mm512_mask_storeu_epi8(y + i, tail, lookup64(_mm512_maskz_loadu_epi8(tail, x + i), t0, t1, t2, t3));
  }
}
#undef KILN_VBMI
#endif
void lookup8(const uint8_t* x, int64_t x_stride, uint8_t* y, int64_t y_stride, int64_t rows, int64_t n,
             const uint8_t* table) {
#if defined(__AVX512F__)
  if (__builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bw")) {
    lookup8Vbmi(x, x_stride, y, y_stride, rows, n, table);
    return;
  }
#endif
  for (int64_t r = 0; r < rows; ++r, x += x_stride, y += y_stride) {
    for (int64_t i = 0; i < n; ++i) y[i] = table[x[i]];
  }
}
template <bool kMultiply>
void binaryQuantizedAs(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, const QuantizedBinaryParams& p) {
  // Clamped before rounding (the bounds are integers, so the result is the
  // same), which keeps |v| small enough for the 1.5 * 2^23 rounding. i8
  // bytes are read as u8 with their top bit flipped (v + 128), zero points
  // shifted to match, and flipped back on the way out.
  constexpr float kRounder = 12582912.0f;
  const uint8_t flip = p.signed_bytes ? 0x80 : 0;
  const float shift = p.signed_bytes ? 128.0f : 0.0f;
  const float a_zero = p.a_zero + shift;
  const float b_zero = p.b_zero + shift;
  const float y_zero = p.y_zero + shift;
  const float low = -y_zero;
  const float high = 255.0f - y_zero;
  using U8 = uint8_t __attribute__((vector_size(kLanes)));
  const auto combine = [&](U8 va, U8 vb) {
    const F32 fa = __builtin_convertvector(__builtin_convertvector(va ^ flip, I32), F32);
    const F32 fb = __builtin_convertvector(__builtin_convertvector(vb ^ flip, I32), F32);
    F32 v;
    if constexpr (kMultiply) {
      v = p.a_ratio * ((fa - a_zero) * (fb - b_zero));  // the product of two integers below 2^8: exact
    } else {
      v = p.a_ratio * (fa - a_zero) + p.b_ratio * (fb - b_zero);
    }
    v = v < low ? F32{} + low : v;
    v = v > high ? F32{} + high : v;
    const I32 q = __builtin_convertvector(((v + kRounder) - kRounder) + y_zero, I32);
    return __builtin_convertvector(q, U8) ^ flip;
  };
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    U8 va, vb;
    __builtin_memcpy(&va, a + i, sizeof va);
    __builtin_memcpy(&vb, b + i, sizeof vb);
    const U8 vy = combine(va, vb);
    __builtin_memcpy(y + i, &vy, sizeof vy);
  }
  if (i < n) {
    U8 va{}, vb{};
    __builtin_memcpy(&va, a + i, static_cast<size_t>(n - i));
    __builtin_memcpy(&vb, b + i, static_cast<size_t>(n - i));
    const U8 vy = combine(va, vb);
    __builtin_memcpy(y + i, &vy, static_cast<size_t>(n - i));
  }
}
void binaryQuantized(const uint8_t* a, const uint8_t* b, uint8_t* y, int64_t n, const QuantizedBinaryParams& p) {
  if (p.multiply) {
    binaryQuantizedAs<true>(a, b, y, n, p);
  } else {
    binaryQuantizedAs<false>(a, b, y, n, p);
  }
}
// Up to 4 vectors of columns per pass down the rows, accumulators in
// registers; the last partial vector through padded lanes. Rows are folded
// in chunks of kFoldChunk, each chunk's result then folded into the total:
// a sum of n rows then rounds like one of n / kFoldChunk + kFoldChunk terms,
// not n (a channels-last global pool over 160 x 160 positions drifted 1e-5
// from onnxruntime's, and a squeeze-excite gate carried that on).
template <int kVectors, typename Combine>
void foldColumnBlock(const float* x, int64_t rows, int64_t stride, int64_t n, float* y, float fill,
                     Combine combine) {
  constexpr int64_t kFoldChunk = 64;
  F32 acc[kVectors];
  for (int v = 0; v < kVectors; ++v) acc[v] = splat(fill);
  for (int64_t first = 0; first < rows; first += kFoldChunk) {
    F32 part[kVectors];
    for (int v = 0; v < kVectors; ++v) part[v] = splat(fill);
    const int64_t last = first + kFoldChunk < rows ? first + kFoldChunk : rows;
    for (int64_t i = first; i < last; ++i) {
      const float* row = x + i * stride;
      _Pragma("GCC unroll 4") for (int v = 0; v < kVectors; ++v) {
        const int64_t at = v * kLanes;
        if (at >= n) break;  // (a block of fewer columns than its vectors)
        const F32 value = at + kLanes <= n ? load(row + at) : loadPartial(row + at, n - at, fill);
        part[v] = combine(part[v], value);
      }
    }
    for (int v = 0; v < kVectors; ++v) acc[v] = combine(acc[v], part[v]);
  }
  for (int v = 0; v < kVectors; ++v) {
    const int64_t at = v * kLanes;
    if (at + kLanes <= n) {
      store(y + at, acc[v]);
    } else if (at < n) {
      storePartial(y + at, acc[v], n - at);
    }
  }
}

void foldColumns(const float* x, int64_t rows, int64_t stride, int64_t n, float* y, bool max) {
  const auto fold = [&](auto combine, float fill) {
    int64_t j = 0;
    for (; j + 4 * kLanes <= n; j += 4 * kLanes) foldColumnBlock<4>(x + j, rows, stride, 4 * kLanes, y + j, fill, combine);
    const int64_t left = n - j;
    if (left > 3 * kLanes) {
      foldColumnBlock<4>(x + j, rows, stride, left, y + j, fill, combine);
    } else if (left > 2 * kLanes) {
      foldColumnBlock<3>(x + j, rows, stride, left, y + j, fill, combine);
    } else if (left > kLanes) {
      foldColumnBlock<2>(x + j, rows, stride, left, y + j, fill, combine);
    } else if (left > 0) {
      foldColumnBlock<1>(x + j, rows, stride, left, y + j, fill, combine);
    }
  };
  if (max) {
    fold([](F32 a, F32 b) { return Max{}(a, b); }, -kInf);
  } else {
    fold([](F32 a, F32 b) { return a + b; }, 0.0f);
  }
}

// floatToHalf and halfToFloat (core/float_formats.h), a vector at a time:
// every case of theirs computed in every lane, the lane's own chosen. (Not
// by calling them: an inline function compiled here with AVX flags could be
// the copy the linker keeps for every other file.) The tail goes through a
// padded vector.
using U16 = uint16_t __attribute__((vector_size(KILN_VECTOR_BYTES / 2)));

U16 toHalves(F32 v) {
  constexpr float kRounder = 12582912.0f;  // 1.5 * 2^23: adding it rounds half to even
  const I32 bits = toBits(v);
  const I32 sign = (bits >> 16) & 0x8000;
  const I32 abs = bits & 0x7FFFFFFF;
  const I32 special = 0x7C00 | ((abs > 0x7F800000) & 0x200);  // inf, NaN
  // Subnormal or zero: abs / 2^-24 rounded to an integer (below 1024).
  const I32 small = __builtin_convertvector((fromBits(abs) * 16777216.0f + kRounder) - kRounder, I32);
  // Normal: the mantissa rounded to 10 bits, ties to even (abs clamped so
  // that the lanes of the other cases cannot overflow).
  const I32 a = select(abs < 0x477FF000, abs, splat(0x38800000));
  const I32 normal = (a + 0xFFF + ((a >> 13) & 1) - 0x38000000) >> 13;
  const I32 half = sign | select(abs >= 0x7F800000, special,
                                 select(abs >= 0x477FF000, splat(0x7C00), select(abs < 0x38800000, small, normal)));
  return __builtin_convertvector(half, U16);
}

F32 fromHalves(U16 narrow) {
  const I32 h = __builtin_convertvector(narrow, I32);
  const I32 sign = (h & 0x8000) << 16;
  const I32 exponent = (h >> 10) & 0x1F;
  const I32 mantissa = h & 0x3FF;
  const I32 normal = sign | ((exponent + 112) << 23) | (mantissa << 13);
  const I32 special = sign | 0x7F800000 | (mantissa << 13);
  const I32 small = sign | toBits(toFloat(mantissa) * 5.9604644775390625e-8f);  // mantissa * 2^-24, exact
  return fromBits(select(exponent == 0x1F, special, select(exponent == 0, small, normal)));
}

void floatsToHalves(const float* x, uint16_t* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const U16 h = toHalves(load(x + i));
    std::memcpy(y + i, &h, sizeof h);
  }
  if (i < n) {
    const U16 h = toHalves(loadPartial(x + i, n - i, 0.0f));
    std::memcpy(y + i, &h, static_cast<size_t>(n - i) * sizeof(uint16_t));
  }
}

void halvesToFloats(const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    U16 h;
    std::memcpy(&h, x + i, sizeof h);
    store(y + i, fromHalves(h));
  }
  if (i < n) {
    U16 h{};
    std::memcpy(&h, x + i, static_cast<size_t>(n - i) * sizeof(uint16_t));
    storePartial(y + i, fromHalves(h), n - i);
  }
}

void scaleSums(const void* sums, void* y, int64_t n, const float* scale, bool scale_per_element, const float* add) {
  if (n <= 0) return;
  const auto* in = static_cast<const std::byte*>(sums);
  auto* out = static_cast<std::byte*>(y);
  const F32 one_scale = splat(scale[0]);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    I32 s;
    std::memcpy(&s, in + i * 4, sizeof s);
    F32 v = toFloat(s) * (scale_per_element ? load(scale + i) : one_scale);
    if (add != nullptr) v += load(add + i);
    std::memcpy(out + i * 4, &v, sizeof v);
  }
  for (; i < n; ++i) {
    int32_t s;
    std::memcpy(&s, in + i * 4, sizeof s);
    float v = static_cast<float>(s) * scale[scale_per_element ? i : 0];
    if (add != nullptr) v += add[i];
    std::memcpy(out + i * 4, &v, sizeof v);
  }
}
void normalize(const float* x, const float* scale, const float* bias, float* y, int64_t n, float mean,
               float inv_std) {
  if (bias == nullptr) {
    mapArrays(y, n, [=](F32 v, F32 s) { return (v - mean) * inv_std * s; }, Stream{x}, Stream{scale});
  } else {
    mapArrays(
        y, n, [=](F32 v, F32 s, F32 b) { return (v - mean) * inv_std * s + b; }, Stream{x}, Stream{scale},
        Stream{bias});
  }
}

// ------------------------------------------------------ small products

// One tile of matmulAccumulate: kRows rows of c by kCols vectors of columns
// from column j; with kPartial, one vector of which only `partial` lanes
// are columns of c. The kRows x kCols accumulators stay in registers for the
// whole k loop (the fixed loops unrolled, or GCC keeps the arrays in
// memory): independent chains enough to hide the FMA latency.
template <int kRows, int kCols, bool kPartial>
void productTile(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t k,
                 int64_t j, int64_t partial) {
  F32 acc[kRows][kCols];
  _Pragma("GCC unroll 8") for (int r = 0; r < kRows; ++r) {
    _Pragma("GCC unroll 8") for (int v = 0; v < kCols; ++v) {
      const float* at = c + r * ldc + j + v * kLanes;
      acc[r][v] = kPartial ? loadPartial(at, partial, 0.0f) : load(at);
    }
  }
  for (int64_t p = 0; p < k; ++p) {
    F32 bv[kCols];
    _Pragma("GCC unroll 8") for (int v = 0; v < kCols; ++v) {
      const float* at = b + p * ldb + j + v * kLanes;
      bv[v] = kPartial ? loadPartial(at, partial, 0.0f) : load(at);
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < kRows; ++r) {
      const F32 av = splat(a[r * lda + p]);
      _Pragma("GCC unroll 8") for (int v = 0; v < kCols; ++v) acc[r][v] += av * bv[v];
    }
  }
  _Pragma("GCC unroll 8") for (int r = 0; r < kRows; ++r) {
    _Pragma("GCC unroll 8") for (int v = 0; v < kCols; ++v) {
      float* at = c + r * ldc + j + v * kLanes;
      if constexpr (kPartial) {
        storePartial(at, acc[r][v], partial);
      } else {
        store(at, acc[r][v]);
      }
    }
  }
}

// Columns of up to kRows rows: wide tiles, then pairs of vectors, then single
// vectors, then the partial vector at the end.
template <int kRows, int kWide>
void productRows(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t n,
                 int64_t k) {
  int64_t j = 0;
  for (; j + kWide * kLanes <= n; j += kWide * kLanes) {
    productTile<kRows, kWide, false>(a, lda, b, ldb, c, ldc, k, j, 0);
  }
  // Two vectors at a time where a wide tile no longer fits (an attention
  // head's 32 or 48 columns): twice the independent FMA chains of one.
  if constexpr (kWide > 2) {
    for (; j + 2 * kLanes <= n; j += 2 * kLanes) productTile<kRows, 2, false>(a, lda, b, ldb, c, ldc, k, j, 0);
  }
  for (; j + kLanes <= n; j += kLanes) productTile<kRows, 1, false>(a, lda, b, ldb, c, ldc, k, j, 0);
  if (j < n) productTile<kRows, 1, true>(a, lda, b, ldb, c, ldc, k, j, n - j);
}

void matmulAccumulate(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc, int64_t m,
                      int64_t n, int64_t k) {
  int64_t i = 0;
  for (; i + 4 <= m; i += 4) productRows<4, 4>(a + i * lda, lda, b, ldb, c + i * ldc, ldc, n, k);
  // The last 1 to 3 rows in one tile: each pass over b costs its reads.
  a += i * lda;
  c += i * ldc;
  switch (m - i) {
    case 3: productRows<3, 4>(a, lda, b, ldb, c, ldc, n, k); break;
    case 2: productRows<2, 4>(a, lda, b, ldb, c, ldc, n, k); break;
    case 1: productRows<1, 8>(a, lda, b, ldb, c, ldc, n, k); break;
    default: break;
  }
}

// ------------------------------------------------------------------ table

template <typename Op>
constexpr std::array<BinaryFn, static_cast<size_t>(Operands::kCount)> rowsOf() {
  std::array<BinaryFn, static_cast<size_t>(Operands::kCount)> rows{};
  rows[static_cast<size_t>(Operands::kBoth)] = &binaryRow<Op, Operands::kBoth>;
  rows[static_cast<size_t>(Operands::kScalarB)] = &binaryRow<Op, Operands::kScalarB>;
  rows[static_cast<size_t>(Operands::kScalarA)] = &binaryRow<Op, Operands::kScalarA>;
  return rows;
}

constexpr VectorKernels makeKernels() {
  VectorKernels k;
  k.isa = kIsa;
  const auto set = [&k](Unary op, UnaryFn f) { k.unary[static_cast<size_t>(op)] = f; };
  set(Unary::kRelu, &unaryOf<relu>);
  set(Unary::kLeakyRelu, &leakyRelu);
  set(Unary::kElu, &elu);
  set(Unary::kSigmoid, &unaryOf<sigmoid>);
  set(Unary::kHardSigmoid, &hardSigmoid);
  set(Unary::kHardSwish, &unaryOf<hardSwish>);
  set(Unary::kSoftplus, &unaryOf<softplus>);
  set(Unary::kTanh, &unaryOf<tanh>);
  set(Unary::kGelu, &unaryOf<gelu>);
  set(Unary::kGeluTanh, &unaryOf<geluTanh>);
  set(Unary::kExp, &unaryOf<exp>);
  set(Unary::kLog, &unaryOf<log>);
  set(Unary::kSqrt, &unaryOf<sqrt>);
  set(Unary::kErf, &unaryOf<erf>);
  set(Unary::kAbs, &unaryOf<abs>);
  set(Unary::kNeg, &unaryOf<neg>);
  set(Unary::kReciprocal, &unaryOf<reciprocal>);
  set(Unary::kFloor, &unaryOf<floor>);
  set(Unary::kCeil, &unaryOf<ceil>);
  set(Unary::kClip, &clip);
  const auto rows = [&k](Binary op, std::array<BinaryFn, static_cast<size_t>(Operands::kCount)> fns) {
    k.binary[static_cast<size_t>(op)] = fns;
  };
  rows(Binary::kAdd, rowsOf<AddOp>());
  rows(Binary::kSub, rowsOf<SubOp>());
  rows(Binary::kMul, rowsOf<MulOp>());
  rows(Binary::kDiv, rowsOf<DivOp>());
  rows(Binary::kMax, rowsOf<MaxOp>());
  rows(Binary::kMin, rowsOf<MinOp>());
  rows(Binary::kSquare, rowsOf<SquareOp>());
  rows(Binary::kSqrt, rowsOf<SqrtOp>());
  k.sum = &sum;
  k.sumSquares = &sumSquares;
  k.max = &max;
  k.min = &min;
  k.expSum = &expSum;
  k.affine = &affine;
  k.quantize8 = &quantize8;
  k.binaryQuantized = &binaryQuantized;
  k.dequantize8 = &dequantize8;
  k.lookup8 = &lookup8;
  k.normalize = &normalize;
  k.scaleSums = &scaleSums;
  k.foldColumns = &foldColumns;
  k.floatsToHalves = &floatsToHalves;
  k.halvesToFloats = &halvesToFloats;
  k.matmulAccumulate = &matmulAccumulate;
  return k;
}

constexpr VectorKernels kKernels = makeKernels();

}  // namespace
}  // namespace KILN_VECTOR_NS

namespace detail {
// genericKernels, avx2Kernels or avx512Kernels.
#define KILN_PASTE_INNER(a, b) a##b
#define KILN_PASTE(a, b) KILN_PASTE_INNER(a, b)
const VectorKernels& KILN_PASTE(KILN_VECTOR_NS, Kernels)() { return KILN_VECTOR_NS::kKernels; }
}  // namespace detail

}  // namespace kiln::vec
