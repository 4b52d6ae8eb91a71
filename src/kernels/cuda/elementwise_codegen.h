// Source code for an elementwise kernel specialized to one program and one
// indexing (elementwise_launch.h), which the runtime compiler
// (runtime_compiler.h) turns into machine code at load.
//
// Why: the interpreter kernel (elementwise_kernels.cu) walks the program's
// instructions per element through slots in local memory and divides by the
// dimension sizes it reads at run time; a kernel whose instructions are
// straight-line code over registers, whose sizes and strides are constants
// and which moves four elements at a time runs at memory speed instead.
//
// The source is plain CUDA C++ with no includes. It defines
//   extern "C" __global__ void kiln_elementwise_v1(Pointers)
// (one element per thread) and, where vector_width is 4, also
//   extern "C" __global__ void kiln_elementwise_v4(Pointers)
// (four consecutive elements per thread, 16-byte loads and stores; the
// launch picks v1 when a pointer is not 16-byte aligned). Either is
// launched with kElementwiseBlock threads per block over `threads` threads.
// Each op computes what elementwise_ops.inc says, as the interpreter does.
// Pure host code: generating needs no GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "kernels/cuda/elementwise_launch.h"

namespace kiln::cuda {

inline constexpr unsigned kElementwiseBlock = 256;

struct ElementwiseSource {
  std::string text;
  int vector_width = 1;  // 4: kiln_elementwise_v4 is defined too
};

// The kernels for `elements` outputs of `program` over `indexing`; nullopt
// where they would need 64-bit indices (2^31 elements or more), which the
// interpreter kernel serves.
std::optional<ElementwiseSource> elementwiseSource(const DeviceProgram& program, const Indexing& indexing,
                                                   uint64_t elements);

}  // namespace kiln::cuda
