#include "kernels/cpu/float_staging.h"

#include <cmath>
#include <cstring>

namespace kiln::fp {

float halfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu;
  const uint32_t mantissa = h & 0x3FFu;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf, NaN
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    const float value = static_cast<float>(mantissa) * 5.9604644775390625e-8f;  // subnormal: mantissa * 2^-24
    std::memcpy(&bits, &value, sizeof bits);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

uint16_t floatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u));
  if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds past 65504
  if (abs < 0x38800000u) {  // subnormal or zero: round abs / 2^-24 to an integer
    float a;
    std::memcpy(&a, &abs, sizeof a);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f)));
  }
  const uint32_t odd = (abs >> 13) & 1u;
  return static_cast<uint16_t>(sign | static_cast<uint16_t>((abs + 0xFFFu + odd - 0x38000000u) >> 13));
}

float bfloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

uint16_t floatToBfloat16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet NaN
  const uint32_t odd = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7FFFu + odd) >> 16);
}

bool isNarrowFloat(DType dtype) { return dtype == DType::kF16 || dtype == DType::kBF16; }
bool isComputedInF32(DType dtype) { return dtype == DType::kF32 || isNarrowFloat(dtype); }

void toFloat(DType dtype, const std::byte* in, float* out, size_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  const bool half = dtype == DType::kF16;
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, in + i * 2, 2);
    out[i] = half ? halfToFloat(bits) : bfloat16ToFloat(bits);
  }
}

void fromFloat(DType dtype, const float* in, std::byte* out, size_t n) {
  if (dtype == DType::kF32) {
    std::memcpy(out, in, n * sizeof(float));
    return;
  }
  const bool half = dtype == DType::kF16;
  for (size_t i = 0; i < n; ++i) {
    const uint16_t bits = half ? floatToHalf(in[i]) : floatToBfloat16(in[i]);
    std::memcpy(out + i * 2, &bits, 2);
  }
}

namespace {

size_t countOf(const TensorInfo& info) {
  size_t n = 1;
  for (int64_t d : info.shape) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

void FloatStaging::plan(const KernelSetup& setup) {
  inputs_.assign(setup.inputs.size(), {});
  outputs_.assign(setup.outputs.size(), {});
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    if (isNarrowFloat(setup.inputs[i].dtype)) inputs_[i].resize(countOf(setup.inputs[i]));
  }
  for (size_t i = 0; i < setup.outputs.size(); ++i) {
    if (isNarrowFloat(setup.outputs[i].dtype)) outputs_[i].resize(countOf(setup.outputs[i]));
  }
}

const float* FloatStaging::input(const KernelCall& call, size_t index) const {
  if (index >= call.input_count || call.inputs[index].data == nullptr) return nullptr;
  const TensorView& view = call.inputs[index];
  if (view.dtype == DType::kF32) return view.as<const float>();
  if (!isNarrowFloat(view.dtype) || index >= inputs_.size()) return nullptr;
  std::vector<float>& scratch = inputs_[index];
  toFloat(view.dtype, view.data, scratch.data(), scratch.size());
  return scratch.data();
}

float* FloatStaging::output(const KernelCall& call, size_t index) const {
  if (index >= call.output_count || call.outputs[index].data == nullptr) return nullptr;
  const TensorView& view = call.outputs[index];
  if (view.dtype == DType::kF32) return view.as<float>();
  if (!isNarrowFloat(view.dtype) || index >= outputs_.size()) return nullptr;
  return outputs_[index].data();
}

void FloatStaging::finish(const KernelCall& call) const {
  for (size_t i = 0; i < outputs_.size() && i < call.output_count; ++i) {
    const TensorView& view = call.outputs[i];
    if (view.data == nullptr || !isNarrowFloat(view.dtype)) continue;
    fromFloat(view.dtype, outputs_[i].data(), view.data, outputs_[i].size());
  }
}

}  // namespace kiln::fp
