// The runtime compiler: CUDA C++ source (made at load, e.g. by
// elementwise_codegen.h) compiled with NVRTC for the GPU at hand and loaded
// as a CUDA library, whose kernels launch like nvcc's through
// cudaLaunchKernel (and so inside CUDA graphs).
//
// Compiled code is cached for the life of the process, keyed by the
// source and the GPU architecture: the same program in another step, or
// another executable, compiles once. Nothing is ever unloaded (a process
// holds one entry per distinct source; kilobytes each).
//
// Thread safety: compileKernels may be called from any thread.
#pragma once

#include <cuda_runtime.h>

#include <span>
#include <string>
#include <vector>

namespace kiln::cuda {

// The kernels `names` (extern "C") of `source`, compiled for GPUs of
// `compute_capability` (90 for sm_90), in the order asked. On failure
// (NVRTC refusing the source or the architecture, a load error) returns an
// empty vector and says why in *error, and logs a warning (the first
// failure of the process only); the caller falls back to kernels built in.
std::vector<cudaKernel_t> compileKernels(const std::string& source, std::span<const char* const> names,
                                         int compute_capability, std::string* error);

// The compiled image of `source` (machine code for sm_<capability>, or PTX
// where this NVRTC does not know the GPU), not loaded: needs no GPU. Empty
// with *error set on failure.
std::string compileImage(const std::string& source, int compute_capability, std::string* error);

// False when KILN_CUDA_JIT=0 asks for the built-in kernels only (to compare
// or to rule the runtime compiler out).
bool runtimeCompilerEnabled();

}  // namespace kiln::cuda
