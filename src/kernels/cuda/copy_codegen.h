// Source code for a strided copy (Transpose, Slice, Expand: launch.h's
// StridedCopy) specialized to one step's shapes, which the runtime compiler
// (runtime_compiler.h) turns into machine code at load. The built-in
// kernel divides by sizes it reads at run time for every element; this one
// has them as constants, merges dimensions that move together, and moves
// four elements per thread where the innermost dimension is contiguous in
// both tensors (a Transpose that keeps the head dimension last, as
// attention's do).
//
// The source defines, with no includes,
//   extern "C" __global__ void kiln_copy_v1(CopyArgs)   one element per thread
//   extern "C" __global__ void kiln_copy_v4(CopyArgs)   four (vector_width 4)
// both launched with kCopyBlock threads per block over elements / width
// threads; CopyArgs is {const void* x; void* y;}, x the input's start (the
// copy's offset is in the code). The launch picks v1 when x plus the offset
// or y is not 16-byte aligned. Pure host code: generating needs no GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cuda/launch.h"

namespace kiln::cuda {

inline constexpr unsigned kCopyBlock = 256;

struct CopyArgs {
  const void* x = nullptr;
  void* y = nullptr;
};

struct CopySource {
  std::string text;
  int vector_width = 1;
};

// nullopt for 2^31 elements or more, or an element size other than 1, 2,
// 4 or 8 bytes (the built-in kernel serves those).
std::optional<CopySource> stridedCopySource(const StridedCopy& copy, uint64_t elements, int element_bytes);

}  // namespace kiln::cuda
