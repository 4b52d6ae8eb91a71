// Post-ops of the fused steps on cuda (kiln.FusedMatMul and kiln.FusedGemm's
// `activation`, kiln.FusedConv's `post_ops` list), as one elementwise program
// (elementwise_launch.h) that runs over the step's output in place, for
// what the library call could not fuse itself.
#pragma once

#include <optional>
#include <string>

#include "core/elementwise_program.h"
#include "core/fused_activation.h"
#include "core/param_map.h"
#include "kernels/cuda/elementwise_launch.h"
#include "kernels/kernel.h"

namespace kiln::cuda {

// Appends `activation` with its parameters to `program`, applied to the
// result of the last instruction (or to input 0 when there is none yet).
void appendActivation(ElementwiseProgram& program, FusedActivation activation, float alpha, float beta);

// A FusedMatMul/FusedGemm step's `activation` attribute (nullopt: none).
// Throws KernelUnsupported for a name it does not know.
std::optional<FusedActivation> readActivation(std::string_view op, const ParamMap& params, float* alpha, float* beta);

// kiln.FusedConv's post_ops ("Add,Relu": see passes/conv_fusion.h) as a
// program over input 0 (the convolution's output), then with `with_bias`
// input 1, a bias added first, then, when the list has an Add, the
// residual. nullopt for an empty list without a bias.
std::optional<ElementwiseProgram> postOpProgram(std::string_view op, const ParamMap& params, bool with_bias = false);

// The indexing of a post-ops program over an NCHW output [N, C, pixels]
// (postOpProgram's inputs: y and the residual full-size, the bias, when
// there is one, per channel), every tensor stored as `storage`.
Indexing perChannelIndexing(int64_t batch, int64_t channels, int64_t pixels, bool has_bias, bool has_residual,
                            FloatStorage storage = FloatStorage::kF32);

// How an elementwise kernel stores `dtype` (f32, f16, bf16); nullopt for
// any other type.
std::optional<FloatStorage> floatStorageOf(DType dtype);

// `program` in the fixed arrays a launch carries; KernelUnsupported when it
// does not fit.
DeviceProgram toDeviceProgram(std::string_view op, const ElementwiseProgram& program);

}  // namespace kiln::cuda
