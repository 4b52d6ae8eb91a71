// The device side of cuda elementwise steps (elementwise.cc): the program
// and indexing a launch carries as kernel parameters, and the launch.
// Plain structs, shared by the host code (.cc) and the kernel (.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/elementwise_program.h"
#include "kernels/cuda/launch.h"

namespace kiln::cuda {

inline constexpr int kMaxElementwiseInputs = static_cast<int>(kCudaMaxProgramInputs);
inline constexpr int kMaxElementwiseDims = 8;
inline constexpr int kMaxElementwiseOps = static_cast<int>(kCudaMaxProgramOps);
inline constexpr int kMaxElementwiseImmediates = static_cast<int>(kCudaMaxProgramImmediates);

// A program of core/elementwise_program.h in fixed arrays; op holds
// ElementwiseOp values, a and b slot numbers (b -1 for unary ops).
struct DeviceProgram {
  int ops = 0;
  int inputs = 0;
  int immediates = 0;
  uint8_t op[kMaxElementwiseOps] = {};
  int8_t a[kMaxElementwiseOps] = {};
  int8_t b[kMaxElementwiseOps] = {};
  float alpha[kMaxElementwiseOps] = {};
  float beta[kMaxElementwiseOps] = {};
  float immediate[kMaxElementwiseImmediates] = {};
};

// How each input's element is found from the output index, and how each
// tensor stores its floats (FloatStorage: the program computes in f32; a
// 16-bit operand converts as it loads and the result rounds, to nearest
// even, as it stores).
struct Indexing {
  bool direct = true;  // every input is full-size (same element order) or a single element
  bool scalar[kMaxElementwiseInputs] = {};
  int rank = 0;
  int64_t out_dims[kMaxElementwiseDims] = {};
  int64_t strides[kMaxElementwiseInputs][kMaxElementwiseDims] = {};  // 0 along broadcast dimensions
  FloatStorage storage[kMaxElementwiseInputs] = {};
  FloatStorage storage_out = FloatStorage::kF32;
};

// Typed as f32; a 16-bit operand's pointer (Indexing::storage) is cast back.
struct Pointers {
  const float* in[kMaxElementwiseInputs] = {};
  float* out = nullptr;
};

// Computes the n output elements on `stream`.
void launchElementwise(const DeviceProgram& program, const Indexing& indexing, const Pointers& pointers, uint64_t n,
                       cudaStream_t stream);

}  // namespace kiln::cuda
