// Cast and CastLike between every kiln dtype, with ONNX's semantics.
//
// A conversion reads each element into a wide value that holds it exactly
// (float or double for the floating types, int32/int64/uint64 for the
// integers) and writes that value in the target type:
//   - to a standard float type: the C++ conversion (round to nearest even);
//     f16 and bf16 round to nearest even, overflow gives inf, NaN stays NaN;
//   - to the float8 types: round to nearest even; `saturate` (default 1)
//     turns overflow and infinities into the largest finite value, otherwise
//     they become inf (E5M2) or NaN (the others); see core/float_formats.h;
//   - to float4 E2M1: round to nearest even, always saturating, NaN to 0;
//   - to FLOAT8E8M0: through f32, rounded by `round_mode` (up, down,
//     nearest), as onnx.numpy_helper.to_float8e8m0;
//   - to an integer type from a float: truncation toward zero; NaN gives 0
//     and out-of-range values saturate (ONNX leaves both undefined);
//   - to the 4- and 2-bit integers: truncation as above (NaN and inf give
//     0), then the low bits (wrap-around), as ml_dtypes does;
//   - between integer types: two's-complement wrap-around; to bool: x != 0.
// These match the ONNX reference implementation (which is ml_dtypes) bit for
// bit; python/tests/test_cast.py checks every f16 value against it.
//
// The loop for each (from, to) pair is a template instantiated once and
// chosen at prepare.
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "core/float_formats.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

// -------------------------------------------------------- element types

// The narrow types (Half and BFloat16 are core/float_formats.h's), each its
// bits in one struct so that templates tell them apart. Sizes equal
// dtypeSize.
template <MiniFloat kF>
struct Mini {
  static constexpr MiniFloat kFormat = kF;
  uint8_t bits;
};
struct E8M0 {
  uint8_t bits;
};
// A 4- or 2-bit integer: its two's-complement bits in the low bits.
template <int kBits, bool kSigned>
struct SubByteInt {
  static constexpr int kWidth = kBits;
  static constexpr uint8_t kMask = (1u << kBits) - 1;
  uint8_t bits;

  int32_t value() const {
    const int32_t v = bits & kMask;
    return kSigned && (v >> (kBits - 1)) != 0 ? v - (1 << kBits) : v;
  }
  static SubByteInt fromInteger(int64_t v) {
    return SubByteInt{static_cast<uint8_t>(static_cast<uint64_t>(v) & kMask)};
  }
};
// bool is stored as one byte, 0 or 1.
struct Bool {
  uint8_t bits;
};

struct CastOptions {
  bool saturate = true;
  E8M0Rounding rounding = E8M0Rounding::kUp;
};

// The value of an element, in a type that holds it exactly.
template <typename T>
auto widen(T x) {
  if constexpr (std::is_arithmetic_v<T>) {
    return x;
  } else if constexpr (std::is_same_v<T, Half>) {
    return halfToFloat(x.bits);
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    return bfloat16ToFloat(x.bits);
  } else if constexpr (std::is_same_v<T, E8M0>) {
    return e8m0ToFloat(x.bits);
  } else if constexpr (std::is_same_v<T, Bool>) {
    return static_cast<int32_t>(x.bits != 0);
  } else if constexpr (requires { T::kFormat; }) {
    return miniFloatToDouble(x.bits, T::kFormat);
  } else {
    return x.value();
  }
}

// An integer type from a floating value: truncation toward zero, NaN to 0,
// saturating out of range.
template <typename To, typename V>
To truncateToInteger(V v) {
  if (!(v == v)) return To(0);
  constexpr auto lo = static_cast<double>(std::numeric_limits<To>::lowest());
  constexpr auto hi = static_cast<double>(std::numeric_limits<To>::max());
  const auto d = static_cast<double>(v);
  if (d <= lo) return std::numeric_limits<To>::lowest();
  if (d >= hi) return std::numeric_limits<To>::max();
  return static_cast<To>(d);
}

// A wide value `v` (float, double or an integer type) in type To.
template <typename To, typename V>
To narrow(V v, const CastOptions& options) {
  if constexpr (std::is_same_v<To, Bool>) {
    return Bool{static_cast<uint8_t>(v != V(0))};
  } else if constexpr (std::is_same_v<To, Half>) {
    if constexpr (std::is_same_v<V, double>) {
      return Half{static_cast<uint16_t>(doubleToMiniFloat(v, MiniFloat::kF16, false))};
    } else {
      return Half{floatToHalf(static_cast<float>(v))};  // exact through f32 for every integer below f16's range
    }
  } else if constexpr (std::is_same_v<To, BFloat16>) {
    if constexpr (std::is_same_v<V, float>) {
      return BFloat16{floatToBfloat16(v)};
    } else {
      return BFloat16{static_cast<uint16_t>(doubleToMiniFloat(static_cast<double>(v), MiniFloat::kBF16, false))};
    }
  } else if constexpr (std::is_same_v<To, E8M0>) {
    return E8M0{floatToE8M0(static_cast<float>(v), options.saturate, options.rounding)};
  } else if constexpr (requires { To::kFormat; }) {
    return To{static_cast<uint8_t>(doubleToMiniFloat(static_cast<double>(v), To::kFormat, options.saturate))};
  } else if constexpr (requires { To::kWidth; }) {
    int64_t wide = 0;
    if constexpr (std::is_floating_point_v<V>) {
      if (std::isfinite(v)) wide = truncateToInteger<int64_t>(v);  // NaN and inf give 0, as in ml_dtypes
    } else {
      wide = static_cast<int64_t>(v);
    }
    return To::fromInteger(wide);
  } else if constexpr (std::is_floating_point_v<V> && std::is_integral_v<To>) {
    return truncateToInteger<To>(v);
  } else {
    return static_cast<To>(v);
  }
}

template <typename From, typename To>
void castLoop(const std::byte* x_bytes, std::byte* y_bytes, int64_t n, const CastOptions& options) {
  const auto* x = reinterpret_cast<const From*>(x_bytes);
  auto* y = reinterpret_cast<To*>(y_bytes);
  if constexpr (std::is_integral_v<From> && std::is_same_v<To, float>) {
    // An integer to f32 is the plain C++ conversion whatever the width (what
    // narrow gives through the wide value), in one vector instruction per
    // few elements: the i32 -> f32 Cast after every dynamically quantized
    // MatMulInteger (T5, BERT int8 models) runs here.
    (void)options;
#if defined(__clang__)
    // Clang cannot vectorise every width (64-bit integers without AVX-512DQ)
    // and warns that the pragma failed; it still converts correctly.
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wpass-failed"
#endif
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i]);
#if defined(__clang__)
#pragma clang diagnostic pop
#endif
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = narrow<To>(widen(x[i]), options);
  }
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with the element type of `dtype`; false when there is none.
template <typename F>
bool withCastType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: f(TypeTag<float>{}); return true;
    case DType::kF64: f(TypeTag<double>{}); return true;
    case DType::kF16: f(TypeTag<Half>{}); return true;
    case DType::kBF16: f(TypeTag<BFloat16>{}); return true;
    case DType::kI8: f(TypeTag<int8_t>{}); return true;
    case DType::kU8: f(TypeTag<uint8_t>{}); return true;
    case DType::kI16: f(TypeTag<int16_t>{}); return true;
    case DType::kU16: f(TypeTag<uint16_t>{}); return true;
    case DType::kI32: f(TypeTag<int32_t>{}); return true;
    case DType::kU32: f(TypeTag<uint32_t>{}); return true;
    case DType::kI64: f(TypeTag<int64_t>{}); return true;
    case DType::kU64: f(TypeTag<uint64_t>{}); return true;
    case DType::kBool: f(TypeTag<Bool>{}); return true;
    case DType::kF8E4M3: f(TypeTag<Mini<MiniFloat::kF8E4M3FN>>{}); return true;
    case DType::kF8E4M3FNUZ: f(TypeTag<Mini<MiniFloat::kF8E4M3FNUZ>>{}); return true;
    case DType::kF8E5M2: f(TypeTag<Mini<MiniFloat::kF8E5M2>>{}); return true;
    case DType::kF8E5M2FNUZ: f(TypeTag<Mini<MiniFloat::kF8E5M2FNUZ>>{}); return true;
    case DType::kF4E2M1: f(TypeTag<Mini<MiniFloat::kF4E2M1>>{}); return true;
    case DType::kF8E8M0: f(TypeTag<E8M0>{}); return true;
    case DType::kI4: f(TypeTag<SubByteInt<4, true>>{}); return true;
    case DType::kU4: f(TypeTag<SubByteInt<4, false>>{}); return true;
    case DType::kI2: f(TypeTag<SubByteInt<2, true>>{}); return true;
    case DType::kU2: f(TypeTag<SubByteInt<2, false>>{}); return true;
    case DType::kUndefined: return false;
  }
  return false;
}

void floatsToHalves(const std::byte* x, std::byte* y, int64_t n, const CastOptions&) {
  vec::vectorKernels().floatsToHalves(reinterpret_cast<const float*>(x), reinterpret_cast<uint16_t*>(y), n);
}
void halvesToFloats(const std::byte* x, std::byte* y, int64_t n, const CastOptions&) {
  vec::vectorKernels().halvesToFloats(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<float*>(y), n);
}

struct CastState final : KernelState {
  using Loop = void (*)(const std::byte* x, std::byte* y, int64_t n, const CastOptions& options);
  Loop loop = nullptr;  // nullptr: the same type, a copy
  size_t input_size = 0;
  size_t element_size = 0;  // of the output
  CastOptions options;
};

std::string typeString(const TensorInfo& info) {
  return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString());
}

// Cast's and CastLike's prepare: input 0 converted to `to`.
std::unique_ptr<KernelState> prepareConversion(std::string_view op, const KernelSetup& setup, DType to) {
  const TensorInfo& x = setup.inputs[0];
  if (setup.outputs.size() != 1)
    throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  if (!x.isStatic()) throw UsageError(fmt::format("{}: needs static shapes, input 0 is {}", op, typeString(x)));
  const TensorInfo expected{to, x.shape};
  if (setup.outputs[0] != expected) {
    throw UsageError(
        fmt::format("{}: output is {} but the inputs give {}", op, typeString(setup.outputs[0]), typeString(expected)));
  }
  auto state = std::make_unique<CastState>();
  state->input_size = dtypeSize(x.dtype);
  state->element_size = dtypeSize(to);
  const int64_t saturate = setup.params.getInt("saturate", 1);
  if (saturate != 0 && saturate != 1)
    throw UsageError(fmt::format("{}: saturate is {}, expected 0 or 1", op, saturate));
  state->options.saturate = saturate == 1;
  const std::string round_mode = setup.params.getString("round_mode", "up");
  if (!e8m0RoundingFromName(round_mode, state->options.rounding)) {
    throw UsageError(fmt::format("{}: round_mode is '{}', expected 'up', 'down' or 'nearest'", op, round_mode));
  }
  if (to == x.dtype) return state;
  withCastType(x.dtype, [&](auto from) {
    withCastType(to, [&](auto target) {
      state->loop = &castLoop<typename decltype(from)::type, typename decltype(target)::type>;
    });
  });
  if (state->loop == nullptr) {
    throw UsageError(fmt::format("{}: no kernel from {} to {}", op, dtypeName(x.dtype), dtypeName(to)));
  }
  // f32 <-> f16, the casts around a float16 model's f32 compute: the vector
  // kernels' (the same bits as castLoop's, several times faster).
  if (x.dtype == DType::kF32 && to == DType::kF16) state->loop = &floatsToHalves;
  if (x.dtype == DType::kF16 && to == DType::kF32) state->loop = &halvesToFloats;
  return state;
}

std::unique_ptr<KernelState> prepareCast(const KernelSetup& setup) {
  if (setup.inputs.size() != 1) throw UsageError(fmt::format("Cast: expects 1 input, got {}", setup.inputs.size()));
  if (!setup.params.has("to")) throw UsageError("Cast: needs the attribute to");
  const int64_t code = setup.params.getInt("to", 0);
  if (code <= 0 || code > 255 || !isValidDType(static_cast<uint8_t>(code))) {
    throw UsageError(fmt::format("Cast: to = {} is not a known element type", code));
  }
  return prepareConversion("Cast", setup, static_cast<DType>(code));
}

// CastLike(x, like): Cast to like's type; like's data is not read.
std::unique_ptr<KernelState> prepareCastLike(const KernelSetup& setup) {
  if (setup.inputs.size() != 2) {
    throw UsageError(fmt::format("CastLike: expects 2 inputs, got {}", setup.inputs.size()));
  }
  return prepareConversion("CastLike", setup, setup.inputs[1].dtype);
}

void runCast(const KernelCall& call) {
  const auto& state = static_cast<const CastState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  const auto count = static_cast<int64_t>(call.outputs[0].numElements());
  if (state.loop == nullptr) {
    if (x != y && count != 0) std::memcpy(y, x, static_cast<size_t>(count) * state.element_size);
    return;
  }
  parallelForElements(count, [&](int64_t begin, int64_t end) {
    state.loop(x + static_cast<size_t>(begin) * state.input_size, y + static_cast<size_t>(begin) * state.element_size,
               end - begin, state.options);
  });
}

}  // namespace

void registerCastKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Cast", &prepareCast, &runCast});
  registry.add(KernelDef{"CastLike", &prepareCastLike, &runCast});
}

}  // namespace kiln
