#include "kernels/cpu/float_staging.h"

#include <cmath>
#include <cstring>

#include "core/float_formats.h"

namespace kiln::fp {

// The conversions themselves are float_formats.h's (shared with Cast, the
// quantization kernels and the MatMul/Conv loops).
float halfToFloat(uint16_t h) { return kiln::halfToFloat(h); }
uint16_t floatToHalf(float f) { return kiln::floatToHalf(f); }
float bfloat16ToFloat(uint16_t b) { return kiln::bfloat16ToFloat(b); }
uint16_t floatToBfloat16(float f) { return kiln::floatToBfloat16(f); }

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
