// kiln.FusedElementwise: a group of f32 elementwise ops (the program of
// core/elementwise_program.h, made by passes/elementwise_fusion.h) computed in
// one pass over memory.
//
// Unfused, each op of a chain reads its operands from memory and writes its
// whole result back, and each is a step of its own. Here the output is
// computed a block of a few hundred elements at a time: every instruction of
// the program runs on the block, its result staying in a small buffer (a
// "register", on the stack: L1-resident) for the instructions that read it,
// and only the last one stores into the output. Inputs are read where they
// lie, by the same vector kernels (vector_kernels.h) that the unfused ops
// call, so a fused result is bit for bit the unfused one.
//
// Blocks follow the rows of a BroadcastPlan (broadcast.h): within a row every
// input is a contiguous array or one repeated element (a scalar: the vector
// kernels' kScalarA/kScalarB forms), and immediates are scalars too. An
// input the program reads nearest-upsampled (kProgramUpsampleAttribute: an
// FPN's Resize fused away, passes/upsample_fusion.h) is planned as if it had
// the output's shape, and each block of it is gathered from the small tensor
// into a buffer on the stack. An 8-bit input (kProgramDequantizeAttribute: a
// DequantizeLinear fused away) is dequantized a block at a time into a
// buffer on the stack; an 8-bit output (kProgramQuantizeAttribute) is the
// last instruction's block quantized on its way out.
//
// prepare resolves the program once: a vector-kernel function, operand
// sources and a register per instruction; run only loops. run allocates
// nothing: the registers are one stack array per thread, shared out by
// prepare's block length. Large outputs split into ranges of elements, one
// per OpenMP thread (parallel.h). The output may be an input of the output's
// shape (in place): each block reads all its operands before its last
// instruction stores it.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/elementwise_program.h"
#include "kernels/cpu/broadcast.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr const char* kOp = "kiln.FusedElementwise";

// The registers share one stack array of this many floats (16 KiB, well
// inside L1 with the inputs' blocks); a block is at most kMaxBlock elements,
// a multiple of 16 (one AVX-512 vector) so that every register is aligned.
constexpr int64_t kScratchFloats = 4096;
constexpr int64_t kMaxBlock = 512;
static_assert(kScratchFloats / kMaxProgramRegisters >= 16, "a register must hold at least one vector");

// Where an operand comes from, resolved at prepare.
struct Source {
  enum Kind : uint8_t { kInput, kImmediate, kRegister } kind = kInput;
  uint32_t index = 0;  // input, immediate or register number
};

struct Instruction {
  // Unary ops call `unary`; binary ones (and Square, PowHalf: Pow with a
  // constant exponent, which the vector kernels have as binary maps that
  // ignore b) call binary[operands form].
  vec::UnaryFn unary = nullptr;
  std::array<vec::BinaryFn, static_cast<size_t>(vec::Operands::kCount)> binary{};
  Source a;
  Source b;
  float alpha = 0;
  float beta = 0;
  uint32_t result = kOutputRegister;  // a register, or the output for the last instruction
};

// An input read nearest-upsampled: [N, H / fh, W / fw, C] for the output's
// [N, H, W, C].
struct Upsample {
  int64_t fh = 1, fw = 1;
  int64_t out_h = 0, out_w = 0, channels = 0;
  bool active() const { return fh != 1 || fw != 1; }
};

// DequantizeLinear or QuantizeLinear per tensor, folded into the step.
struct Quantization {
  bool active = false;
  bool is_signed = false;  // i8 (else u8)
  float scale = 1;
  float zero = 0;
};

struct FusedElementwiseState final : KernelState {
  std::vector<Instruction> program;
  std::vector<Quantization> dequantize;  // per input
  std::vector<int> dequantize_slot;      // per input: its conversion buffer, or -1
  Quantization quantize;                 // of the output
  std::vector<float> immediates;
  BroadcastPlan plan;  // of the output over the inputs
  int64_t elements = 0;
  int64_t block = 0;  // elements per register
  // Per input: empty, or the constant input repeated along the output's
  // next-to-last axis (see tileShortRows), read instead of the input.
  std::vector<std::vector<float>> tiled;
  // Short rows that a per-image input repeats (see runRangeOfRows): whole
  // rows per block, 0 when blocks follow rows.
  int64_t rows_per_block = 0;
  std::vector<int> tile_slot;  // per input: its tile in runRangeOfRows, or -1
  std::vector<Upsample> upsample;    // per input
  std::vector<int> upsample_slot;    // per input: its gather buffer, or -1
  // A program of one 8-bit input of the output's shape and an 8-bit output
  // is a function of 256 values: `table` holds its results (see tabulate),
  // and run looks each byte up instead.
  bool lookup = false;
  std::array<uint8_t, 256> table{};
};

// --------------------------------------------------------------- prepare

// The vector kernel that computes `op`: a unary map, or else a binary one.
struct VectorOp {
  std::optional<vec::Unary> unary;
  vec::Binary binary = vec::Binary::kAdd;
};

VectorOp vectorOp(ElementwiseOp op) {
  using E = ElementwiseOp;
  using U = vec::Unary;
  using B = vec::Binary;
  switch (op) {
    case E::kRelu: return {U::kRelu};
    case E::kLeakyRelu: return {U::kLeakyRelu};
    case E::kElu: return {U::kElu};
    case E::kSigmoid: return {U::kSigmoid};
    case E::kHardSigmoid: return {U::kHardSigmoid};
    case E::kHardSwish: return {U::kHardSwish};
    case E::kSoftplus: return {U::kSoftplus};
    case E::kTanh: return {U::kTanh};
    case E::kGelu: return {U::kGelu};
    case E::kGeluTanh: return {U::kGeluTanh};
    case E::kExp: return {U::kExp};
    case E::kLog: return {U::kLog};
    case E::kSqrt: return {U::kSqrt};
    case E::kErf: return {U::kErf};
    case E::kAbs: return {U::kAbs};
    case E::kNeg: return {U::kNeg};
    case E::kReciprocal: return {U::kReciprocal};
    case E::kFloor: return {U::kFloor};
    case E::kCeil: return {U::kCeil};
    case E::kClip: return {U::kClip};
    case E::kSquare: return {std::nullopt, B::kSquare};
    case E::kPowHalf: return {std::nullopt, B::kSqrt};
    case E::kAdd: return {std::nullopt, B::kAdd};
    case E::kSub: return {std::nullopt, B::kSub};
    case E::kMul: return {std::nullopt, B::kMul};
    case E::kDiv: return {std::nullopt, B::kDiv};
    case E::kMax: return {std::nullopt, B::kMax};
    case E::kMin: return {std::nullopt, B::kMin};
    case E::kCount: break;
  }
  return {};  // not reached: readElementwiseProgram admits only the ops above
}

// Per input, the factors of kProgramUpsampleAttribute ((1, 1) without it),
// checked against the shapes: an upsampled input must be 4-D and its shape
// times the factors the output's.
std::vector<Upsample> readUpsampling(const KernelSetup& setup) {
  std::vector<Upsample> upsample(setup.inputs.size());
  const std::string key(kProgramUpsampleAttribute);
  if (!setup.params.has(key)) return upsample;
  const std::vector<int64_t> factors = setup.params.getInts(key, {});
  if (factors.size() != 2 * setup.inputs.size()) {
    throw UsageError(fmt::format("{}: upsample has {} factors for {} inputs; it takes two per input", kOp,
                                 factors.size(), setup.inputs.size()));
  }
  size_t count = 0;
  const std::vector<int64_t>& out = setup.outputs.empty() ? std::vector<int64_t>{} : setup.outputs[0].shape;
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    Upsample& u = upsample[i];
    u.fh = factors[2 * i];
    u.fw = factors[2 * i + 1];
    if (!u.active()) continue;
    const std::vector<int64_t>& in = setup.inputs[i].shape;
    if (u.fh < 1 || u.fw < 1 || in.size() != 4 || out.size() != 4 || in[0] != out[0] || in[3] != out[3] ||
        in[1] * u.fh != out[1] || in[2] * u.fw != out[2]) {
      throw UsageError(fmt::format("{}: input {} {} upsampled by {} x {} is not the output's shape {}", kOp, i,
                                   setup.inputs[i].shapeString(), u.fh, u.fw, setup.outputs[0].shapeString()));
    }
    if (++count > kMaxUpsampledInputs) {
      throw UsageError(fmt::format("{}: more than {} upsampled inputs", kOp, kMaxUpsampledInputs));
    }
    u.out_h = out[1];
    u.out_w = out[2];
    u.channels = out[3];
  }
  return upsample;
}

// The inputs as the plan sees them: an upsampled one with the output's shape.
std::vector<TensorInfo> plannedInputs(const KernelSetup& setup, const std::vector<Upsample>& upsample) {
  std::vector<TensorInfo> inputs(setup.inputs.begin(), setup.inputs.end());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (upsample[i].active()) inputs[i].shape = setup.outputs[0].shape;
  }
  return inputs;
}

// The 8-bit inputs and output of kProgramDequantizeAttribute and
// kProgramQuantizeAttribute, checked against the types.
void readQuantization(const KernelSetup& setup, FusedElementwiseState& state) {
  const size_t inputs = setup.inputs.size();
  state.dequantize.assign(inputs, {});
  state.dequantize_slot.assign(inputs, -1);
  const std::string dequantize_key(kProgramDequantizeAttribute);
  if (setup.params.has(dequantize_key)) {
    const std::vector<double> values = setup.params.getFloats(dequantize_key, {});
    if (values.size() != 2 * inputs) {
      throw UsageError(fmt::format("{}: dequantize has {} values for {} inputs; it takes two per input", kOp,
                                   values.size(), inputs));
    }
    if (setup.params.has(std::string(kProgramUpsampleAttribute))) {
      throw UsageError(fmt::format("{}: upsample and dequantize do not go together", kOp));
    }
    int slots = 0;
    for (size_t i = 0; i < inputs; ++i) {
      if (values[2 * i] == 0) continue;
      if (setup.inputs[i].dtype != DType::kU8 && setup.inputs[i].dtype != DType::kI8) {
        throw UsageError(fmt::format("{}: input {} is dequantized but is {}, not u8 or i8", kOp, i,
                                     dtypeName(setup.inputs[i].dtype)));
      }
      if (++slots > static_cast<int>(kMaxDequantizedInputs)) {
        throw UsageError(fmt::format("{}: more than {} dequantized inputs", kOp, kMaxDequantizedInputs));
      }
      state.dequantize[i] = {true, setup.inputs[i].dtype == DType::kI8, static_cast<float>(values[2 * i]),
                             static_cast<float>(values[2 * i + 1])};
      state.dequantize_slot[i] = slots - 1;
    }
  }
  const std::string quantize_key(kProgramQuantizeAttribute);
  if (setup.params.has(quantize_key)) {
    const std::vector<double> values = setup.params.getFloats(quantize_key, {});
    const DType type = setup.outputs.empty() ? DType::kUndefined : setup.outputs[0].dtype;
    if (values.size() != 2 || !(values[0] > 0) || (type != DType::kU8 && type != DType::kI8)) {
      throw UsageError(fmt::format("{}: quantize takes (scale > 0, zero point) and a u8 or i8 output", kOp));
    }
    state.quantize = {true, type == DType::kI8, static_cast<float>(values[0]), static_cast<float>(values[1])};
  }
}

std::vector<int64_t> checkTypes(const KernelSetup& setup, const std::vector<TensorInfo>& planned,
                                const FusedElementwiseState& state) {
  if (setup.inputs.empty()) throw UsageError(fmt::format("{}: expects at least 1 input, got 0", kOp));
  if (setup.outputs.size() != 1) {
    throw UsageError(fmt::format("{}: expects 1 output, got {}", kOp, setup.outputs.size()));
  }
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& input = setup.inputs[i];
    if ((input.dtype != DType::kF32 && !state.dequantize[i].active) || !input.isStatic()) {
      throw UsageError(fmt::format("{}: input {} is {}{}; the kernel takes f32 inputs of static shape", kOp, i,
                                   dtypeName(input.dtype), input.shapeString()));
    }
  }
  const std::vector<int64_t> out = broadcastShapes(kOp, planned);
  const TensorInfo expected{state.quantize.active ? setup.outputs[0].dtype : DType::kF32, out};
  if (setup.outputs[0] != expected) {
    throw UsageError(fmt::format("{}: output is {}{} but the inputs give {}{}", kOp,
                                 dtypeName(setup.outputs[0].dtype), setup.outputs[0].shapeString(),
                                 dtypeName(expected.dtype), expected.shapeString()));
  }
  return out;
}

// A per-channel constant of a channels-last tensor ([1, 1, 1, C] against
// [N, H, W, C]) makes every row of the broadcast plan C elements long, and
// each instruction then runs on C elements at a time (24 in PP-OCR's
// detector: 7 ms for a 320x320 map). Such a constant, when C is short, is
// stored repeated along the next-to-last axis ([1, 1, W, C]), so that rows
// are W * C long. Returns the shapes the plan sees.
std::vector<std::vector<int64_t>> tileShortRows(const KernelSetup& setup, const std::vector<TensorInfo>& planned,
                                                const std::vector<int64_t>& out, FusedElementwiseState& state) {
  constexpr int64_t kShortRow = 64;
  std::vector<std::vector<int64_t>> shapes;
  state.tiled.resize(setup.inputs.size());
  const size_t rank = out.size();
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    std::vector<int64_t> shape = planned[i].shape;
    const std::byte* constant = i < setup.constants.size() ? setup.constants[i] : nullptr;
    shape.insert(shape.begin(), rank - std::min(rank, shape.size()), 1);  // right-aligned, as broadcasting reads it
    const bool short_rows = rank >= 2 && out[rank - 1] > 1 && out[rank - 1] < kShortRow && out[rank - 2] > 1;
    if (constant != nullptr && setup.inputs[i].dtype == DType::kF32 && short_rows && shape.size() == rank && shape[rank - 1] == out[rank - 1] &&
        shape[rank - 2] == 1 && setup.inputs[i].numElements() == static_cast<uint64_t>(out[rank - 1])) {
      const auto* values = reinterpret_cast<const float*>(constant);
      std::vector<float>& tiled = state.tiled[i];
      for (int64_t w = 0; w < out[rank - 2]; ++w) tiled.insert(tiled.end(), values, values + out[rank - 1]);
      shape[rank - 2] = out[rank - 2];
    } else {
      shape = planned[i].shape;
    }
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

// The rows per block of runRangeOfRows when the plan suits it: short rows
// (a channels-last tensor's channels) where every input either runs on
// contiguously from row to row, repeats one row (a squeeze-excite block's
// per-image scale, [N, 1, 1, C]: not a constant, so tileShortRows cannot
// repeat it ahead), or is one element for both. At most kMaxRepeatedRows
// inputs repeat their row. 0 otherwise. Rows up to 256 (two or more per
// block): an 8-bit squeeze-excite scale of 88 channels took 49 us for a
// 3x96 map a row at a time, 2x less in blocks of five rows.
constexpr size_t kMaxRepeatedRows = 4;

// Sets state.rows_per_block and state.tile_slot.
void planRowsPerBlock(FusedElementwiseState& state) {
  constexpr int64_t kShortRow = 256;
  const BroadcastPlan& plan = state.plan;
  const int64_t n = plan.rowLength();
  state.rows_per_block = 0;
  state.tile_slot.assign(plan.strides.size(), -1);
  if (plan.rank < 2 || n <= 0 || n >= kShortRow || state.block / n < 2) return;
  const uint32_t d = plan.rank - 2;
  int repeated = 0;
  std::vector<int> slots(plan.strides.size(), -1);
  for (size_t i = 0; i < plan.strides.size(); ++i) {
    const int64_t inner = plan.strides[i][plan.rank - 1];
    const int64_t outer = plan.strides[i][d];
    if (inner == 0 && outer == 0) continue;
    if (inner != 1 || (outer != 0 && outer != n)) return;
    if (outer == 0) slots[i] = repeated++;
  }
  if (repeated == 0 || repeated > static_cast<int>(kMaxRepeatedRows)) return;
  state.rows_per_block = state.block / n;
  state.tile_slot = std::move(slots);
}

std::array<uint8_t, 256> tabulate(const FusedElementwiseState& state);

std::unique_ptr<KernelState> prepareFusedElementwise(const KernelSetup& setup) {
  auto state = std::make_unique<FusedElementwiseState>();
  readQuantization(setup, *state);
  std::vector<Upsample> upsample = readUpsampling(setup);
  const std::vector<TensorInfo> planned = plannedInputs(setup, upsample);
  const std::vector<int64_t> out = checkTypes(setup, planned, *state);
  const ElementwiseProgram program = readElementwiseProgram(setup.params, setup.inputs.size());
  const RegisterAssignment registers = assignRegisters(program);
  if (registers.count > kMaxProgramRegisters) {
    throw UsageError(fmt::format("{}: the program needs {} registers; the kernel has {}", kOp, registers.count,
                                 kMaxProgramRegisters));
  }

  state->immediates = program.immediates;
  state->plan = planBroadcast(out, tileShortRows(setup, planned, out, *state));
  state->elements = static_cast<int64_t>(setup.outputs[0].numElements());
  // Registers split the scratch array evenly, in whole vectors.
  state->block = std::min(kMaxBlock, kScratchFloats / std::max<int64_t>(registers.count, 1) / 16 * 16);
  state->upsample = std::move(upsample);
  state->upsample_slot.assign(setup.inputs.size(), -1);
  int slots = 0;
  for (size_t i = 0; i < state->upsample.size(); ++i) {
    if (state->upsample[i].active()) state->upsample_slot[i] = slots++;
  }
  // Gathered blocks follow the plain rows (8-bit ones are converted a
  // block at a time either way).
  if (slots == 0) planRowsPerBlock(*state);

  const vec::VectorKernels& kernels = vec::vectorKernels();
  auto source = [&](int64_t slot) {
    if (slot < program.immediateSlot(0)) return Source{Source::kInput, static_cast<uint32_t>(slot)};
    if (slot < program.resultSlot(0)) {
      return Source{Source::kImmediate, static_cast<uint32_t>(slot - program.immediateSlot(0))};
    }
    const auto producer = static_cast<size_t>(slot - program.resultSlot(0));
    return Source{Source::kRegister, registers.result_register[producer]};
  };
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const ElementwiseOp op = program.ops[i];
    Instruction instruction;
    instruction.a = source(program.operands[2 * i]);
    instruction.b = isBinary(op) ? source(program.operands[2 * i + 1]) : instruction.a;
    const VectorOp vector = vectorOp(op);
    if (vector.unary) {
      instruction.unary = kernels.unaryFn(*vector.unary);
    } else {
      for (size_t form = 0; form < instruction.binary.size(); ++form) {
        instruction.binary[form] = kernels.binaryFn(vector.binary, static_cast<vec::Operands>(form));
      }
    }
    instruction.alpha = program.alpha[i];
    instruction.beta = program.beta[i];
    instruction.result = registers.result_register[i];
    state->program.push_back(instruction);
  }
  if (state->quantize.active && setup.inputs.size() == 1 && state->dequantize[0].active &&
      setup.inputs[0].shape == out) {
    state->table = tabulate(*state);
    state->lookup = true;
  }
  return state;
}

// ------------------------------------------------------------------- run

// An operand over the current block: `count` elements, or one element that
// stands for all of them.
struct Operand {
  const float* data;
  bool scalar;
};

// Runs `instruction` over one block, writing `count` elements to `y`.
void runInstruction(const Instruction& instruction, Operand a, Operand b, float* y, int64_t count) {
  using vec::Operands;
  auto form = [&](Operands operands) { return instruction.binary[static_cast<size_t>(operands)]; };
  const bool all_scalar = a.scalar && (instruction.unary != nullptr || b.scalar);
  // An op of scalars gives one value: computed once, then repeated.
  const int64_t n = all_scalar ? 1 : count;
  if (instruction.unary != nullptr) {
    instruction.unary(a.data, y, n, instruction.alpha, instruction.beta);
  } else if (!a.scalar && !b.scalar) {
    form(Operands::kBoth)(a.data, b.data, y, n);
  } else if (b.scalar) {
    form(Operands::kScalarB)(a.data, b.data, y, n);
  } else {
    form(Operands::kScalarA)(a.data, b.data, y, n);
  }
  if (all_scalar) std::fill(y + 1, y + count, y[0]);
}

// An immediate or a register (on this thread's stack, `scratch`) over the
// current block.
Operand stateOperand(const FusedElementwiseState& state, const Source& source, float* scratch) {
  if (source.kind == Source::kImmediate) return {&state.immediates[source.index], true};
  return {scratch + source.index * state.block, false};
}

// The program over one block of `count` elements, its last instruction
// writing `y`; `operand` resolves each source.
template <typename OperandOf>
void runProgram(const FusedElementwiseState& state, const OperandOf& operand, float* scratch, float* y,
                int64_t count) {
  for (const Instruction& instruction : state.program) {
    float* result = instruction.result == kOutputRegister ? y : scratch + instruction.result * state.block;
    const Operand a = operand(instruction.a);
    const Operand b = instruction.unary != nullptr ? a : operand(instruction.b);
    runInstruction(instruction, a, b, result, count);
  }
}

// Output elements [at, at + count) of an upsampled input `x` (see Upsample)
// into `block`: runs of a pixel's channels, each from its source pixel.
void gatherUpsampled(const Upsample& u, const float* x, int64_t at, int64_t count, float* block) {
  int64_t c = at % u.channels;
  int64_t pixel = at / u.channels;
  int64_t ox = pixel % u.out_w;
  int64_t row = pixel / u.out_w;  // n * out_h + oy
  const int64_t in_h = u.out_h / u.fh, in_w = u.out_w / u.fw;
  // The source row of output row `row` (divisions once per row, not per pixel).
  auto sourceRow = [&] { return x + ((row / u.out_h) * in_h + (row % u.out_h) / u.fh) * in_w * u.channels; };
  const float* source = sourceRow();
  while (count > 0) {
    const int64_t run = std::min(u.channels - c, count);
    std::copy_n(source + (ox / u.fw) * u.channels + c, run, block);
    block += run;
    count -= run;
    c = 0;
    if (++ox == u.out_w) {
      ox = 0;
      ++row;
      if (count > 0) source = sourceRow();
    }
  }
}

// The program's results for each of the 256 values of its one input (8-bit),
// computed as runRange computes them: y = table[x] is bit for bit the same.
std::array<uint8_t, 256> tabulate(const FusedElementwiseState& state) {
  alignas(64) float scratch[kScratchFloats];
  alignas(64) float converted[kMaxBlock];
  alignas(64) float output_block[kMaxBlock];
  std::array<uint8_t, 256> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  std::array<uint8_t, 256> table{};
  const vec::VectorKernels& kernels = vec::vectorKernels();
  const Quantization& in = state.dequantize[0];
  const Quantization& out = state.quantize;
  for (int64_t at = 0; at < 256; at += state.block) {
    const int64_t count = std::min<int64_t>(state.block, 256 - at);
    auto operand = [&](const Source& source) -> Operand {
      if (source.kind != Source::kInput) return stateOperand(state, source, scratch);
      kernels.dequantize8(bytes.data() + at, converted, count, in.scale, in.zero, in.is_signed);
      return {converted, false};
    };
    runProgram(state, operand, scratch, output_block, count);
    kernels.quantize8(output_block, table.data() + at, count, out.scale, out.zero, out.is_signed);
  }
  return table;
}

// Output elements [begin, end), block by block along the plan's rows; the
// registers live on this thread's stack.
void runRange(const FusedElementwiseState& state, const KernelCall& call, int64_t begin, int64_t end) {
  alignas(64) float scratch[kScratchFloats];
  alignas(64) float gathered[kMaxUpsampledInputs][kMaxBlock];
  alignas(64) float converted[kMaxDequantizedInputs][kMaxBlock];
  alignas(64) float output_block[kMaxBlock];
  const vec::VectorKernels& kernels = vec::vectorKernels();
  float* y = call.outputs[0].as<float>();
  const BroadcastPlan& plan = state.plan;
  const int64_t row_length = plan.rowLength();
  BroadcastRows rows(plan, begin);
  int64_t column = begin % row_length;  // of element `at` in its row
  for (int64_t at = begin; at < end; rows.next(), column = 0) {
    const int64_t row_end = std::min(at - column + row_length, end);
    for (int64_t count = 0; at < row_end; column += count, at += count) {
      count = std::min(state.block, row_end - at);
      auto operand = [&](const Source& source) -> Operand {
        switch (source.kind) {
          case Source::kInput: {
            if (const int slot = state.upsample_slot[source.index]; slot >= 0) {
              float* block = gathered[slot];
              gatherUpsampled(state.upsample[source.index], call.inputs[source.index].as<const float>(), at, count,
                              block);
              return {block, false};
            }
            if (const int slot = state.dequantize_slot[source.index]; slot >= 0) {
              // 8-bit data: this block (or its one element) dequantized.
              const Quantization& q = state.dequantize[source.index];
              const bool scalar = plan.innerStride(source.index) == 0;
              const auto* bytes =
                  call.inputs[source.index].as<const uint8_t>() + rows.offset(source.index) + (scalar ? 0 : column);
              kernels.dequantize8(bytes, converted[slot], scalar ? 1 : count, q.scale, q.zero, q.is_signed);
              return {converted[slot], scalar};
            }
            const std::vector<float>& tiled = state.tiled[source.index];
            const float* data = (tiled.empty() ? call.inputs[source.index].as<const float>() : tiled.data()) +
                                rows.offset(source.index);
            if (plan.innerStride(source.index) == 0) return {data, true};
            return {data + column, false};
          }
          case Source::kImmediate:
          case Source::kRegister:
            break;
        }
        return stateOperand(state, source, scratch);
      };
      if (!state.quantize.active) {
        runProgram(state, operand, scratch, y + at, count);
        continue;
      }
      // An 8-bit output: the block in f32, then quantized into place.
      runProgram(state, operand, scratch, output_block, count);
      const Quantization& q = state.quantize;
      kernels.quantize8(output_block, call.outputs[0].as<uint8_t>() + at, count, q.scale, q.zero, q.is_signed);
    }
  }
}

// runRange for plans rowsPerBlock accepts: a block holds up to
// rows_per_block whole rows of one run of the next-to-last dimension; an
// input that repeats its row is read from a tile of that row side by side,
// on this thread's stack (refilled when the row changes: once per image).
// Blocks of 24-element rows took PP-OCR's squeeze-excite scale 0.8 ms for a
// 160x160x24 map.
void runRangeOfRows(const FusedElementwiseState& state, const KernelCall& call, int64_t begin, int64_t end) {
  alignas(64) float scratch[kScratchFloats];
  alignas(64) float tiles[kMaxRepeatedRows][kMaxBlock];
  alignas(64) float converted[kMaxDequantizedInputs][kMaxBlock];
  alignas(64) float output_block[kMaxBlock];
  std::array<const void*, kMaxRepeatedRows> tiled_from{};
  const vec::VectorKernels& kernels = vec::vectorKernels();
  const BroadcastPlan& plan = state.plan;
  const int64_t n = plan.rowLength();
  const int64_t dim = plan.dims[plan.rank - 2];
  for (int64_t at = begin; at < end;) {
    const BroadcastRows rows(plan, at);
    const int64_t column = at % n;
    int64_t count = std::min(n - column, end - at);
    const bool whole_rows = column == 0 && count == n;
    if (whole_rows) count = n * std::min({state.rows_per_block, (end - at) / n, dim - (at / n) % dim});
    auto operand = [&](const Source& source) -> Operand {
      switch (source.kind) {
        case Source::kInput: {
          const size_t i = source.index;
          const bool scalar = plan.innerStride(i) == 0;
          const int slot = state.tile_slot[i];
          const bool tiled = whole_rows && slot >= 0 && !scalar;
          if (const int converted_slot = state.dequantize_slot[i]; converted_slot >= 0) {
            // 8-bit data: the block (a scalar's one element, a repeated
            // row's tile) dequantized on this thread's stack.
            const Quantization& q = state.dequantize[i];
            const uint8_t* bytes = call.inputs[i].as<const uint8_t>() + rows.offset(i);
            if (scalar || !tiled) {
              float* block = converted[converted_slot];
              kernels.dequantize8(bytes + (scalar ? 0 : column), block, scalar ? 1 : count, q.scale, q.zero,
                                  q.is_signed);
              return {block, scalar};
            }
            float* tile = tiles[slot];
            if (tiled_from[static_cast<size_t>(slot)] != bytes) {
              kernels.dequantize8(bytes, tile, n, q.scale, q.zero, q.is_signed);
              for (int64_t r = 1; r < state.rows_per_block; ++r) std::copy(tile, tile + n, tile + r * n);
              tiled_from[static_cast<size_t>(slot)] = bytes;
            }
            return {tile, false};
          }
          const std::vector<float>& constant_tile = state.tiled[i];
          const float* data =
              (constant_tile.empty() ? call.inputs[i].as<const float>() : constant_tile.data()) + rows.offset(i);
          if (scalar) return {data, true};
          if (!tiled) return {data + column, false};
          float* tile = tiles[slot];
          if (tiled_from[static_cast<size_t>(slot)] != data) {
            for (int64_t r = 0; r < state.rows_per_block; ++r) std::copy(data, data + n, tile + r * n);
            tiled_from[static_cast<size_t>(slot)] = data;
          }
          return {tile, false};
        }
        case Source::kImmediate:
        case Source::kRegister:
          break;
      }
      return stateOperand(state, source, scratch);
    };
    if (!state.quantize.active) {
      runProgram(state, operand, scratch, call.outputs[0].as<float>() + at, count);
    } else {
      const Quantization& q = state.quantize;
      runProgram(state, operand, scratch, output_block, count);
      kernels.quantize8(output_block, call.outputs[0].as<uint8_t>() + at, count, q.scale, q.zero, q.is_signed);
    }
    at += count;
  }
}

// Large outputs split across threads (parallel.h); each instruction is about
// one elementwise op's work per element.
void runFusedElementwise(const KernelCall& call) {
  const auto& state = static_cast<const FusedElementwiseState&>(*call.state);
  if (state.elements == 0) return;
  if (state.lookup) {
    const uint8_t* x = call.inputs[0].as<const uint8_t>();
    uint8_t* y = call.outputs[0].as<uint8_t>();
    const vec::VectorKernels& kernels = vec::vectorKernels();
    parallelForElements(state.elements, [&](int64_t begin, int64_t end) {
      kernels.lookup8(x + begin, 0, y + begin, 0, 1, end - begin, state.table.data());
    });
    return;
  }
  parallelForElements(
      state.elements,
      [&](int64_t begin, int64_t end) {
        if (state.rows_per_block > 0) {
          runRangeOfRows(state, call, begin, end);
        } else {
          runRange(state, call, begin, end);
        }
      },
      static_cast<int64_t>(state.program.size()));
}

}  // namespace

void registerFusedElementwiseKernels(KernelRegistry& registry) {
  registry.add(KernelDef{kOp, &prepareFusedElementwise, &runFusedElementwise});
}

}  // namespace kiln
