// Elementwise CPU kernels with ONNX semantics: unary maps, predicates (IsNaN,
// IsInf), Clip, Identity, and binary and variadic arithmetic, comparisons,
// logic and bitwise ops with numpy broadcasting.
//
// Each op is a struct: its name, the element types it takes (kTypes), and
// apply on computed values. prepare picks one loop (op x element type) and
// stores its address in the state; run makes one indirect call into it. f32,
// what models use, runs the vector kernels where the op has one
// (vector_kernels.h: AVX-512, AVX2 or SSE2 code chosen for the CPU, with
// vector exp, erf, ...; each op names its vector kernel as kVector). The
// other types, and f32 for the ops without a vector kernel, run the loops
// here, where the op is a template parameter (nothing is dispatched per
// element) and every loop writes through mapBlocked so that it vectorises at
// -O2; their transcendental functions are the std:: ones. f16 and bf16
// compute in f32 and round to nearest even on store (Element). Large calls
// split their output across threads (parallel.h).
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/wrapping_arithmetic.h"
#include "core/float_formats.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

// ------------------------------------------------------------------ helpers

// Elements per block in mapBlocked: 64 bytes of f32.
constexpr int64_t kBlock = 16;

// y[i] = f(i) for every i in [0, n).
//
// GCC 12 vectorises at -O2 with its "very cheap" cost model, which refuses
// every loop that needs a scalar epilogue or a run-time alias check, that is
// every plain `for (i < n) y[i] = f(x[i])`. A block of fixed size computed
// into a local array needs neither, so it vectorises; the tail runs scalar.
// Storing a block only after computing it also keeps the loop right when y is
// one of the inputs (in-place execution).
template <typename R, typename F>
inline void mapBlocked(R* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    R block[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) block[j] = f(i + j);
    for (int64_t j = 0; j < kBlock; ++j) y[i + j] = block[j];
  }
  for (; i < n; ++i) y[i] = f(i);
}

std::string typeString(const TensorInfo& info) {
  return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString());
}

// The element types a kernel accepts: a set of these bits.
using TypeSet = unsigned;
constexpr TypeSet kF32 = 1;
constexpr TypeSet kF64 = 2;
constexpr TypeSet kHalves = 4;     // f16 and bf16, computed in f32 and rounded on store
constexpr TypeSet kSigned = 8;     // i8, i16, i32, i64
constexpr TypeSet kUnsigned = 16;  // u8, u16, u32, u64
constexpr TypeSet kBools = 32;
constexpr TypeSet kFloats = kF32 | kF64 | kHalves;
constexpr TypeSet kIntegers = kSigned | kUnsigned;
constexpr TypeSet kNumbers = kFloats | kIntegers;

// The bit of `dtype`'s class; 0 for types no kernel here computes in.
TypeSet typeClass(DType dtype) {
  switch (dtype) {
    case DType::kF32: return kF32;
    case DType::kF64: return kF64;
    case DType::kF16:
    case DType::kBF16: return kHalves;
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64: return kSigned;
    case DType::kU8:
    case DType::kU16:
    case DType::kU32:
    case DType::kU64: return kUnsigned;
    case DType::kBool: return kBools;
    default: return 0;
  }
}

bool inTypeSet(DType dtype, TypeSet types) { return (typeClass(dtype) & types) != 0; }

std::string typeSetString(TypeSet types) {
  std::string names;
  for (DType dtype : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8, DType::kI16, DType::kI32,
                      DType::kI64, DType::kU8, DType::kU16, DType::kU32, DType::kU64, DType::kBool}) {
    if (!inTypeSet(dtype, types)) continue;
    if (!names.empty()) names += ", ";
    names += dtypeName(dtype);
  }
  return names;
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Returns f(TypeTag<T>{}) for the C++ element type T of `dtype` when `dtype`
// is in kTypes, else a default R (nullptr for a function pointer). Only the
// types of kTypes are instantiated.
template <TypeSet kTypes, typename F>
auto dispatchType(DType dtype, F f) -> decltype(f(TypeTag<float>{})) {
  using R = decltype(f(TypeTag<float>{}));
  if constexpr ((kTypes & kF32) != 0) if (dtype == DType::kF32) return f(TypeTag<float>{});
  if constexpr ((kTypes & kF64) != 0) if (dtype == DType::kF64) return f(TypeTag<double>{});
  if constexpr ((kTypes & kHalves) != 0) {
    if (dtype == DType::kF16) return f(TypeTag<Half>{});
    if (dtype == DType::kBF16) return f(TypeTag<BFloat16>{});
  }
  if constexpr ((kTypes & kSigned) != 0) {
    if (dtype == DType::kI8) return f(TypeTag<int8_t>{});
    if (dtype == DType::kI16) return f(TypeTag<int16_t>{});
    if (dtype == DType::kI32) return f(TypeTag<int32_t>{});
    if (dtype == DType::kI64) return f(TypeTag<int64_t>{});
  }
  if constexpr ((kTypes & kUnsigned) != 0) {
    if (dtype == DType::kU8) return f(TypeTag<uint8_t>{});
    if (dtype == DType::kU16) return f(TypeTag<uint16_t>{});
    if (dtype == DType::kU32) return f(TypeTag<uint32_t>{});
    if (dtype == DType::kU64) return f(TypeTag<uint64_t>{});
  }
  if constexpr ((kTypes & kBools) != 0) if (dtype == DType::kBool) return f(TypeTag<bool>{});
  return R{};
}

// How kernels read and write an element type: Compute is the type ops
// compute in; load and store convert. f16 and bf16 compute in f32 and round
// to nearest even on store; bool is stored as one byte 0 or 1.
template <typename T>
struct Element {
  using Stored = T;
  using Compute = T;
  static Compute load(Stored v) { return v; }
  static Stored store(Compute v) { return v; }
};
template <>
struct Element<Half> {
  using Stored = Half;
  using Compute = float;
  static float load(Half v) { return halfToFloat(v.bits); }
  static Half store(float v) { return Half{floatToHalf(v)}; }
};
template <>
struct Element<BFloat16> {
  using Stored = BFloat16;
  using Compute = float;
  static float load(BFloat16 v) { return bfloat16ToFloat(v.bits); }
  static BFloat16 store(float v) { return BFloat16{floatToBfloat16(v)}; }
};
template <>
struct Element<bool> {
  using Stored = uint8_t;
  using Compute = bool;
  static bool load(uint8_t v) { return v != 0; }
  static uint8_t store(bool v) { return v ? 1 : 0; }
};

// The dtype an op's result has for inputs of `dtype`: bool for predicates
// (ops with kToBool), else the input's.
template <typename Op>
DType resultDType(DType dtype) {
  if constexpr (requires { Op::kToBool; }) {
    return DType::kBool;
  } else {
    return dtype;
  }
}

// One result of Op on computed values, as stored.
template <typename Op, typename T, typename C>
auto storeResult(C value) {
  if constexpr (requires { Op::kToBool; }) {
    return static_cast<uint8_t>(value ? 1 : 0);
  } else {
    return Element<T>::store(value);
  }
}

[[noreturn]] void refuseDType(std::string_view op, DType dtype, TypeSet types) {
  throw UsageError(
      fmt::format("{}: no kernel for {} inputs (supports {})", op, dtypeName(dtype), typeSetString(types)));
}

void expectCounts(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs) {
  if (setup.inputs.size() < min_inputs || setup.inputs.size() > max_inputs) {
    const std::string expected =
        min_inputs == max_inputs ? std::to_string(min_inputs) : fmt::format("{} to {}", min_inputs, max_inputs);
    throw UsageError(fmt::format("{}: expects {} inputs, got {}", op, expected, setup.inputs.size()));
  }
  if (setup.outputs.size() != 1) {
    throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  }
}

void expectOutput(std::string_view op, const KernelSetup& setup, DType dtype, const std::vector<int64_t>& shape) {
  const TensorInfo expected{dtype, shape};
  if (setup.outputs[0] != expected) {
    throw UsageError(
        fmt::format("{}: output is {} but the inputs give {}", op, typeString(setup.outputs[0]), typeString(expected)));
  }
}

const std::byte* constantInput(const KernelSetup& setup, size_t index) {
  return index < setup.constants.size() ? setup.constants[index] : nullptr;
}

// 1 / (1 + e^-x) without overflow or cancellation for large |x|.
template <typename T>
T sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

// ---------------------------------------------------------------- unary ops

// Attribute values, converted to the element type once per call.
template <typename T>
struct UnaryArgs {
  T alpha;
  T beta;
};

// Each op: its name, the types it accepts, the defaults of its attributes
// alpha and beta where it has them, and apply.
// Comparisons are written so that NaN propagates (`x < 0 ? 0 : x` keeps NaN,
// as numpy's maximum(x, 0) does).
struct Relu {
  static constexpr std::string_view kName = "Relu";
  static constexpr TypeSet kTypes = kFloats | kSigned;
  static constexpr vec::Unary kVector = vec::Unary::kRelu;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return x < T(0) ? T(0) : x;
  }
};
struct Sigmoid {
  static constexpr std::string_view kName = "Sigmoid";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kSigmoid;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return sigmoid(x);
  }
};
struct Tanh {
  static constexpr std::string_view kName = "Tanh";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kTanh;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return std::tanh(x);
  }
};
struct Exp {
  static constexpr std::string_view kName = "Exp";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kExp;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return std::exp(x);
  }
};
struct Log {
  static constexpr std::string_view kName = "Log";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kLog;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return std::log(x);
  }
};
struct Sqrt {
  static constexpr std::string_view kName = "Sqrt";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kSqrt;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return std::sqrt(x);
  }
};
struct Erf {
  static constexpr std::string_view kName = "Erf";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kErf;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return std::erf(x);
  }
};
struct Abs {
  static constexpr std::string_view kName = "Abs";
  static constexpr TypeSet kTypes = kNumbers;
  static constexpr vec::Unary kVector = vec::Unary::kAbs;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    if constexpr (std::is_unsigned_v<T>) {
      return x;
    } else if constexpr (std::is_integral_v<T>) {
      return x < 0 ? wrapSub(T(0), x) : x;  // |INT_MIN| wraps to INT_MIN, as in numpy
    } else {
      return std::abs(x);
    }
  }
};
struct Neg {
  static constexpr std::string_view kName = "Neg";
  static constexpr TypeSet kTypes = kFloats | kSigned;
  static constexpr vec::Unary kVector = vec::Unary::kNeg;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    if constexpr (std::is_integral_v<T>) {
      return wrapSub(T(0), x);
    } else {
      return -x;
    }
  }
};
struct Reciprocal {
  static constexpr std::string_view kName = "Reciprocal";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kReciprocal;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return T(1) / x;
  }
};
struct Floor {
  static constexpr std::string_view kName = "Floor";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kFloor;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return std::floor(x);
  }
};
struct Ceil {
  static constexpr std::string_view kName = "Ceil";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kCeil;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return std::ceil(x);
  }
};
struct LeakyRelu {
  static constexpr std::string_view kName = "LeakyRelu";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kLeakyRelu;
  static constexpr double kAlpha = 0.01;
  template <typename T>
  static T apply(T x, UnaryArgs<T> args) {
    const T scaled = args.alpha * x;
    return x < T(0) ? scaled : x;
  }
};
struct Elu {
  static constexpr std::string_view kName = "Elu";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kElu;
  static constexpr double kAlpha = 1.0;
  template <typename T>
  static T apply(T x, UnaryArgs<T> args) {
    return x < T(0) ? args.alpha * std::expm1(x) : x;  // expm1: no cancellation near 0
  }
};
struct HardSigmoid {
  static constexpr std::string_view kName = "HardSigmoid";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kHardSigmoid;
  static constexpr double kAlpha = 0.2;
  static constexpr double kBeta = 0.5;
  template <typename T>
  static T apply(T x, UnaryArgs<T> args) {
    const T v = args.alpha * x + args.beta;
    return v < T(0) ? T(0) : (v > T(1) ? T(1) : v);
  }
};
struct HardSwish {
  static constexpr std::string_view kName = "HardSwish";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kHardSwish;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    const T v = x * (T(1) / T(6)) + T(0.5);
    return x * (v < T(0) ? T(0) : (v > T(1) ? T(1) : v));
  }
};
struct Softplus {
  static constexpr std::string_view kName = "Softplus";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kSoftplus;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    // log(1 + e^x) = max(x, 0) + log1p(e^-|x|): neither overflows nor loses
    // the small values of very negative x to 1 + e^x rounding to 1.
    return (x > T(0) ? x : T(0)) + std::log1p(std::exp(-std::abs(x)));
  }
};
// Gelu's scalar forms serve f64 (the f32 kernels are vector_math.h's).
struct Gelu {
  static constexpr std::string_view kName = "Gelu";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kGelu;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    // 0.5 x (1 + erf(x / sqrt(2))) written with erfc, which keeps its
    // precision for negative x where 1 + erf cancels.
    return T(0.5) * x * std::erfc(-x * T(0.70710678118654752440));
  }
};
struct GeluTanh {
  static constexpr std::string_view kName = "Gelu";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Unary kVector = vec::Unary::kGeluTanh;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u), without the cancellation of 1 + tanh.
    const T u = T(0.79788456080286535588) * (x + T(0.044715) * x * x * x);
    return x * sigmoid(T(2) * u);
  }
};

// Ops without an f32 vector kernel run the scalar loop for f32 too.
struct Sign {
  static constexpr std::string_view kName = "Sign";
  static constexpr TypeSet kTypes = kNumbers;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    if constexpr (std::is_unsigned_v<T>) {
      return x > T(0) ? T(1) : T(0);
    } else {
      return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x);  // keeps 0, -0 and NaN
    }
  }
};
// Round half to even: nearbyint in the default rounding mode.
struct Round {
  static constexpr std::string_view kName = "Round";
  static constexpr TypeSet kTypes = kFloats;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return std::nearbyint(x);
  }
};
// The std:: functions of one argument.
#define KILN_STD_UNARY(Name, function)               \
  struct Name {                                      \
    static constexpr std::string_view kName = #Name; \
    static constexpr TypeSet kTypes = kFloats;       \
    template <typename T>                            \
    static T apply(T x, UnaryArgs<T>) {              \
      return std::function(x);                       \
    }                                                \
  };
KILN_STD_UNARY(Sin, sin)
KILN_STD_UNARY(Cos, cos)
KILN_STD_UNARY(Tan, tan)
KILN_STD_UNARY(Asin, asin)
KILN_STD_UNARY(Acos, acos)
KILN_STD_UNARY(Atan, atan)
KILN_STD_UNARY(Sinh, sinh)
KILN_STD_UNARY(Cosh, cosh)
KILN_STD_UNARY(Asinh, asinh)
KILN_STD_UNARY(Acosh, acosh)
KILN_STD_UNARY(Atanh, atanh)
#undef KILN_STD_UNARY
struct Softsign {
  static constexpr std::string_view kName = "Softsign";
  static constexpr TypeSet kTypes = kFloats;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return x / (T(1) + std::abs(x));
  }
};
// max(0, x) + min(0, alpha (e^(x / alpha) - 1))
struct Celu {
  static constexpr std::string_view kName = "Celu";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr double kAlpha = 1.0;
  template <typename T>
  static T apply(T x, UnaryArgs<T> args) {
    return x > T(0) ? x : args.alpha * std::expm1(x / args.alpha);
  }
};
// gamma (x > 0 ? x : alpha (e^x - 1)); the defaults are the spec's f32 values.
struct Selu {
  static constexpr std::string_view kName = "Selu";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr double kAlpha = 1.67326319217681884765625;
  static constexpr std::string_view kBetaName = "gamma";
  static constexpr double kBeta = 1.05070102214813232421875;
  template <typename T>
  static T apply(T x, UnaryArgs<T> args) {
    return args.beta * (x > T(0) ? x : args.alpha * std::expm1(x));
  }
};
struct ThresholdedRelu {
  static constexpr std::string_view kName = "ThresholdedRelu";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr double kAlpha = 1.0;
  template <typename T>
  static T apply(T x, UnaryArgs<T> args) {
    return x > args.alpha ? x : T(0);
  }
};
// x < -lambd: x + bias; x > lambd: x - bias; else 0 (alpha = lambd, beta = bias).
struct Shrink {
  static constexpr std::string_view kName = "Shrink";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr std::string_view kAlphaName = "lambd";
  static constexpr double kAlpha = 0.5;
  static constexpr std::string_view kBetaName = "bias";
  static constexpr double kBeta = 0.0;
  template <typename T>
  static T apply(T x, UnaryArgs<T> args) {
    if (x < -args.alpha) return x + args.beta;
    if (x > args.alpha) return x - args.beta;
    return T(0);
  }
};
// x tanh(softplus(x))
struct Mish {
  static constexpr std::string_view kName = "Mish";
  static constexpr TypeSet kTypes = kFloats;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return x * std::tanh((x > T(0) ? x : T(0)) + std::log1p(std::exp(-std::abs(x))));
  }
};
// x sigmoid(alpha x)
struct Swish {
  static constexpr std::string_view kName = "Swish";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr double kAlpha = 1.0;
  template <typename T>
  static T apply(T x, UnaryArgs<T> args) {
    return x * sigmoid(args.alpha * x);
  }
};
struct Not {
  static constexpr std::string_view kName = "Not";
  static constexpr TypeSet kTypes = kBools;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return !x;
  }
};
struct BitwiseNot {
  static constexpr std::string_view kName = "BitwiseNot";
  static constexpr TypeSet kTypes = kIntegers;
  template <typename T>
  static T apply(T x, UnaryArgs<T>) {
    return static_cast<T>(~x);
  }
};
struct IsNaN {
  static constexpr std::string_view kName = "IsNaN";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr bool kToBool = true;
  template <typename T>
  static bool apply(T x, UnaryArgs<T>) {
    return std::isnan(x);
  }
};
// alpha = detect_negative, beta = detect_positive (int attributes: read by prepareIsInf).
struct IsInf {
  static constexpr std::string_view kName = "IsInf";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr bool kToBool = true;
  template <typename T>
  static bool apply(T x, UnaryArgs<T> args) {
    return std::isinf(x) && (x > T(0) ? args.beta != T(0) : args.alpha != T(0));
  }
};

struct UnaryState final : KernelState {
  using Loop = void (*)(const std::byte* x, std::byte* y, int64_t n, double alpha, double beta);
  vec::UnaryFn vector = nullptr;  // f32
  Loop loop = nullptr;            // the other types
  size_t element_size = 0;  // of the input
  size_t result_size = 0;   // of the output
  double alpha = 0;
  double beta = 0;
};

template <typename Op, typename T>
void unaryLoop(const std::byte* x_bytes, std::byte* y_bytes, int64_t n, double alpha, double beta) {
  using E = Element<T>;
  using C = typename E::Compute;
  using Y = decltype(storeResult<Op, T>(C{}));
  const auto* x = reinterpret_cast<const typename E::Stored*>(x_bytes);
  auto* y = reinterpret_cast<Y*>(y_bytes);
  const UnaryArgs<C> args{static_cast<C>(alpha), static_cast<C>(beta)};
  mapBlocked(y, n, [&](int64_t i) { return storeResult<Op, T>(Op::apply(E::load(x[i]), args)); });
}

// The scalar loop for `dtype` (f32 too when the op has no vector kernel).
template <typename Op>
UnaryState::Loop unaryLoopFor(DType dtype) {
  return dispatchType<Op::kTypes>(dtype, [](auto tag) -> UnaryState::Loop {
    return &unaryLoop<Op, typename decltype(tag)::type>;
  });
}

// Checks one input of the op's types and its output; returns the input's dtype.
template <typename Op>
DType prepareSameShapeUnary(const KernelSetup& setup) {
  expectCounts(Op::kName, setup, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  if (!inTypeSet(x.dtype, Op::kTypes)) refuseDType(Op::kName, x.dtype, Op::kTypes);
  expectOutput(Op::kName, setup, resultDType<Op>(x.dtype), x.shape);
  return x.dtype;
}

// The attribute names default to alpha and beta; an op may rename them
// (kAlphaName, kBetaName).
template <typename Op>
constexpr std::string_view alphaName() {
  if constexpr (requires { Op::kAlphaName; }) return Op::kAlphaName;
  return "alpha";
}
template <typename Op>
constexpr std::string_view betaName() {
  if constexpr (requires { Op::kBetaName; }) return Op::kBetaName;
  return "beta";
}

template <typename Op>
std::unique_ptr<KernelState> prepareUnaryWith(const KernelSetup& setup, double alpha, double beta) {
  const DType dtype = prepareSameShapeUnary<Op>(setup);
  auto state = std::make_unique<UnaryState>();
  if constexpr (requires { Op::kVector; }) {
    if (dtype == DType::kF32) state->vector = vec::vectorKernels().unaryFn(Op::kVector);
  }
  if (state->vector == nullptr) state->loop = unaryLoopFor<Op>(dtype);
  state->element_size = dtypeSize(dtype);
  state->result_size = dtypeSize(resultDType<Op>(dtype));
  state->alpha = alpha;
  state->beta = beta;
  return state;
}

template <typename Op>
std::unique_ptr<KernelState> prepareUnaryAs(const KernelSetup& setup) {
  double alpha = 0;
  double beta = 0;
  if constexpr (requires { Op::kAlpha; }) alpha = setup.params.getFloat(std::string(alphaName<Op>()), Op::kAlpha);
  if constexpr (requires { Op::kBeta; }) beta = setup.params.getFloat(std::string(betaName<Op>()), Op::kBeta);
  return prepareUnaryWith<Op>(setup, alpha, beta);
}

std::unique_ptr<KernelState> prepareIsInf(const KernelSetup& setup) {
  return prepareUnaryWith<IsInf>(setup, static_cast<double>(setup.params.getInt("detect_negative", 1)),
                                 static_cast<double>(setup.params.getInt("detect_positive", 1)));
}

std::unique_ptr<KernelState> prepareGelu(const KernelSetup& setup) {
  const std::string approximate = setup.params.getString("approximate", "none");
  if (approximate == "none") return prepareUnaryAs<Gelu>(setup);
  if (approximate == "tanh") return prepareUnaryAs<GeluTanh>(setup);
  throw UsageError(fmt::format("Gelu: approximate is '{}', expected 'none' or 'tanh'", approximate));
}

// The element count comes from the call's view, so a dynamic shape works too.
void runUnary(const KernelCall& call) {
  const auto& state = static_cast<const UnaryState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  parallelForElements(static_cast<int64_t>(call.outputs[0].numElements()), [&](int64_t begin, int64_t end) {
    if (state.vector != nullptr) {
      state.vector(reinterpret_cast<const float*>(x) + begin, reinterpret_cast<float*>(y) + begin, end - begin,
                   static_cast<float>(state.alpha), static_cast<float>(state.beta));
    } else {
      state.loop(x + static_cast<size_t>(begin) * state.element_size,
                 y + static_cast<size_t>(begin) * state.result_size, end - begin, state.alpha, state.beta);
    }
  });
}

// --------------------------------------------------------------------- Clip

// Clip(x, min, max): min and max are optional scalar inputs (attributes
// before opset 11). Bounds known at prepare live in the state as raw element
// bytes; the others are read from the call's inputs.
struct ClipState final : KernelState {
  using Loop = void (*)(const std::byte* x, std::byte* y, int64_t n, const std::byte* lo, const std::byte* hi);
  vec::UnaryFn vector = nullptr;  // f32
  Loop loop = nullptr;            // the other types
  size_t element_size = 0;
  std::array<std::byte, 8> lo{};
  std::array<std::byte, 8> hi{};
  bool lo_from_call = false;
  bool hi_from_call = false;
};

template <typename T>
void clipLoop(const std::byte* x_bytes, std::byte* y_bytes, int64_t n, const std::byte* lo_bytes,
              const std::byte* hi_bytes) {
  using E = Element<T>;
  using S = typename E::Stored;
  const auto* x = reinterpret_cast<const S*>(x_bytes);
  auto* y = reinterpret_cast<S*>(y_bytes);
  S lo_stored;
  S hi_stored;
  std::memcpy(&lo_stored, lo_bytes, sizeof lo_stored);
  std::memcpy(&hi_stored, hi_bytes, sizeof hi_stored);
  const auto lo = E::load(lo_stored);
  const auto hi = E::load(hi_stored);
  // min above max gives max, as ONNX specifies; NaN passes through.
  mapBlocked(y, n, [&](int64_t i) {
    const auto value = E::load(x[i]);
    const bool below = value < lo;
    if ((below ? lo : value) > hi) return hi_stored;
    return below ? lo_stored : x[i];
  });
}

// Sets `bytes` to the bound of `input` (1 = min, 2 = max) when it is known at
// prepare; returns true when it must be read at run instead.
template <typename T>
bool prepareBound(const KernelSetup& setup, size_t input, std::array<std::byte, 8>& bytes) {
  using E = Element<T>;
  using C = typename E::Compute;
  const bool is_min = input == 1;
  const char* attribute = is_min ? "min" : "max";
  if (input >= setup.inputs.size() || setup.inputs[input].dtype == DType::kUndefined) {
    C value;
    if (setup.params.has(attribute)) {
      value = static_cast<C>(setup.params.getFloat(attribute, 0));  // opset 6: float attributes
    } else if constexpr (std::is_floating_point_v<C>) {
      value = is_min ? -std::numeric_limits<C>::infinity() : std::numeric_limits<C>::infinity();
    } else {
      value = is_min ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
    }
    const typename E::Stored stored = E::store(value);
    std::memcpy(bytes.data(), &stored, sizeof stored);
    return false;
  }
  const TensorInfo& bound = setup.inputs[input];
  if (bound.dtype != setup.inputs[0].dtype) {
    throw UsageError(fmt::format("Clip: {} is {} but the input is {}: they must match", attribute,
                                 dtypeName(bound.dtype), dtypeName(setup.inputs[0].dtype)));
  }
  if (!bound.isStatic() || bound.numElements() != 1) {
    throw UsageError(fmt::format("Clip: {} must be a scalar, got {}", attribute, typeString(bound)));
  }
  if (const std::byte* constant = constantInput(setup, input)) {
    std::memcpy(bytes.data(), constant, sizeof(typename E::Stored));
    return false;
  }
  return true;
}

template <typename T>
std::unique_ptr<KernelState> prepareClipAs(const KernelSetup& setup) {
  auto state = std::make_unique<ClipState>();
  if constexpr (std::is_same_v<T, float>) {
    state->vector = vec::vectorKernels().unaryFn(vec::Unary::kClip);
  } else {
    state->loop = &clipLoop<T>;
  }
  state->element_size = sizeof(typename Element<T>::Stored);
  state->lo_from_call = prepareBound<T>(setup, 1, state->lo);
  state->hi_from_call = prepareBound<T>(setup, 2, state->hi);
  return state;
}

std::unique_ptr<KernelState> prepareClip(const KernelSetup& setup) {
  expectCounts("Clip", setup, 1, 3);
  const TensorInfo& x = setup.inputs[0];
  if (!inTypeSet(x.dtype, kNumbers)) refuseDType("Clip", x.dtype, kNumbers);
  expectOutput("Clip", setup, x.dtype, x.shape);
  return dispatchType<kNumbers>(x.dtype, [&](auto tag) -> std::unique_ptr<KernelState> {
    return prepareClipAs<typename decltype(tag)::type>(setup);
  });
}

void runClip(const KernelCall& call) {
  const auto& state = static_cast<const ClipState&>(*call.state);
  const std::byte* lo = state.lo_from_call ? call.inputs[1].data : state.lo.data();
  const std::byte* hi = state.hi_from_call ? call.inputs[2].data : state.hi.data();
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  float lo_value = 0;
  float hi_value = 0;
  if (state.vector != nullptr) {
    std::memcpy(&lo_value, lo, sizeof lo_value);
    std::memcpy(&hi_value, hi, sizeof hi_value);
  }
  parallelForElements(static_cast<int64_t>(call.outputs[0].numElements()), [&](int64_t begin, int64_t end) {
    if (state.vector != nullptr) {
      state.vector(reinterpret_cast<const float*>(x) + begin, reinterpret_cast<float*>(y) + begin, end - begin,
                   lo_value, hi_value);
    } else {
      const size_t offset = static_cast<size_t>(begin) * state.element_size;
      state.loop(x + offset, y + offset, end - begin, lo, hi);
    }
  });
}

// ----------------------------------------------------------------- Identity

struct IdentityState final : KernelState {
  size_t element_size = 0;
};

std::unique_ptr<KernelState> prepareIdentity(const KernelSetup& setup) {
  expectCounts("Identity", setup, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  if (dtypeSize(x.dtype) == 0) throw UsageError(fmt::format("Identity: no kernel for {} inputs", dtypeName(x.dtype)));
  expectOutput("Identity", setup, x.dtype, x.shape);
  auto state = std::make_unique<IdentityState>();
  state->element_size = dtypeSize(x.dtype);
  return state;
}

void runIdentity(const KernelCall& call) {
  const auto& state = static_cast<const IdentityState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  const size_t bytes = call.outputs[0].numElements() * state.element_size;
  if (x != y && bytes != 0) std::memcpy(y, x, bytes);
}

// ---------------------------------------------------------------- binary ops

struct Add {
  static constexpr std::string_view kName = "Add";
  static constexpr TypeSet kTypes = kNumbers;
  static constexpr vec::Binary kVector = vec::Binary::kAdd;
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return wrapAdd(a, b);
    } else {
      return a + b;
    }
  }
};
struct Sub {
  static constexpr std::string_view kName = "Sub";
  static constexpr TypeSet kTypes = kNumbers;
  static constexpr vec::Binary kVector = vec::Binary::kSub;
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return wrapSub(a, b);
    } else {
      return a - b;
    }
  }
};
struct Mul {
  static constexpr std::string_view kName = "Mul";
  static constexpr TypeSet kTypes = kNumbers;
  static constexpr vec::Binary kVector = vec::Binary::kMul;
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return wrapMul(a, b);
    } else {
      return a * b;
    }
  }
};
struct Div {
  static constexpr std::string_view kName = "Div";
  static constexpr TypeSet kTypes = kNumbers;
  static constexpr vec::Binary kVector = vec::Binary::kDiv;
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return wrapDiv(a, b);  // x / 0 gives 0, INT_MIN / -1 INT_MIN
    } else {
      return a / b;
    }
  }
};
// Pow with both operands of one float type (the mixed types: powRowFor).
struct Pow {
  static constexpr std::string_view kName = "Pow";
  static constexpr TypeSet kTypes = kFloats;
  template <typename T>
  static T apply(T a, T b) {
    return std::pow(a, b);
  }
};
// Pow with a constant exponent of 2 or 0.5 (x ** 2 and x ** 0.5 are common).
struct PowSquare {
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Binary kVector = vec::Binary::kSquare;
  template <typename T>
  static T apply(T a, T) {
    return a * a;  // pow(x, 2) is exactly x * x
  }
};
// A constant exponent of 3 (Gelu's tanh form: x + 0.044715 x^3): two
// multiplies, within 2 ulp of std::pow, in a loop that vectorises.
struct PowCube {
  static constexpr TypeSet kTypes = kFloats;
  template <typename T>
  static T apply(T a, T) {
    return a * a * a;
  }
};
struct PowSqrt {
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Binary kVector = vec::Binary::kSqrt;
  template <typename T>
  static T apply(T a, T) {
    // pow(x, 0.5) is sqrt(x) (correctly rounded both) except at -0 (+0; the
    // + 0 makes it so) and -inf (+inf).
    return a == -std::numeric_limits<T>::infinity() ? -a : std::sqrt(a) + T(0);
  }
};
// Max and Min propagate NaN, as numpy's maximum and minimum do.
struct Max {
  static constexpr std::string_view kName = "Max";
  static constexpr TypeSet kTypes = kNumbers;
  static constexpr vec::Binary kVector = vec::Binary::kMax;
  static constexpr bool kVariadic = true;
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? b : a;
    } else {
      return (a > b || a != a) ? a : b;
    }
  }
};
struct Min {
  static constexpr std::string_view kName = "Min";
  static constexpr TypeSet kTypes = kNumbers;
  static constexpr vec::Binary kVector = vec::Binary::kMin;
  static constexpr bool kVariadic = true;
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return b < a ? b : a;
    } else {
      return (a < b || a != a) ? a : b;
    }
  }
};
// Sum is a variadic Add; Mean divides the sum by the input count at the end
// (kDivideByCount), as the ONNX reference does.
struct Sum : Add {
  static constexpr std::string_view kName = "Sum";
  static constexpr bool kVariadic = true;
};
struct Mean : Add {
  static constexpr std::string_view kName = "Mean";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr bool kVariadic = true;
  static constexpr bool kDivideByCount = true;
};
// Mod with fmod = 0: the remainder has the divisor's sign (numpy's mod,
// Python's %); x mod 0 is 0 for integers and NaN for floats.
struct Mod {
  static constexpr std::string_view kName = "Mod";
  static constexpr TypeSet kTypes = kNumbers;
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<T>) {
        if (b == -1) return 0;  // INT_MIN % -1 traps
        const T r = static_cast<T>(a % b);
        return (r != 0 && ((r < 0) != (b < 0))) ? static_cast<T>(r + b) : r;
      } else {
        return static_cast<T>(a % b);
      }
    } else {
      T r = std::fmod(a, b);
      if (r != T(0)) {
        if ((b < T(0)) != (r < T(0))) r += b;
      } else {
        r = std::copysign(T(0), b);
      }
      return r;
    }
  }
};
// Mod with fmod = 1: the remainder has the dividend's sign (C's fmod and %).
struct FMod {
  static constexpr std::string_view kName = "Mod";
  static constexpr TypeSet kTypes = kNumbers;
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      if (b == 0) return 0;
      if constexpr (std::is_signed_v<T>) {
        if (b == -1) return 0;
      }
      return static_cast<T>(a % b);
    } else {
      return std::fmod(a, b);
    }
  }
};
// PRelu(x, slope): slope broadcasts to x.
struct PRelu {
  static constexpr std::string_view kName = "PRelu";
  static constexpr TypeSet kTypes = kNumbers;
  template <typename T>
  static T apply(T x, T slope) {
    if constexpr (std::is_unsigned_v<T>) {
      return x;
    } else if constexpr (std::is_integral_v<T>) {
      return x < T(0) ? wrapMul(x, slope) : x;
    } else {
      return x < T(0) ? x * slope : x;
    }
  }
};
// Comparisons and logic produce bool, stored as one byte 0 or 1.
#define KILN_PREDICATE(Name, types, expression)      \
  struct Name {                                      \
    static constexpr std::string_view kName = #Name; \
    static constexpr TypeSet kTypes = types;         \
    static constexpr bool kToBool = true;            \
    template <typename T>                            \
    static bool apply(T a, T b) {                    \
      return expression;                             \
    }                                                \
  };
KILN_PREDICATE(Equal, kNumbers | kBools, a == b)
KILN_PREDICATE(Less, kNumbers, a < b)
KILN_PREDICATE(Greater, kNumbers, a > b)
KILN_PREDICATE(LessOrEqual, kNumbers, a <= b)
KILN_PREDICATE(GreaterOrEqual, kNumbers, a >= b)
KILN_PREDICATE(And, kBools, a && b)
KILN_PREDICATE(Or, kBools, a || b)
KILN_PREDICATE(Xor, kBools, a != b)
#undef KILN_PREDICATE
#define KILN_BITWISE(Name, expression)               \
  struct Name {                                      \
    static constexpr std::string_view kName = #Name; \
    static constexpr TypeSet kTypes = kIntegers;     \
    template <typename T>                            \
    static T apply(T a, T b) {                       \
      return static_cast<T>(expression);             \
    }                                                \
  };
KILN_BITWISE(BitwiseAnd, a & b)
KILN_BITWISE(BitwiseOr, a | b)
KILN_BITWISE(BitwiseXor, a ^ b)
#undef KILN_BITWISE
// BitShift (direction LEFT or RIGHT), as the ONNX reference: a shift by a
// negative amount or by the bit width or more gives 0 (and -1 for a negative
// signed value shifted right); a left shift wraps; a right shift of a signed
// value is arithmetic.
struct ShiftLeft {
  static constexpr std::string_view kName = "BitShift";
  static constexpr TypeSet kTypes = kIntegers;
  template <typename T>
  static T apply(T a, T b) {
    using U = std::make_unsigned_t<T>;
    if (b < T(0) || static_cast<U>(b) >= sizeof(T) * 8) return 0;
    using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<Wide>(static_cast<U>(a)) << static_cast<unsigned>(b)));
  }
};
struct ShiftRight {
  static constexpr std::string_view kName = "BitShift";
  static constexpr TypeSet kTypes = kIntegers;
  template <typename T>
  static T apply(T a, T b) {
    using U = std::make_unsigned_t<T>;
    if (b < T(0) || static_cast<U>(b) >= sizeof(T) * 8) return a < T(0) ? T(-1) : T(0);
    return static_cast<T>(a >> static_cast<unsigned>(b));
  }
};

// One output row of n elements; sa and sb (0 or 1) say whether each input
// walks the row or repeats one element.
using BinaryRow = void (*)(const std::byte* a, int64_t sa, const std::byte* b, int64_t sb, std::byte* y, int64_t n);

// Walks a row with f(a element, b element) -> stored result.
template <typename A, typename B, typename Y, typename F>
void rowOf(const std::byte* a_bytes, int64_t sa, const std::byte* b_bytes, int64_t sb, std::byte* y_bytes,
           int64_t n, F f) {
  const A* a = reinterpret_cast<const A*>(a_bytes);
  const B* b = reinterpret_cast<const B*>(b_bytes);
  Y* y = reinterpret_cast<Y*>(y_bytes);
  if (sa != 0 && sb != 0) {
    mapBlocked(y, n, [&](int64_t i) { return f(a[i], b[i]); });
  } else if (sa != 0) {
    const B bv = *b;
    mapBlocked(y, n, [&](int64_t i) { return f(a[i], bv); });
  } else if (sb != 0) {
    const A av = *a;
    mapBlocked(y, n, [&](int64_t i) { return f(av, b[i]); });
  } else {
    const Y v = f(*a, *b);
    mapBlocked(y, n, [&](int64_t) { return v; });
  }
}

template <typename Op, typename T>
void binaryRow(const std::byte* a, int64_t sa, const std::byte* b, int64_t sb, std::byte* y, int64_t n) {
  using E = Element<T>;
  using S = typename E::Stored;
  using Y = decltype(storeResult<Op, T>(typename E::Compute{}));
  rowOf<S, S, Y>(a, sa, b, sb, y, n,
                 [](S av, S bv) { return storeResult<Op, T>(Op::apply(E::load(av), E::load(bv))); });
}

// The f32 row: one of the vector kernel's three, by which operand walks.
template <vec::Binary kOp>
void vectorRow(const std::byte* a_bytes, int64_t sa, const std::byte* b_bytes, int64_t sb, std::byte* y_bytes,
               int64_t n) {
  const vec::VectorKernels& kernels = vec::vectorKernels();
  const auto* a = reinterpret_cast<const float*>(a_bytes);
  const auto* b = reinterpret_cast<const float*>(b_bytes);
  auto* y = reinterpret_cast<float*>(y_bytes);
  if (sa != 0 && sb != 0) {
    kernels.binaryFn(kOp, vec::Operands::kBoth)(a, b, y, n);
  } else if (sa != 0) {
    kernels.binaryFn(kOp, vec::Operands::kScalarB)(a, b, y, n);
  } else if (sb != 0) {
    kernels.binaryFn(kOp, vec::Operands::kScalarA)(a, b, y, n);
  } else if (n > 0) {
    kernels.binaryFn(kOp, vec::Operands::kScalarB)(a, b, y, 1);
    std::fill(y + 1, y + n, y[0]);
  }
}

// f32 runs the op's vector kernel where it has one.
template <typename Op>
BinaryRow binaryRowFor(DType dtype) {
  if constexpr (requires { Op::kVector; }) {
    if (dtype == DType::kF32) return &vectorRow<Op::kVector>;
  }
  return dispatchType<Op::kTypes>(dtype, [](auto tag) -> BinaryRow {
    return &binaryRow<Op, typename decltype(tag)::type>;
  });
}

// ---------------------------------------------------- Pow of mixed types

// Pow(base, exponent) where the exponent's type differs from the base's, as
// numpy's power(a, b).astype(a.dtype): integer powers of integers are exact
// (wrapping); anything with a float is computed in double and converted to
// the base type (floats round, integers truncate toward zero).
template <typename T>
T integerPower(T base, int64_t exponent) {
  if (exponent < 0) {  // only 1 and -1 have integer reciprocals
    if (base == T(1)) return T(1);
    if constexpr (std::is_signed_v<T>) {
      if (base == T(-1)) return (exponent % 2 == 0) ? T(1) : T(-1);
    }
    return T(0);
  }
  T result = 1;
  while (exponent > 0) {
    if ((exponent & 1) != 0) result = wrapMul(result, base);
    base = wrapMul(base, base);
    exponent >>= 1;
  }
  return result;
}

template <typename TB, typename TE>
auto mixedPower(typename Element<TB>::Compute base, typename Element<TE>::Compute exponent) {
  using C = typename Element<TB>::Compute;
  if constexpr (std::is_integral_v<C> && std::is_integral_v<decltype(exponent)>) {
    if constexpr (std::is_unsigned_v<decltype(exponent)>) {
      const auto clamped = static_cast<int64_t>(std::min<uint64_t>(exponent, uint64_t{1} << 62));
      return integerPower(base, clamped);
    } else {
      return integerPower(base, static_cast<int64_t>(exponent));
    }
  } else {
    const double power = std::pow(static_cast<double>(base), static_cast<double>(exponent));
    if constexpr (std::is_integral_v<C>) {
      if (!(power == power)) return C(0);
      if (power <= static_cast<double>(std::numeric_limits<C>::lowest())) return std::numeric_limits<C>::lowest();
      if (power >= static_cast<double>(std::numeric_limits<C>::max())) return std::numeric_limits<C>::max();
      return static_cast<C>(power);
    } else {
      return static_cast<C>(power);
    }
  }
}

template <typename TB, typename TE>
void powRow(const std::byte* a, int64_t sa, const std::byte* b, int64_t sb, std::byte* y, int64_t n) {
  using EB = Element<TB>;
  using EE = Element<TE>;
  using SB = typename EB::Stored;
  using SE = typename EE::Stored;
  rowOf<SB, SE, SB>(a, sa, b, sb, y, n, [](SB base, SE exponent) {
    return EB::store(mixedPower<TB, TE>(EB::load(base), EE::load(exponent)));
  });
}

constexpr TypeSet kPowBases = kFloats | kSigned;

BinaryRow powRowFor(DType base, DType exponent) {
  return dispatchType<kPowBases>(base, [&](auto base_tag) -> BinaryRow {
    return dispatchType<kNumbers>(exponent, [](auto exponent_tag) -> BinaryRow {
      return &powRow<typename decltype(base_tag)::type, typename decltype(exponent_tag)::type>;
    });
  });
}

// ------------------------------------------------------- binary execution

// Output elements [begin, end) of one binary op: a row call per (part of a)
// row of the plan. Element sizes in bytes: `a_size` and `b_size` for the
// inputs, `out` for the output.
//
// Short rows where one operand repeats one row over the next dimension and
// the other runs on (a channels-last tensor times a per-channel scale: [N,
// H, W, C] x [N, 1, 1, C], rows of C = 8 to 200) go through tiledRange
// instead: a call per row of 8 costs more than its 8 multiplies.
constexpr size_t kTileBytes = 4096;

// Which operand (0 or 1) repeats its row along the plan's next-to-last
// dimension while the other walks on contiguously; -1 when the plan is not
// of that shape or its rows are long enough as they are.
int repeatedRowOperand(const BroadcastPlan& plan, size_t a_size, size_t b_size) {
  const int64_t n = plan.rowLength();
  if (plan.rank < 2 || n == 0 || plan.innerStride(0) != 1 || plan.innerStride(1) != 1) return -1;
  const uint32_t d = plan.rank - 2;
  for (int repeated = 0; repeated < 2; ++repeated) {
    const size_t size = repeated == 0 ? a_size : b_size;
    if (n * static_cast<int64_t>(size) * 4 > static_cast<int64_t>(kTileBytes)) continue;  // at least 4 rows a tile
    if (plan.strides[repeated][d] == 0 && plan.strides[1 - repeated][d] == n) return repeated;
  }
  return -1;
}

// binaryRange for plans repeatedRowOperand accepts: the repeated row is
// copied side by side into a tile (a thread's own, no allocation), and one
// row call covers as many rows as the tile holds.
void tiledRange(BinaryRow row, const BroadcastPlan& plan, int repeated, size_t a_size, size_t b_size, size_t out,
                const std::byte* a, const std::byte* b, std::byte* y, int64_t begin, int64_t end) {
  alignas(64) thread_local std::array<std::byte, kTileBytes> tile;
  const int64_t n = plan.rowLength();
  const int64_t dim = plan.dims[plan.rank - 2];
  const size_t row_bytes = static_cast<size_t>(n) * (repeated == 0 ? a_size : b_size);
  const int64_t tile_rows = static_cast<int64_t>(kTileBytes / row_bytes);
  const std::byte* tiled_from = nullptr;  // the row the tile holds now
  for (int64_t at = begin; at < end;) {
    const BroadcastRows rows(plan, at);
    const std::byte* a_at = a + static_cast<size_t>(rows.offset(0) + at % n) * a_size;
    const std::byte* b_at = b + static_cast<size_t>(rows.offset(1) + at % n) * b_size;
    int64_t count = std::min(n - at % n, end - at);
    if (at % n == 0 && count == n) {
      // Whole rows up to the end of the range, the tile, or this run of the
      // repeating dimension.
      const int64_t whole = std::min({(end - at) / n, tile_rows, dim - (at / n) % dim});
      const std::byte* from = repeated == 0 ? a_at : b_at;
      if (from != tiled_from) {
        for (int64_t r = 0; r < tile_rows; ++r) std::memcpy(tile.data() + r * row_bytes, from, row_bytes);
        tiled_from = from;
      }
      (repeated == 0 ? a_at : b_at) = tile.data();
      count = whole * n;
    }
    row(a_at, 1, b_at, 1, y + static_cast<size_t>(at) * out, count);
    at += count;
  }
}

void binaryRange(BinaryRow row, const BroadcastPlan& plan, size_t a_size, size_t b_size, size_t out,
                 const std::byte* a, const std::byte* b, std::byte* y, int64_t begin, int64_t end) {
  const int64_t n = plan.rowLength();
  const int64_t sa = plan.innerStride(0);
  const int64_t sb = plan.innerStride(1);
  if (n == 0 || begin >= end) return;  // an empty output: the inputs may not even have an element to read
  if (const int repeated = repeatedRowOperand(plan, a_size, b_size); repeated >= 0) {
    tiledRange(row, plan, repeated, a_size, b_size, out, a, b, y, begin, end);
    return;
  }
  BroadcastRows rows(plan, begin);
  int64_t column = begin % n;
  for (int64_t at = begin; at < end; rows.next()) {
    const int64_t count = std::min(n - column, end - at);
    row(a + static_cast<size_t>(rows.offset(0) + column * sa) * a_size, sa,
        b + static_cast<size_t>(rows.offset(1) + column * sb) * b_size, sb, y + static_cast<size_t>(at) * out,
        count);
    at += count;
    column = 0;
  }
}

// A binary op over two operands: inputs `a` and `b` (kFromOutput: the output
// itself, for the variadic ops, which fold their inputs pairwise).
constexpr uint32_t kFromOutput = ~0u;

struct BinaryStep {
  uint32_t a = 0;
  uint32_t b = 1;
  BroadcastPlan plan;
};

struct BinaryState final : KernelState {
  using Finish = void (*)(std::byte* y, int64_t begin, int64_t end, double divisor);
  BinaryRow row = nullptr;
  size_t a_size = 0;       // element size of input 0 (and of the variadic inputs)
  size_t b_size = 0;       // of input 1 (differs for Pow)
  size_t result_size = 0;  // of the output
  std::vector<BinaryStep> steps;  // empty: copy input 0 (a variadic op of one input)
  Finish finish = nullptr;        // Mean: divides the sum by the input count
  double divisor = 1;
};

template <typename T>
void divideRange(std::byte* y_bytes, int64_t begin, int64_t end, double divisor) {
  using E = Element<T>;
  auto* y = reinterpret_cast<typename E::Stored*>(y_bytes) + begin;
  const auto d = static_cast<typename E::Compute>(divisor);
  mapBlocked(y, end - begin, [&](int64_t i) { return E::store(E::load(y[i]) / d); });
}

// The value of every element of input `index` when it is a constant whose
// elements are all equal, else nothing (f32 and f64 only).
std::optional<double> uniformConstant(const KernelSetup& setup, size_t index) {
  const std::byte* bytes = constantInput(setup, index);
  const TensorInfo& info = setup.inputs[index];
  if (bytes == nullptr || !info.isStatic() || info.numElements() == 0) return std::nullopt;
  if (info.dtype != DType::kF32 && info.dtype != DType::kF64) return std::nullopt;
  std::optional<double> uniform;
  for (uint64_t i = 0; i < info.numElements(); ++i) {
    double value = 0;
    if (info.dtype == DType::kF32) {
      float f;
      std::memcpy(&f, bytes + i * sizeof f, sizeof f);
      value = f;
    } else {
      std::memcpy(&value, bytes + i * sizeof value, sizeof value);
    }
    if (uniform.has_value() && *uniform != value) return std::nullopt;
    uniform = value;
  }
  return uniform;
}

// Checks the inputs (count, static shapes, matching dtypes except Pow's
// exponent) and the output; returns the broadcast output shape.
template <typename Op>
std::vector<int64_t> checkBinary(const KernelSetup& setup, bool mixed_exponent) {
  constexpr bool kVariadic = requires { Op::kVariadic; };
  constexpr std::string_view op = Op::kName;
  expectCounts(op, setup, kVariadic ? 1 : 2, kVariadic ? 64 : 2);
  const DType dtype = setup.inputs[0].dtype;
  const TypeSet types = mixed_exponent ? kPowBases : Op::kTypes;
  if (!inTypeSet(dtype, types)) refuseDType(op, dtype, types);
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& input = setup.inputs[i];
    if (mixed_exponent && i == 1) {
      if (!inTypeSet(input.dtype, kNumbers)) refuseDType("Pow (exponent)", input.dtype, kNumbers);
    } else if (input.dtype != dtype) {
      throw UsageError(fmt::format("{}: input {} is {} but input 0 is {}: they must match", op, i,
                                   dtypeName(input.dtype), dtypeName(dtype)));
    }
    if (!input.isStatic()) {
      throw UsageError(fmt::format("{}: needs static shapes, input {} is {}", op, i, typeString(input)));
    }
  }
  std::vector<int64_t> out = broadcastShapes(op, setup.inputs);
  expectOutput(op, setup, resultDType<Op>(dtype), out);
  return out;
}

// The steps that fold the inputs: input 0 op input 1, then output op input i.
void planSteps(BinaryState& state, const KernelSetup& setup, const std::vector<int64_t>& out) {
  for (uint32_t i = 1; i < setup.inputs.size(); ++i) {
    BinaryStep step;
    step.a = i == 1 ? 0 : kFromOutput;
    step.b = i;
    const std::array<std::vector<int64_t>, 2> operands = {i == 1 ? setup.inputs[0].shape : out, setup.inputs[i].shape};
    step.plan = planBroadcast(out, operands);
    state.steps.push_back(step);
  }
}

template <typename Op>
std::unique_ptr<KernelState> prepareBinaryWith(const KernelSetup& setup, BinaryRow row, bool mixed_exponent) {
  const std::vector<int64_t> out = checkBinary<Op>(setup, mixed_exponent);
  const DType dtype = setup.inputs[0].dtype;
  auto state = std::make_unique<BinaryState>();
  state->row = row;
  state->a_size = dtypeSize(dtype);
  state->b_size = dtypeSize(setup.inputs.size() > 1 ? setup.inputs[1].dtype : dtype);
  state->result_size = dtypeSize(resultDType<Op>(dtype));
  planSteps(*state, setup, out);
  if constexpr (requires { Op::kDivideByCount; }) {
    if (!state->steps.empty()) {
      state->finish = dispatchType<kFloats>(dtype, [](auto tag) -> BinaryState::Finish {
        return &divideRange<typename decltype(tag)::type>;
      });
      state->divisor = static_cast<double>(setup.inputs.size());
    }
  }
  return state;
}

template <typename Op>
std::unique_ptr<KernelState> prepareBinary(const KernelSetup& setup) {
  const DType dtype = setup.inputs.empty() ? DType::kUndefined : setup.inputs[0].dtype;
  return prepareBinaryWith<Op>(setup, binaryRowFor<Op>(dtype), false);
}

// Pow: same-type floats run the Pow op (with the x ** 2, x ** 0.5 and x ** 3
// fast paths); other type pairs run powRow.
std::unique_ptr<KernelState> preparePow(const KernelSetup& setup) {
  expectCounts("Pow", setup, 2, 2);
  const DType base = setup.inputs[0].dtype;
  const DType exponent = setup.inputs[1].dtype;
  if (base == exponent && inTypeSet(base, kFloats)) {
    BinaryRow row = binaryRowFor<Pow>(base);
    const std::optional<double> uniform = uniformConstant(setup, 1);
    if (uniform == 2.0) row = binaryRowFor<PowSquare>(base);
    if (uniform == 0.5) row = binaryRowFor<PowSqrt>(base);
    if (uniform == 3.0) row = binaryRowFor<PowCube>(base);
    return prepareBinaryWith<Pow>(setup, row, false);
  }
  return prepareBinaryWith<Pow>(setup, powRowFor(base, exponent), true);
}

std::unique_ptr<KernelState> prepareMod(const KernelSetup& setup) {
  const int64_t fmod = setup.params.getInt("fmod", 0);
  if (fmod != 0 && fmod != 1) throw UsageError(fmt::format("Mod: fmod is {}, expected 0 or 1", fmod));
  return fmod == 1 ? prepareBinary<FMod>(setup) : prepareBinary<Mod>(setup);
}

std::unique_ptr<KernelState> prepareBitShift(const KernelSetup& setup) {
  const std::string direction = setup.params.getString("direction", "");
  if (direction == "LEFT") return prepareBinary<ShiftLeft>(setup);
  if (direction == "RIGHT") return prepareBinary<ShiftRight>(setup);
  throw UsageError(fmt::format("BitShift: direction is '{}', expected 'LEFT' or 'RIGHT'", direction));
}

void runBinary(const KernelCall& call) {
  const auto& state = static_cast<const BinaryState&>(*call.state);
  std::byte* y = call.outputs[0].data;
  const auto count = static_cast<int64_t>(call.outputs[0].numElements());
  if (state.steps.empty()) {
    const size_t bytes = static_cast<size_t>(count) * state.a_size;
    if (call.inputs[0].data != y && bytes != 0) std::memcpy(y, call.inputs[0].data, bytes);
    return;
  }
  // Each thread runs every step over its own range: a variadic step reads
  // only the output elements of that range.
  parallelForElements(count, [&](int64_t begin, int64_t end) {
    for (const BinaryStep& step : state.steps) {
      const bool from_output = step.a == kFromOutput;
      binaryRange(state.row, step.plan, from_output ? state.result_size : state.a_size, state.b_size,
                  state.result_size, from_output ? y : call.inputs[step.a].data, call.inputs[step.b].data, y,
                  begin, end);
    }
    if (state.finish != nullptr) state.finish(y, begin, end, state.divisor);
  });
}

template <typename Op>
void addUnary(KernelRegistry& registry) {
  registry.add(KernelDef{std::string(Op::kName), &prepareUnaryAs<Op>, &runUnary});
}

template <typename Op>
void addBinary(KernelRegistry& registry) {
  registry.add(KernelDef{std::string(Op::kName), &prepareBinary<Op>, &runBinary});
}

}  // namespace

void registerElementwiseKernels(KernelRegistry& registry) {
  addUnary<Relu>(registry);
  addUnary<Sigmoid>(registry);
  addUnary<Tanh>(registry);
  addUnary<Exp>(registry);
  addUnary<Log>(registry);
  addUnary<Sqrt>(registry);
  addUnary<Erf>(registry);
  addUnary<Abs>(registry);
  addUnary<Neg>(registry);
  addUnary<Reciprocal>(registry);
  addUnary<Floor>(registry);
  addUnary<Ceil>(registry);
  addUnary<LeakyRelu>(registry);
  addUnary<Elu>(registry);
  addUnary<HardSigmoid>(registry);
  addUnary<HardSwish>(registry);
  addUnary<Softplus>(registry);
  addUnary<Sign>(registry);
  addUnary<Round>(registry);
  addUnary<Sin>(registry);
  addUnary<Cos>(registry);
  addUnary<Tan>(registry);
  addUnary<Asin>(registry);
  addUnary<Acos>(registry);
  addUnary<Atan>(registry);
  addUnary<Sinh>(registry);
  addUnary<Cosh>(registry);
  addUnary<Asinh>(registry);
  addUnary<Acosh>(registry);
  addUnary<Atanh>(registry);
  addUnary<Softsign>(registry);
  addUnary<Celu>(registry);
  addUnary<Selu>(registry);
  addUnary<ThresholdedRelu>(registry);
  addUnary<Shrink>(registry);
  addUnary<Mish>(registry);
  addUnary<Swish>(registry);
  addUnary<Not>(registry);
  addUnary<BitwiseNot>(registry);
  addUnary<IsNaN>(registry);
  registry.add(KernelDef{"IsInf", &prepareIsInf, &runUnary});
  registry.add(KernelDef{"Gelu", &prepareGelu, &runUnary});
  registry.add(KernelDef{"Clip", &prepareClip, &runClip});
  registry.add(KernelDef{"Identity", &prepareIdentity, &runIdentity});

  addBinary<Add>(registry);
  addBinary<Sub>(registry);
  addBinary<Mul>(registry);
  addBinary<Div>(registry);
  addBinary<Max>(registry);
  addBinary<Min>(registry);
  addBinary<Sum>(registry);
  addBinary<Mean>(registry);
  addBinary<PRelu>(registry);
  addBinary<Equal>(registry);
  addBinary<Less>(registry);
  addBinary<Greater>(registry);
  addBinary<LessOrEqual>(registry);
  addBinary<GreaterOrEqual>(registry);
  addBinary<And>(registry);
  addBinary<Or>(registry);
  addBinary<Xor>(registry);
  addBinary<BitwiseAnd>(registry);
  addBinary<BitwiseOr>(registry);
  addBinary<BitwiseXor>(registry);
  registry.add(KernelDef{"Pow", &preparePow, &runBinary});
  registry.add(KernelDef{"Mod", &prepareMod, &runBinary});
  registry.add(KernelDef{"BitShift", &prepareBitShift, &runBinary});
}

}  // namespace kiln
