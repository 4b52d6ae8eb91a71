// The program of a kiln.FusedElementwise node: a chain (or any acyclic
// group) of f32 elementwise operations that one step computes in a single
// pass over memory. One definition shared by the fusion pass that writes it
// (src/passes/elementwise_fusion.h), the op schema that checks it
// (src/ops/elementwise.cc) and the kernel that runs it
// (src/kernels/cpu/fused_elementwise.cc), which may not include each other.
//
// A program is a list of instructions. Each applies one ElementwiseOp to one
// or two operands and defines one result; the last instruction's result is
// the node's output. Operands name "slots", numbered like this:
//
//   0 .. I-1            the node's inputs (I = input count)
//   I .. I+M-1          the immediates: constant scalars (M = immediates.size())
//   I+M+j               the result of instruction j, which must come before
//                       the instruction that reads it
//
// Every input and result has the output's shape or broadcasts to it (numpy
// rules); an immediate is one element repeated.
//
// Node attributes (the ParamMap of the step):
//   ops         string   the instructions' op names joined by ',': "Sigmoid,Mul,Add"
//   operands    ints     two slots per instruction; the second is -1 for a unary op
//   alpha, beta floats   one each per instruction: the op's parameters (below)
//   immediates  floats   the immediates' values (absent when there are none)
//
// Op parameters: LeakyRelu and Elu read alpha; HardSigmoid alpha and beta;
// Clip its bounds (alpha = min, beta = max). The others ignore both.
// Square and PowHalf are Pow with a constant exponent of 2 and 0.5.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

enum class ElementwiseOp : uint8_t {
  // One operand.
  kRelu,
  kLeakyRelu,
  kElu,
  kSigmoid,
  kHardSigmoid,
  kHardSwish,
  kSoftplus,
  kTanh,
  kGelu,      // exact (erf) form
  kGeluTanh,  // tanh approximation
  kExp,
  kLog,
  kSqrt,
  kErf,
  kAbs,
  kNeg,
  kReciprocal,
  kFloor,
  kCeil,
  kClip,
  kSquare,   // Pow(x, 2)
  kPowHalf,  // Pow(x, 0.5): sqrt, except at -0 (+0) and -inf (+inf)
  // Two operands; Max and Min propagate NaN.
  kAdd,
  kSub,
  kMul,
  kDiv,
  kMax,
  kMin,
  kCount
};

inline constexpr std::array<std::string_view, static_cast<size_t>(ElementwiseOp::kCount)> kElementwiseOpNames = {
    "Relu",  "LeakyRelu", "Elu",  "Sigmoid", "HardSigmoid", "HardSwish",  "Softplus", "Tanh", "Gelu", "GeluTanh",
    "Exp",   "Log",       "Sqrt", "Erf",     "Abs",         "Neg",        "Reciprocal", "Floor", "Ceil", "Clip",
    "Square", "PowHalf",  "Add",  "Sub",     "Mul",         "Div",        "Max",      "Min"};

constexpr std::string_view elementwiseOpName(ElementwiseOp op) { return kElementwiseOpNames[static_cast<size_t>(op)]; }
constexpr bool isBinary(ElementwiseOp op) { return op >= ElementwiseOp::kAdd && op < ElementwiseOp::kCount; }

// The op named `name`, or nullopt for a name not in the list.
constexpr std::optional<ElementwiseOp> parseElementwiseOp(std::string_view name) {
  for (size_t i = 0; i < kElementwiseOpNames.size(); ++i) {
    if (kElementwiseOpNames[i] == name) return static_cast<ElementwiseOp>(i);
  }
  return std::nullopt;
}

inline constexpr std::string_view kProgramOpsAttribute = "ops";
inline constexpr std::string_view kProgramOperandsAttribute = "operands";
inline constexpr std::string_view kProgramAlphaAttribute = "alpha";
inline constexpr std::string_view kProgramBetaAttribute = "beta";
inline constexpr std::string_view kProgramImmediatesAttribute = "immediates";
// Optional, on the CPU target (passes/upsample_fusion.h): two factors per
// input, (fh, fw). An input with factors other than (1, 1) is an NHWC tensor
// [N, H / fh, W / fw, C] that the program reads nearest-upsampled to the
// output's [N, H, W, C] (element (n, y, x, c) from (n, y / fh, x / fw, c)).
inline constexpr std::string_view kProgramUpsampleAttribute = "upsample";
// The CPU kernel gathers each upsampled input into a stack buffer of its
// own, and has room for this many.
inline constexpr size_t kMaxUpsampledInputs = 4;
// Optional, on the CPU target (passes/elementwise_fusion.h, quantized I/O):
// 8-bit data read and written without a step of their own.
//   dequantize  floats  two per input, (scale, zero point): an input with a
//                       scale other than 0 is u8 or i8 data, which the program
//                       reads as (x - zero point) * scale (DequantizeLinear per
//                       tensor); 0 marks an f32 input
//   quantize    floats  (scale, zero point): the output is u8 or i8 (the type
//                       in quantize_type, an ONNX TensorProto code), written
//                       as saturate(round(v / scale) + zero point)
//                       (QuantizeLinear per tensor)
// Not together with upsample.
inline constexpr std::string_view kProgramDequantizeAttribute = "dequantize";
inline constexpr std::string_view kProgramQuantizeAttribute = "quantize";
inline constexpr std::string_view kProgramQuantizeTypeAttribute = "quantize_type";
// The CPU kernel converts each 8-bit input's block into a stack buffer of its
// own, and has room for this many.
inline constexpr size_t kMaxDequantizedInputs = 4;
inline constexpr int64_t kNoOperand = -1;

// The kernel keeps each live result in a block buffer of its own (a
// "register") and has room for this many; the pass fuses no group whose
// program needs more.
inline constexpr uint32_t kMaxProgramRegisters = 32;

// The cuda kernel carries a program in launch parameters of fixed size
// (kernels/cuda/elementwise_launch.h): for the cuda target the fusion pass
// keeps groups within these.
inline constexpr size_t kCudaMaxProgramInputs = 8;
inline constexpr size_t kCudaMaxProgramOps = 48;
inline constexpr size_t kCudaMaxProgramImmediates = 16;

struct ElementwiseProgram {
  size_t input_count = 0;
  std::vector<ElementwiseOp> ops;
  std::vector<int64_t> operands;  // 2 per op
  std::vector<float> alpha;       // 1 per op
  std::vector<float> beta;        // 1 per op
  std::vector<float> immediates;

  int64_t immediateSlot(size_t immediate) const { return static_cast<int64_t>(input_count + immediate); }
  int64_t resultSlot(size_t instruction) const {
    return static_cast<int64_t>(input_count + immediates.size() + instruction);
  }
};

// "Sigmoid,Mul,Add" for the ops attribute, and back. parse returns nullopt
// when a name is not an ElementwiseOp.
std::string joinElementwiseOps(const std::vector<ElementwiseOp>& ops);
std::optional<std::vector<ElementwiseOp>> parseElementwiseOps(std::string_view text);

// The program of a kiln.FusedElementwise step with `input_count` inputs,
// from its attributes (above). Throws UsageError naming what is wrong when
// the program is not well formed.
class ParamMap;
ElementwiseProgram readElementwiseProgram(const ParamMap& params, size_t input_count);

// What is wrong with `program`, or "" when it is well formed: at least one
// instruction, list lengths as above, every operand a slot defined before
// it is read (-1 exactly where an op has no second operand).
std::string checkElementwiseProgram(const ElementwiseProgram& program);

// Which register holds each instruction's result while it is live (from the
// instruction to the last one that reads it). A result may take the register
// of an operand that the instruction reads for the last time (the vector
// kernels compute in place). The last instruction writes the output, not a
// register: its entry is kOutputRegister. `count` is the registers needed.
// Requires a well-formed program.
inline constexpr uint32_t kOutputRegister = UINT32_MAX;
struct RegisterAssignment {
  std::vector<uint32_t> result_register;  // 1 per op
  uint32_t count = 0;
};
RegisterAssignment assignRegisters(const ElementwiseProgram& program);

}  // namespace kiln
