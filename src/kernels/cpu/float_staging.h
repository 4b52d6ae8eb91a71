// f16 and bf16 tensors for kernels that compute in f32.
//
// The attention, normalisation and recurrent kernels are written once, over
// f32 arrays. For f16 and bf16 they convert each such input into an f32
// scratch array, compute into f32 scratch outputs and convert those back
// (round to nearest even), as the ONNX reference does when it casts around
// its f32 math. The conversions are scalar: these dtypes are rare on CPUs and
// the conformance tests use them at small sizes.
//
// Thread safety: the scratch arrays live in the kernel's state (sized once at
// prepare, so run does not allocate) and are written by run. Two concurrent
// runs of one prepared step would share them; the executor runs one call at
// a time per executor, so that does not happen. Kernels say so where they
// use this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/kernel.h"

namespace kiln::fp {

float halfToFloat(uint16_t bits);
uint16_t floatToHalf(float value);  // nearest even; overflow to inf
float bfloat16ToFloat(uint16_t bits);
uint16_t floatToBfloat16(float value);  // nearest even; NaN stays NaN

// True for the dtypes FloatStaging converts: f16 and bf16.
bool isNarrowFloat(DType dtype);
// True for f32, f16 and bf16.
bool isComputedInF32(DType dtype);

// n elements of `dtype` (f32, f16 or bf16) to f32, and back.
void toFloat(DType dtype, const std::byte* in, float* out, size_t n);
void fromFloat(DType dtype, const float* in, std::byte* out, size_t n);

// The f32 views of a call's floating-point tensors.
class FloatStaging {
 public:
  // At prepare: every present f16/bf16 input and output gets its scratch.
  void plan(const KernelSetup& setup);

  // At run. The f32 data of input `index`: the input itself when it is f32,
  // its conversion when it is f16/bf16 (converted by this call), nullptr
  // when it is omitted or not floating point.
  const float* input(const KernelCall& call, size_t index) const;
  // Where the kernel writes output `index` in f32 (nullptr when omitted).
  float* output(const KernelCall& call, size_t index) const;
  // Converts the staged outputs into the call's f16/bf16 outputs.
  void finish(const KernelCall& call) const;

 private:
  mutable std::vector<std::vector<float>> inputs_;  // empty where not staged
  mutable std::vector<std::vector<float>> outputs_;
};

}  // namespace kiln::fp
