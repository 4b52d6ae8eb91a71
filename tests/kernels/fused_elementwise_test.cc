// kiln.FusedElementwise against the unfused kernels: each program is also run
// one op at a time through the registry's Add, Sigmoid, Clip, ... on the same
// inputs, and the fused result must be the same bits (both call the same
// vector kernels on the same values), NaN for NaN. Inputs include special
// values and broadcast shapes of every kind the row plan distinguishes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/elementwise_program.h"
#include "kernels/kernel.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::broadcastShape;
using ::kiln::testing::elementCount;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::prepareError;
using ::kiln::testing::randomValues;
using ::kiln::testing::shapeText;
using ::testing::HasSubstr;
using Op = ElementwiseOp;

constexpr const char* kFused = "kiln.FusedElementwise";
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// Writes a program: immediates are declared up front, since results' slots
// come after theirs.
class ProgramBuilder {
 public:
  ProgramBuilder(size_t inputs, std::vector<float> immediates = {}) {
    program_.input_count = inputs;
    program_.immediates = std::move(immediates);
  }
  int64_t immediate(size_t index) const { return program_.immediateSlot(index); }
  // Appends an instruction; returns its result's slot.
  int64_t op(Op op, int64_t a, int64_t b = kNoOperand, float alpha = 0, float beta = 0) {
    program_.ops.push_back(op);
    program_.operands.insert(program_.operands.end(), {a, b});
    program_.alpha.push_back(alpha);
    program_.beta.push_back(beta);
    return program_.resultSlot(program_.ops.size() - 1);
  }
  const ElementwiseProgram& program() const { return program_; }

  ParamMap params() const {
    ParamMap params;
    params.set(std::string(kProgramOpsAttribute), joinElementwiseOps(program_.ops));
    params.set(std::string(kProgramOperandsAttribute), program_.operands);
    auto doubles = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
    params.set(std::string(kProgramAlphaAttribute), doubles(program_.alpha));
    params.set(std::string(kProgramBetaAttribute), doubles(program_.beta));
    if (!program_.immediates.empty()) {
      params.set(std::string(kProgramImmediatesAttribute), doubles(program_.immediates));
    }
    return params;
  }

 private:
  ElementwiseProgram program_;
};

Operand scalarConstant(float value) { return operand<float>({}, {value}, /*constant=*/true); }

// Runs instruction `i` of `program` with the unfused kernel of its op.
Operand runUnfused(const ElementwiseProgram& program, size_t i, const Operand& a, const Operand& b) {
  const Op op = program.ops[i];
  const float alpha = program.alpha[i];
  const float beta = program.beta[i];
  std::string name(elementwiseOpName(op));
  ParamMap params;
  std::vector<Operand> inputs = {a};
  if (isBinary(op)) inputs.push_back(b);
  switch (op) {
    case Op::kLeakyRelu:
    case Op::kElu:
      params.set("alpha", static_cast<double>(alpha));
      break;
    case Op::kHardSigmoid:
      params.set("alpha", static_cast<double>(alpha));
      params.set("beta", static_cast<double>(beta));
      break;
    case Op::kGeluTanh:
      name = "Gelu";
      params.set("approximate", std::string("tanh"));
      break;
    case Op::kClip:
      inputs.push_back(scalarConstant(alpha));
      inputs.push_back(scalarConstant(beta));
      break;
    case Op::kSquare:
    case Op::kPowHalf:
      name = "Pow";
      inputs.push_back(scalarConstant(op == Op::kSquare ? 2.0f : 0.5f));
      break;
    default:
      break;
  }
  const std::vector<int64_t> shape = isBinary(op) ? broadcastShape(a.info.shape, b.info.shape) : a.info.shape;
  std::vector<Operand> outputs = {output(DType::kF32, shape)};
  PreparedKernel(name, inputs, outputs, params).run(inputs, outputs);
  return outputs[0];
}

// The program run one op at a time.
Operand runOneOpAtATime(const ElementwiseProgram& program, const std::vector<Operand>& inputs) {
  std::vector<Operand> slots = inputs;
  for (float immediate : program.immediates) slots.push_back(operand<float>({}, {immediate}));
  for (size_t i = 0; i < program.ops.size(); ++i) {
    const int64_t a = program.operands[2 * i];
    const int64_t b = program.operands[2 * i + 1];
    slots.push_back(runUnfused(program, i, slots[static_cast<size_t>(a)], slots[static_cast<size_t>(b < 0 ? a : b)]));
  }
  return slots.back();
}

// Same bits, or NaN where the reference is NaN (the NaN's payload may differ).
::testing::AssertionResult sameValues(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " vs " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const bool same = std::isnan(want[i]) ? std::isnan(got[i]) : std::memcmp(&got[i], &want[i], sizeof(float)) == 0;
    if (!same) return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", want " << want[i];
  }
  return ::testing::AssertionSuccess();
}

// Random values in [-4, 4] with special values sprinkled in.
std::vector<float> values(const std::vector<int64_t>& shape, uint32_t seed) {
  std::vector<float> v = randomValues<float>(elementCount(shape), seed, -4, 4);
  const float specials[] = {kNan, kInf, -kInf, 0.0f, -0.0f, 1e30f, -1e30f, 1e-40f, 88.8f, -104.0f, 0.5f, 1.0f};
  for (size_t i = seed % 7; i < v.size(); i += 5) v[i] = specials[(i / 5 + seed) % std::size(specials)];
  return v;
}

// Runs `builder`'s program fused on inputs of `shapes` and compares it with
// the one-op-at-a-time result.
void checkFused(const ProgramBuilder& builder, const std::vector<std::vector<int64_t>>& shapes,
                const std::string& what) {
  std::vector<Operand> inputs;
  uint32_t seed = 1;
  for (const auto& shape : shapes) inputs.push_back(operand<float>(shape, values(shape, seed++)));
  const Operand want = runOneOpAtATime(builder.program(), inputs);
  std::vector<Operand> outputs = {output(DType::kF32, want.info.shape)};
  PreparedKernel(kFused, inputs, outputs, builder.params()).run(inputs, outputs);
  EXPECT_TRUE(sameValues(outputs[0].values<float>(), want.values<float>()))
      << what << ": " << joinElementwiseOps(builder.program().ops) << " over " << shapeText(shapes[0]);
}

TEST(FusedElementwiseKernel, EveryUnaryOpMatchesItsKernel) {
  // (x + b) -> op -> * x: the op reads a register and writes one.
  struct Case {
    Op op;
    float alpha, beta;
  };
  const std::vector<Case> cases = {
      {Op::kRelu, 0, 0},      {Op::kLeakyRelu, 0.1f, 0}, {Op::kElu, 0.7f, 0},     {Op::kSigmoid, 0, 0},
      {Op::kHardSigmoid, 0.3f, 0.4f}, {Op::kHardSwish, 0, 0}, {Op::kSoftplus, 0, 0}, {Op::kTanh, 0, 0},
      {Op::kGelu, 0, 0},      {Op::kGeluTanh, 0, 0},     {Op::kExp, 0, 0},       {Op::kLog, 0, 0},
      {Op::kSqrt, 0, 0},      {Op::kErf, 0, 0},          {Op::kAbs, 0, 0},       {Op::kNeg, 0, 0},
      {Op::kReciprocal, 0, 0}, {Op::kFloor, 0, 0},       {Op::kCeil, 0, 0},      {Op::kClip, -1.5f, 2.0f},
      {Op::kClip, 1.0f, -1.0f}, {Op::kSquare, 0, 0},      {Op::kPowHalf, 0, 0}};
  for (const Case& c : cases) {
    ProgramBuilder p(2);
    p.op(Op::kMul, p.op(c.op, p.op(Op::kAdd, 0, 1), kNoOperand, c.alpha, c.beta), 0);
    checkFused(p, {{3, 37}, {37}}, "unary in the middle");
    ProgramBuilder last(1);
    last.op(c.op, 0, kNoOperand, c.alpha, c.beta);
    checkFused(last, {{1000}}, "unary alone");
  }
}

TEST(FusedElementwiseKernel, EveryBinaryOpMatchesItsKernelInEveryOperandForm) {
  for (Op op : {Op::kAdd, Op::kSub, Op::kMul, Op::kDiv, Op::kMax, Op::kMin}) {
    ProgramBuilder p(2, {0.75f});
    const int64_t s = p.op(Op::kSigmoid, 0);
    const int64_t both = p.op(op, s, 0);                    // two registers' worth: arrays
    const int64_t row = p.op(op, 1, both);                  // a broadcast row first
    const int64_t scalar_b = p.op(op, row, p.immediate(0));  // an immediate second
    p.op(op, p.immediate(0), scalar_b);                     // an immediate first
    checkFused(p, {{5, 41}, {41}}, "operand forms");
  }
}

TEST(FusedElementwiseKernel, BroadcastInputsOfEveryKind) {
  // out [2, 3, 4, 5]: rows of 5 with [2, 1, 4, 1] one element per row, [5]
  // the whole row, [3, 1, 1] per channel, [] a scalar input.
  ProgramBuilder p(5, {2.0f});
  int64_t h = p.op(Op::kAdd, 0, 1);
  h = p.op(Op::kMul, h, 2);
  h = p.op(Op::kSub, 3, h);
  h = p.op(Op::kDiv, h, 4);
  p.op(Op::kMax, h, p.immediate(0));
  checkFused(p, {{2, 3, 4, 5}, {2, 1, 4, 1}, {5}, {3, 1, 1}, {}}, "broadcast kinds");
  // The output a broadcast of inputs none of which has its shape.
  ProgramBuilder outer(2);
  outer.op(Op::kTanh, outer.op(Op::kAdd, 0, 1));
  checkFused(outer, {{4, 1}, {1, 300}}, "outer sum");
}

TEST(FusedElementwiseKernel, OpsOfOneRepeatedElementAreComputedOnceAndRepeated) {
  // m [2, 3, 1] is one element per row of x [2, 3, 7]: Sigmoid(m) and m + m
  // have only scalar operands.
  ProgramBuilder p(2);
  const int64_t s = p.op(Op::kSigmoid, 1);
  const int64_t twice = p.op(Op::kAdd, 1, 1);
  const int64_t square = p.op(Op::kSquare, 1);
  p.op(Op::kSub, p.op(Op::kMul, 0, s), p.op(Op::kAdd, twice, square));
  checkFused(p, {{2, 3, 7}, {2, 3, 1}}, "scalar ops");
}

TEST(FusedElementwiseKernel, LongRowsAndManyLiveResults) {
  // Rows longer than a block, and a program keeping 20 results live (the
  // blocks shrink to fit their registers).
  ProgramBuilder p(2);
  std::vector<int64_t> live;
  for (int i = 0; i < 20; ++i) live.push_back(p.op(i % 2 == 0 ? Op::kSigmoid : Op::kTanh, i % 3 == 0 ? 0 : 1));
  int64_t sum = live[0];
  for (size_t i = 1; i < live.size(); ++i) sum = p.op(Op::kAdd, sum, live[i]);
  checkFused(p, {{3, 2000}, {2000}}, "long rows");
  checkFused(p, {{5000}, {}}, "one long row");
}

TEST(FusedElementwiseKernel, ShortRowsRepeatedPerImageRunManyRowsPerBlock) {
  // A squeeze-excite scale: x [N, H, W, C] times a per-image [N, 1, 1, C]
  // (read twice) and a per-channel row, C short: blocks of whole rows with
  // the repeated rows tiled; large enough to split across threads mid-row.
  ProgramBuilder p(3);
  const int64_t gate = p.op(Op::kSigmoid, 1);
  const int64_t scaled = p.op(Op::kAdd, p.op(Op::kMul, 0, gate), 0);
  p.op(Op::kAdd, p.op(Op::kMul, scaled, 1), 2);
  checkFused(p, {{3, 40, 50, 24}, {3, 1, 1, 24}, {24}}, "per-image rows");
  checkFused(p, {{2, 7, 9, 20}, {2, 1, 1, 20}, {}}, "per-image rows and a scalar");
  checkFused(p, {{1, 5, 3, 63}, {1, 1, 1, 63}, {63}}, "rows just short of the bound");
}

// [N, h, w, C] nearest-upsampled by (fh, fw): element (n, y, x, c) from
// (n, y / fh, x / fw, c).
Operand upsampled(const Operand& small, int64_t fh, int64_t fw) {
  const std::vector<int64_t>& s = small.info.shape;
  const std::vector<float> v = small.values<float>();
  std::vector<float> out;
  for (int64_t n = 0; n < s[0]; ++n) {
    for (int64_t y = 0; y < s[1] * fh; ++y) {
      for (int64_t x = 0; x < s[2] * fw; ++x) {
        const auto at = v.begin() + ((n * s[1] + y / fh) * s[2] + x / fw) * s[3];
        out.insert(out.end(), at, at + s[3]);
      }
    }
  }
  return operand<float>({s[0], s[1] * fh, s[2] * fw, s[3]}, out);
}

// Inputs read nearest-upsampled (passes/upsample_fusion.h): the same bits as
// the program over the upsampled tensors, blocks crossing pixels, rows and
// images.
TEST(FusedElementwiseKernel, UpsampledInputsAreGatheredBlockByBlock) {
  ProgramBuilder p(3);
  p.op(Op::kAdd, p.op(Op::kMul, 0, 1), 2);  // x * scale + up(coarse)
  struct Case {
    std::vector<int64_t> out;
    int64_t fh, fw;
  };
  for (const Case& c : {Case{{1, 8, 10, 96}, 2, 2}, Case{{2, 6, 9, 24}, 3, 1}, Case{{1, 4, 4, 5}, 1, 4},
                        Case{{2, 40, 40, 40}, 2, 2}}) {
    const std::vector<int64_t>& o = c.out;
    const Operand x = operand<float>(o, values(o, 1));
    const Operand scale = operand<float>({1, 1, 1, o[3]}, values({1, 1, 1, o[3]}, 2));
    const std::vector<int64_t> small_shape = {o[0], o[1] / c.fh, o[2] / c.fw, o[3]};
    const Operand small = operand<float>(small_shape, values(small_shape, 3));
    const Operand want = runOneOpAtATime(p.program(), {x, scale, upsampled(small, c.fh, c.fw)});
    ParamMap params = p.params();
    params.set(std::string(kProgramUpsampleAttribute), std::vector<int64_t>{1, 1, 1, 1, c.fh, c.fw});
    std::vector<Operand> inputs = {x, scale, small};
    std::vector<Operand> outputs = {output(DType::kF32, o)};
    PreparedKernel(kFused, inputs, outputs, params).run(inputs, outputs);
    EXPECT_TRUE(sameValues(outputs[0].values<float>(), want.values<float>())) << shapeText(o) << " by " << c.fh << "x" << c.fw;
  }
  // Factors that do not take the input to the output's shape.
  ParamMap params = p.params();
  params.set(std::string(kProgramUpsampleAttribute), std::vector<int64_t>{1, 1, 1, 1, 2, 3});
  std::vector<Operand> inputs = {operand<float>({1, 4, 4, 2}, values({1, 4, 4, 2}, 1)),
                                 operand<float>({2}, values({2}, 2)), operand<float>({1, 2, 2, 2}, values({1, 2, 2, 2}, 3))};
  std::vector<Operand> outputs = {output(DType::kF32, {1, 4, 4, 2})};
  EXPECT_THAT(prepareError(kFused, inputs, outputs, params), HasSubstr("upsampled by 2 x 3 is not the output's shape"));
}

// Quantized I/O: 8-bit inputs dequantized as they load, an 8-bit output
// quantized as it stores. The reference: the inputs dequantized by
// DequantizeLinear's kernel, the program one op at a time, QuantizeLinear's
// kernel: the same bits. Shapes: a long row, a per-channel 8-bit input (one
// element per row: the scalar form), u8 and i8, several blocks.
TEST(FusedElementwiseKernel, EightBitInputsAndOutputsAreTheQuantizationKernels) {
  ProgramBuilder p(3);
  p.op(Op::kAdd, p.op(Op::kMul, p.op(Op::kSigmoid, 0), 1), 2);  // sigmoid(a) * gate + shift
  struct Shapes {
    std::vector<int64_t> a, gate, shift;
  };
  // Long rows (the gate one element per row: the scalar form), and short
  // channels-last rows with a per-image gate (a squeeze-excite scale: the
  // rows-per-block path, whose repeated row is dequantized into its tile).
  for (const Shapes& shapes : {Shapes{{2, 6, 700}, {2, 6, 1}, {700}}, Shapes{{2, 5, 9, 8}, {2, 1, 1, 8}, {8}}}) {
    for (const DType type : {DType::kU8, DType::kI8}) {
      const bool is_signed = type == DType::kI8;
      const std::vector<int64_t>& shape = shapes.a;
      auto bytes = [&](const std::vector<int64_t>& dims, uint32_t seed) {
        Operand o = output(type, dims);
        const std::vector<float> v = randomValues<float>(elementCount(dims), seed, 0, 255);
        for (size_t i = 0; i < v.size(); ++i) o.bytes[i] = static_cast<std::byte>(static_cast<uint8_t>(v[i]));
        return o;
      };
      const Operand a = bytes(shape, 1);
      const Operand gate = bytes(shapes.gate, 2);
      const Operand shift = operand<float>(shapes.shift, values(shapes.shift, 3));
      const float zero = is_signed ? -7.0f : 121.0f;
      auto param = [&](float value, DType dtype) {
        Operand o = output(dtype, {});
        if (dtype == DType::kF32) return operand<float>({}, {value});
        o.bytes[0] = static_cast<std::byte>(static_cast<uint8_t>(static_cast<int>(value)));
        return o;
      };
      auto dequantized = [&](const Operand& x, float scale, float z) {
        std::vector<Operand> inputs = {x, param(scale, DType::kF32), param(z, type)};
        std::vector<Operand> outputs = {output(DType::kF32, x.info.shape)};
        PreparedKernel("DequantizeLinear", inputs, outputs, ParamMap{}).run(inputs, outputs);
        return outputs[0];
      };
      const Operand f32 = runOneOpAtATime(p.program(), {dequantized(a, 0.05f, zero), dequantized(gate, 0.01f, zero),
                                                        shift});
      std::vector<Operand> q_inputs = {f32, param(0.02f, DType::kF32), param(zero + 3, type)};
      std::vector<Operand> want = {output(type, shape)};
      PreparedKernel("QuantizeLinear", q_inputs, want, ParamMap{}).run(q_inputs, want);

      ParamMap params = p.params();
      params.set(std::string(kProgramDequantizeAttribute), std::vector<double>{0.05, zero, 0.01, zero, 0, 0});
      params.set(std::string(kProgramQuantizeAttribute), std::vector<double>{0.02, zero + 3});
      std::vector<Operand> inputs = {a, gate, shift};
      std::vector<Operand> outputs = {output(type, shape)};
      PreparedKernel(kFused, inputs, outputs, params).run(inputs, outputs);
      EXPECT_EQ(outputs[0].bytes, want[0].bytes) << dtypeName(type) << " " << shape.size() << "-D";
    }
  }
  // An 8-bit input without a scale is refused, and so is a scale on an f32 one.
  ParamMap params = p.params();
  std::vector<Operand> inputs = {output(DType::kU8, {4}), operand<float>({4}, values({4}, 1)),
                                 operand<float>({4}, values({4}, 2))};
  std::vector<Operand> outputs = {output(DType::kF32, {4})};
  EXPECT_THAT(prepareError(kFused, inputs, outputs, params), HasSubstr("the kernel takes f32 inputs"));
  params.set(std::string(kProgramDequantizeAttribute), std::vector<double>{0, 0, 0.5, 0, 0, 0});
  EXPECT_THAT(prepareError(kFused, inputs, outputs, params), HasSubstr("input 1 is dequantized but is f32"));
}

// One 8-bit input of the output's shape and an 8-bit output: the program is
// tabulated over the input's 256 values at prepare and run looks bytes up
// (vec::lookup8). The same bits as the kernels one at a time, u8 and i8, at
// a length that leaves a tail, and in place.
TEST(FusedElementwiseKernel, AUnaryProgramOfEightBitDataIsALookup) {
  ProgramBuilder p(1);
  p.op(Op::kMul, p.op(Op::kSigmoid, 0), 0);  // x * sigmoid(x)
  for (const DType type : {DType::kU8, DType::kI8}) {
    const bool is_signed = type == DType::kI8;
    const std::vector<int64_t> shape = {3, 1001};
    Operand x = output(type, shape);
    for (size_t i = 0; i < x.bytes.size(); ++i) x.bytes[i] = static_cast<std::byte>((i * 37 + 11) % 256);
    const float zero = is_signed ? 5.0f : 130.0f;
    auto param = [&](float value, DType dtype) {
      if (dtype == DType::kF32) return operand<float>({}, {value});
      Operand o = output(dtype, {});
      o.bytes[0] = static_cast<std::byte>(static_cast<uint8_t>(static_cast<int>(value)));
      return o;
    };
    std::vector<Operand> dq_inputs = {x, param(0.04f, DType::kF32), param(zero, type)};
    std::vector<Operand> dequantized = {output(DType::kF32, shape)};
    PreparedKernel("DequantizeLinear", dq_inputs, dequantized, ParamMap{}).run(dq_inputs, dequantized);
    std::vector<Operand> q_inputs = {runOneOpAtATime(p.program(), {dequantized[0]}), param(0.03f, DType::kF32),
                                     param(zero - 9, type)};
    std::vector<Operand> want = {output(type, shape)};
    PreparedKernel("QuantizeLinear", q_inputs, want, ParamMap{}).run(q_inputs, want);

    ParamMap params = p.params();
    params.set(std::string(kProgramDequantizeAttribute), std::vector<double>{0.04, zero});
    params.set(std::string(kProgramQuantizeAttribute), std::vector<double>{0.03, zero - 9});
    std::vector<Operand> inputs = {x};
    std::vector<Operand> outputs = {output(type, shape)};
    PreparedKernel kernel(kFused, inputs, outputs, params);
    kernel.run(inputs, outputs);
    EXPECT_EQ(outputs[0].bytes, want[0].bytes) << dtypeName(type);
    kernel.run(inputs, inputs);  // in place
    EXPECT_EQ(inputs[0].bytes, want[0].bytes) << dtypeName(type) << ", in place";
  }
}

TEST(FusedElementwiseKernel, OutputMayBeAnInputOfItsShape) {
  ProgramBuilder p(2, {3.0f});
  p.op(Op::kMul, p.op(Op::kRelu, p.op(Op::kAdd, 0, 1)), p.immediate(0));
  std::vector<Operand> inputs = {operand<float>({4, 700}, values({4, 700}, 3)),
                                 operand<float>({700}, values({700}, 4))};
  const Operand want = runOneOpAtATime(p.program(), inputs);
  std::vector<Operand> outputs = {output(DType::kF32, {4, 700})};
  const PreparedKernel kernel(kFused, inputs, outputs, p.params());
  auto bound = kernel.bind(inputs, outputs);
  bound->outputs[0].data = bound->inputs[0].data;  // in place
  kernel.run(bound->call);
  EXPECT_TRUE(sameValues(inputs[0].values<float>(), want.values<float>()));
}

TEST(FusedElementwiseKernel, AnEmptyOutputTouchesNothing) {
  ProgramBuilder p(2);
  p.op(Op::kExp, p.op(Op::kAdd, 0, 1));
  std::vector<Operand> inputs = {operand<float>({0, 5}, {}), operand<float>({5}, values({5}, 1))};
  std::vector<Operand> outputs = {output(DType::kF32, {0, 5})};
  PreparedKernel(kFused, inputs, outputs, p.params()).run(inputs, outputs);
}

TEST(FusedElementwiseKernel, PrepareRefusesWhatItCannotRun) {
  ProgramBuilder p(2);
  p.op(Op::kRelu, p.op(Op::kAdd, 0, 1));
  const std::string op = kFused;
  std::vector<Operand> inputs = {operand<float>({2, 3}, values({2, 3}, 1)), operand<float>({3}, values({3}, 2))};
  std::vector<Operand> outputs = {output(DType::kF32, {2, 3})};
  EXPECT_EQ(prepareError(op, inputs, outputs, p.params()), "(no error)");

  ParamMap bad_name = p.params();
  bad_name.set("ops", std::string("Add,Frobnicate"));
  EXPECT_THAT(prepareError(op, inputs, outputs, bad_name), HasSubstr("'Add,Frobnicate' names an op"));
  ParamMap bad_slot = p.params();
  bad_slot.set("operands", std::vector<int64_t>{0, 1, 3, -1});
  EXPECT_THAT(prepareError(op, inputs, outputs, bad_slot), HasSubstr("instruction 1 (Relu) reads slot 3"));
  std::vector<Operand> wrong_output = {output(DType::kF32, {3})};
  EXPECT_THAT(prepareError(op, inputs, wrong_output, p.params()),
              HasSubstr("output is f32[3] but the inputs give f32[2, 3]"));
  std::vector<Operand> ints = {operand<int32_t>({2, 3}, std::vector<int32_t>(6, 1)), inputs[1]};
  EXPECT_THAT(prepareError(op, ints, outputs, p.params()), HasSubstr("input 0 is i32[2, 3]"));
  std::vector<Operand> unbroadcastable = {inputs[0], operand<float>({2}, {1.0f, 2.0f})};
  EXPECT_THAT(prepareError(op, unbroadcastable, outputs, p.params()), HasSubstr("do not broadcast"));

  // 33 results live at once.
  ProgramBuilder wide(1);
  std::vector<int64_t> live;
  for (int i = 0; i < 33; ++i) live.push_back(wide.op(Op::kExp, 0));
  int64_t sum = live[0];
  for (size_t i = 1; i < live.size(); ++i) sum = wide.op(Op::kAdd, sum, live[i]);
  std::vector<Operand> one = {inputs[0]};
  EXPECT_THAT(prepareError(op, one, outputs, wide.params()), HasSubstr("needs 33 registers; the kernel has 32"));
}

}  // namespace
}  // namespace kiln
