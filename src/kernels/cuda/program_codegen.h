// Pieces of generated CUDA source shared by the kernels the runtime
// compiler specializes (elementwise_codegen.h, depthwise_codegen.h): an
// elementwise program's instructions as straight-line statements over
// named values, and the functions they call, one per op, whose bodies are
// elementwise_ops.inc's expressions -- the same text the interpreter
// kernels compile. Pure host code.
#pragma once

#include <functional>
#include <string>

#include "kernels/cuda/elementwise_launch.h"

namespace kiln::cuda {

// An exact float literal of CUDA source (NaN and infinities included).
std::string floatLiteral(float value);

// The prelude every generated source starts with: a comment naming
// `what`, the NAN macro elementwise_ops.inc uses, and a device function
// kiln_<Op>(x, y, alpha, beta) for each op `program` uses.
void appendPrelude(std::string& out, const std::string& what, const DeviceProgram& program);

// Defines kiln_h2f(unsigned) -> float and kiln_f2h(float) -> unsigned
// short, f16 bits (the low 16 bits of the argument) to f32 and back, and
// kiln_b2f / kiln_f2b the same for bf16; rounding to nearest even, NaN
// staying NaN. In PTX and bit operations: generated sources include no
// headers.
void appendHalfConversions(std::string& out);

// The names of those functions for a 16-bit `storage`: the one that reads
// an element as a float, and the one that rounds a float into an element.
const char* loadConversion(FloatStorage storage);
const char* storeConversion(FloatStorage storage);

// Appends `program` as statements "const float <prefix>_<j> = ...;" whose
// operands are input(k) for input slots and literals for immediates;
// returns the variable holding the last instruction's result.
// program.ops must be at least 1, and every op below ElementwiseOp::kCount.
std::string appendInstructions(std::string& out, const DeviceProgram& program, const std::string& prefix,
                               const std::function<std::string(int)>& input);

// True when every op of `program` is one appendPrelude knows.
bool opsAreKnown(const DeviceProgram& program);

}  // namespace kiln::cuda
