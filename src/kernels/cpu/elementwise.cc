// Elementwise CPU kernels with ONNX semantics: unary maps, Clip, Identity, and
// binary arithmetic and comparisons with numpy broadcasting.
//
// prepare picks one loop (op x element type) and stores its address in the
// state; run makes one indirect call into it. f32, what models use, runs the
// vector kernels (vector_kernels.h: AVX-512, AVX2 or SSE2 code chosen for
// the CPU, with vector exp, erf, ...); each op names its vector kernel as
// kVector. f64 and the integer types run the loops here, where the op is a
// template parameter (nothing is dispatched per element) and every loop
// writes through mapBlocked so that it vectorises at -O2; their
// transcendental functions are the std:: ones. Large calls split their
// output across threads (parallel.h).
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

// The element types a kernel accepts.
enum TypeSet : unsigned { kFloats = 1, kIntegers = 2, kNumbers = kFloats | kIntegers };

std::string_view typeSetString(TypeSet types) {
  switch (types) {
    case kFloats:
      return "f32, f64";
    case kIntegers:
      return "i32, i64";
    case kNumbers:
      return "f32, f64, i32, i64";
  }
  return "";
}

bool inTypeSet(DType dtype, TypeSet types) {
  if (dtype == DType::kF32 || dtype == DType::kF64) return (types & kFloats) != 0;
  if (dtype == DType::kI32 || dtype == DType::kI64) return (types & kIntegers) != 0;
  return false;
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

// Two's-complement wrap-around for integer arithmetic (signed overflow is
// undefined behaviour in C++; ONNX, like numpy, wraps).
template <typename T>
T wrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}
template <typename T>
T wrapSub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}
template <typename T>
T wrapMul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
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
  static constexpr TypeSet kTypes = kFloats;
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
    if constexpr (std::is_integral_v<T>) {
      return x < 0 ? wrapSub(T(0), x) : x;  // |INT_MIN| wraps to INT_MIN, as in numpy
    } else {
      return std::abs(x);
    }
  }
};
struct Neg {
  static constexpr std::string_view kName = "Neg";
  static constexpr TypeSet kTypes = kNumbers;
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

struct UnaryState final : KernelState {
  using Loop = void (*)(const std::byte* x, std::byte* y, int64_t n, double alpha, double beta);
  vec::UnaryFn vector = nullptr;  // f32
  Loop loop = nullptr;            // the other types
  size_t element_size = 0;
  double alpha = 0;
  double beta = 0;
};

template <typename Op, typename T>
void unaryLoop(const std::byte* x_bytes, std::byte* y_bytes, int64_t n, double alpha, double beta) {
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  const UnaryArgs<T> args{static_cast<T>(alpha), static_cast<T>(beta)};
  mapBlocked(y, n, [&](int64_t i) { return Op::apply(x[i], args); });
}

// The scalar loop for the types other than f32.
template <typename Op>
UnaryState::Loop unaryLoopFor(DType dtype) {
  if constexpr ((Op::kTypes & kFloats) != 0) {
    if (dtype == DType::kF64) return &unaryLoop<Op, double>;
  }
  if constexpr ((Op::kTypes & kIntegers) != 0) {
    if (dtype == DType::kI32) return &unaryLoop<Op, int32_t>;
    if (dtype == DType::kI64) return &unaryLoop<Op, int64_t>;
  }
  return nullptr;
}

// Checks one input and one output of the same type and shape; returns the dtype.
DType prepareSameTypeUnary(std::string_view op, const KernelSetup& setup, TypeSet types) {
  expectCounts(op, setup, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  if (!inTypeSet(x.dtype, types)) refuseDType(op, x.dtype, types);
  expectOutput(op, setup, x.dtype, x.shape);
  return x.dtype;
}

template <typename Op>
std::unique_ptr<KernelState> prepareUnaryAs(const KernelSetup& setup) {
  const DType dtype = prepareSameTypeUnary(Op::kName, setup, Op::kTypes);
  auto state = std::make_unique<UnaryState>();
  if (dtype == DType::kF32) {
    state->vector = vec::vectorKernels().unaryFn(Op::kVector);
  } else {
    state->loop = unaryLoopFor<Op>(dtype);
  }
  state->element_size = dtypeSize(dtype);
  if constexpr (requires { Op::kAlpha; }) state->alpha = setup.params.getFloat("alpha", Op::kAlpha);
  if constexpr (requires { Op::kBeta; }) state->beta = setup.params.getFloat("beta", Op::kBeta);
  return state;
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
      const size_t offset = static_cast<size_t>(begin) * state.element_size;
      state.loop(x + offset, y + offset, end - begin, state.alpha, state.beta);
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
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  T lo;
  T hi;
  std::memcpy(&lo, lo_bytes, sizeof lo);
  std::memcpy(&hi, hi_bytes, sizeof hi);
  // min above max gives max, as ONNX specifies; NaN passes through.
  mapBlocked(y, n, [&](int64_t i) {
    const T v = x[i] < lo ? lo : x[i];
    return v > hi ? hi : v;
  });
}

template <typename T>
void storeBound(std::array<std::byte, 8>& bytes, T value) {
  std::memcpy(bytes.data(), &value, sizeof value);
}

// Sets `bytes` to the bound of `input` (1 = min, 2 = max) when it is known at
// prepare; returns true when it must be read at run instead.
template <typename T>
bool prepareBound(const KernelSetup& setup, size_t input, std::array<std::byte, 8>& bytes) {
  const bool is_min = input == 1;
  const char* attribute = is_min ? "min" : "max";
  if (input >= setup.inputs.size() || setup.inputs[input].dtype == DType::kUndefined) {
    T value;
    if (setup.params.has(attribute)) {
      value = static_cast<T>(setup.params.getFloat(attribute, 0));  // opset 6: float attributes
    } else if constexpr (std::is_floating_point_v<T>) {
      value = is_min ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::infinity();
    } else {
      value = is_min ? std::numeric_limits<T>::lowest() : std::numeric_limits<T>::max();
    }
    storeBound(bytes, value);
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
    std::memcpy(bytes.data(), constant, sizeof(T));
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
  state->element_size = sizeof(T);
  state->lo_from_call = prepareBound<T>(setup, 1, state->lo);
  state->hi_from_call = prepareBound<T>(setup, 2, state->hi);
  return state;
}

std::unique_ptr<KernelState> prepareClip(const KernelSetup& setup) {
  expectCounts("Clip", setup, 1, 3);
  const TensorInfo& x = setup.inputs[0];
  if (!inTypeSet(x.dtype, kNumbers)) refuseDType("Clip", x.dtype, kNumbers);
  expectOutput("Clip", setup, x.dtype, x.shape);
  switch (x.dtype) {
    case DType::kF32:
      return prepareClipAs<float>(setup);
    case DType::kF64:
      return prepareClipAs<double>(setup);
    case DType::kI32:
      return prepareClipAs<int32_t>(setup);
    default:
      return prepareClipAs<int64_t>(setup);
  }
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
      // Truncating, like C++ and onnxruntime. ONNX leaves x / 0 undefined; the
      // hardware traps on it and on INT_MIN / -1, which must not kill the
      // process: they give 0 and INT_MIN (wrapped).
      if (b == 0) return 0;
      if (b == -1) return wrapSub(T(0), a);
      return a / b;
    } else {
      return a / b;
    }
  }
};
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
  static constexpr std::string_view kName = "Pow";
  static constexpr TypeSet kTypes = kFloats;
  static constexpr vec::Binary kVector = vec::Binary::kSquare;
  template <typename T>
  static T apply(T a, T) {
    return a * a;  // pow(x, 2) is exactly x * x
  }
};
struct PowSqrt {
  static constexpr std::string_view kName = "Pow";
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
// Comparisons produce bool, stored as one byte 0 or 1.
struct Equal {
  static constexpr std::string_view kName = "Equal";
  static constexpr TypeSet kTypes = kNumbers;
  template <typename T>
  static uint8_t apply(T a, T b) {
    return a == b;
  }
};
struct Less {
  static constexpr std::string_view kName = "Less";
  static constexpr TypeSet kTypes = kNumbers;
  template <typename T>
  static uint8_t apply(T a, T b) {
    return a < b;
  }
};
struct Greater {
  static constexpr std::string_view kName = "Greater";
  static constexpr TypeSet kTypes = kNumbers;
  template <typename T>
  static uint8_t apply(T a, T b) {
    return a > b;
  }
};

template <typename Op, typename T>
using ResultOf = decltype(Op::apply(T{}, T{}));

// One output row of n elements; sa and sb (0 or 1) say whether each input
// walks the row or repeats one element.
using BinaryRow = void (*)(const std::byte* a, int64_t sa, const std::byte* b, int64_t sb, std::byte* y, int64_t n);

template <typename Op, typename T>
void binaryRow(const std::byte* a_bytes, int64_t sa, const std::byte* b_bytes, int64_t sb, std::byte* y_bytes,
               int64_t n) {
  using R = ResultOf<Op, T>;
  const T* a = reinterpret_cast<const T*>(a_bytes);
  const T* b = reinterpret_cast<const T*>(b_bytes);
  R* y = reinterpret_cast<R*>(y_bytes);
  if (sa != 0 && sb != 0) {
    mapBlocked(y, n, [&](int64_t i) { return Op::apply(a[i], b[i]); });
  } else if (sa != 0) {
    const T bv = *b;
    mapBlocked(y, n, [&](int64_t i) { return Op::apply(a[i], bv); });
  } else if (sb != 0) {
    const T av = *a;
    mapBlocked(y, n, [&](int64_t i) { return Op::apply(av, b[i]); });
  } else {
    const R v = Op::apply(*a, *b);
    mapBlocked(y, n, [&](int64_t) { return v; });
  }
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

// f32 runs the op's vector kernel where it has one (comparisons and the
// general Pow have none).
template <typename Op>
BinaryRow binaryRowFor(DType dtype) {
  if constexpr ((Op::kTypes & kFloats) != 0) {
    if constexpr (requires { Op::kVector; }) {
      if (dtype == DType::kF32) return &vectorRow<Op::kVector>;
    } else {
      if (dtype == DType::kF32) return &binaryRow<Op, float>;
    }
    if (dtype == DType::kF64) return &binaryRow<Op, double>;
  }
  if constexpr ((Op::kTypes & kIntegers) != 0) {
    if (dtype == DType::kI32) return &binaryRow<Op, int32_t>;
    if (dtype == DType::kI64) return &binaryRow<Op, int64_t>;
  }
  return nullptr;
}

// Output elements [begin, end) of one binary op: a row call per (part of a)
// row of the plan. Element sizes in bytes: `in` for the inputs, `out` for
// the output.
void binaryRange(BinaryRow row, const BroadcastPlan& plan, size_t in, size_t out, const std::byte* a,
                 const std::byte* b, std::byte* y, int64_t begin, int64_t end) {
  const int64_t n = plan.rowLength();
  const int64_t sa = plan.innerStride(0);
  const int64_t sb = plan.innerStride(1);
  if (n == 0 || begin >= end) return;  // an empty output: the inputs may not even have an element to read
  BroadcastRows rows(plan, begin);
  int64_t column = begin % n;
  for (int64_t at = begin; at < end; rows.next()) {
    const int64_t count = std::min(n - column, end - at);
    row(a + static_cast<size_t>(rows.offset(0) + column * sa) * in, sa,
        b + static_cast<size_t>(rows.offset(1) + column * sb) * in, sb, y + static_cast<size_t>(at) * out, count);
    at += count;
    column = 0;
  }
}

// A binary op over two operands: inputs `a` and `b` (kFromOutput: the output
// itself, for variadic Max and Min, which fold their inputs pairwise).
constexpr uint32_t kFromOutput = ~0u;

struct BinaryStep {
  uint32_t a = 0;
  uint32_t b = 1;
  BroadcastPlan plan;
};

struct BinaryState final : KernelState {
  BinaryRow row = nullptr;
  size_t element_size = 0;  // of the inputs
  size_t result_size = 0;   // of the output
  std::vector<BinaryStep> steps;  // empty: copy input 0 (Max or Min of one input)
};

// The value of every element of input `index` when it is a constant whose
// elements are all equal, else nothing.
std::optional<double> uniformConstant(const KernelSetup& setup, size_t index) {
  const std::byte* bytes = constantInput(setup, index);
  const TensorInfo& info = setup.inputs[index];
  if (bytes == nullptr || !info.isStatic() || info.numElements() == 0) return std::nullopt;
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

template <typename Op>
std::unique_ptr<KernelState> prepareBinary(const KernelSetup& setup) {
  constexpr bool kVariadic = requires { Op::kVariadic; };
  constexpr std::string_view op = Op::kName;
  expectCounts(op, setup, kVariadic ? 1 : 2, kVariadic ? 64 : 2);
  const DType dtype = setup.inputs[0].dtype;
  if (!inTypeSet(dtype, Op::kTypes)) refuseDType(op, dtype, Op::kTypes);
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& input = setup.inputs[i];
    if (input.dtype != dtype) {
      throw UsageError(fmt::format("{}: input {} is {} but input 0 is {}: they must match", op, i,
                                   dtypeName(input.dtype), dtypeName(dtype)));
    }
    if (!input.isStatic()) {
      throw UsageError(fmt::format("{}: needs static shapes, input {} is {}", op, i, typeString(input)));
    }
  }
  const std::vector<int64_t> out = broadcastShapes(op, setup.inputs);
  const DType result = std::is_same_v<ResultOf<Op, float>, uint8_t> ? DType::kBool : dtype;
  expectOutput(op, setup, result, out);

  auto state = std::make_unique<BinaryState>();
  state->row = binaryRowFor<Op>(dtype);
  if constexpr (std::is_same_v<Op, Pow>) {
    const std::optional<double> exponent = uniformConstant(setup, 1);
    if (exponent == 2.0) state->row = binaryRowFor<PowSquare>(dtype);
    if (exponent == 0.5) state->row = binaryRowFor<PowSqrt>(dtype);
  }
  state->element_size = dtypeSize(dtype);
  state->result_size = dtypeSize(result);
  for (uint32_t i = 1; i < setup.inputs.size(); ++i) {
    BinaryStep step;
    step.a = i == 1 ? 0 : kFromOutput;
    step.b = i;
    const std::array<std::vector<int64_t>, 2> operands = {i == 1 ? setup.inputs[0].shape : out, setup.inputs[i].shape};
    step.plan = planBroadcast(out, operands);
    state->steps.push_back(step);
  }
  return state;
}

void runBinary(const KernelCall& call) {
  const auto& state = static_cast<const BinaryState&>(*call.state);
  std::byte* y = call.outputs[0].data;
  const auto count = static_cast<int64_t>(call.outputs[0].numElements());
  if (state.steps.empty()) {
    const size_t bytes = static_cast<size_t>(count) * state.element_size;
    if (call.inputs[0].data != y && bytes != 0) std::memcpy(y, call.inputs[0].data, bytes);
    return;
  }
  // Each thread runs every step over its own range: a variadic step reads
  // only the output elements of that range.
  parallelForElements(count, [&](int64_t begin, int64_t end) {
    for (const BinaryStep& step : state.steps) {
      const std::byte* a = step.a == kFromOutput ? y : call.inputs[step.a].data;
      binaryRange(state.row, step.plan, state.element_size, state.result_size, a, call.inputs[step.b].data, y,
                  begin, end);
    }
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
  registry.add(KernelDef{"Gelu", &prepareGelu, &runUnary});
  registry.add(KernelDef{"Clip", &prepareClip, &runClip});
  registry.add(KernelDef{"Identity", &prepareIdentity, &runIdentity});

  addBinary<Add>(registry);
  addBinary<Sub>(registry);
  addBinary<Mul>(registry);
  addBinary<Div>(registry);
  addBinary<Pow>(registry);
  addBinary<Max>(registry);
  addBinary<Min>(registry);
  addBinary<Equal>(registry);
  addBinary<Less>(registry);
  addBinary<Greater>(registry);
}

}  // namespace kiln
