// The program of kiln.FusedElementwise: op names, the checks every reader
// of a program relies on, and the register assignment that the kernel uses
// and the fusion pass bounds.
#include "core/elementwise_program.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace kiln {
namespace {

using ::testing::HasSubstr;

// A program over `inputs` inputs and `immediates` immediates; alpha and beta 0.
ElementwiseProgram program(size_t inputs, std::vector<ElementwiseOp> ops, std::vector<int64_t> operands,
                           std::vector<float> immediates = {}) {
  ElementwiseProgram p;
  p.input_count = inputs;
  p.alpha.assign(ops.size(), 0);
  p.beta.assign(ops.size(), 0);
  p.ops = std::move(ops);
  p.operands = std::move(operands);
  p.immediates = std::move(immediates);
  return p;
}

TEST(ElementwiseProgram, OpNamesRoundTrip) {
  std::vector<ElementwiseOp> all;
  for (size_t i = 0; i < static_cast<size_t>(ElementwiseOp::kCount); ++i) all.push_back(static_cast<ElementwiseOp>(i));
  const std::string text = joinElementwiseOps(all);
  EXPECT_THAT(text, HasSubstr("Sigmoid,HardSigmoid"));
  EXPECT_EQ(parseElementwiseOps(text), all);
  EXPECT_EQ(parseElementwiseOps("Add"), std::vector<ElementwiseOp>{ElementwiseOp::kAdd});
  EXPECT_EQ(parseElementwiseOps(""), std::vector<ElementwiseOp>{});
  EXPECT_EQ(parseElementwiseOps("Add,Pow"), std::nullopt);
  EXPECT_EQ(parseElementwiseOps("Add,"), std::nullopt);
  EXPECT_TRUE(isBinary(ElementwiseOp::kMin));
  EXPECT_FALSE(isBinary(ElementwiseOp::kSquare));  // Pow's exponent is part of the op
}

TEST(ElementwiseProgram, SlotsAreInputsThenImmediatesThenResults) {
  const ElementwiseProgram p = program(2, {ElementwiseOp::kAdd, ElementwiseOp::kMul}, {0, 2, 3, 1}, {1.5f});
  EXPECT_EQ(p.immediateSlot(0), 2);
  EXPECT_EQ(p.resultSlot(0), 3);
  EXPECT_EQ(checkElementwiseProgram(p), "");
}

TEST(ElementwiseProgram, CheckNamesWhatIsWrong) {
  using Op = ElementwiseOp;
  EXPECT_THAT(checkElementwiseProgram(program(1, {}, {})), HasSubstr("no instructions"));
  EXPECT_THAT(checkElementwiseProgram(program(1, {Op::kRelu}, {0})), HasSubstr("need 2 operands, found 1"));
  ElementwiseProgram short_alpha = program(1, {Op::kRelu}, {0, -1});
  short_alpha.alpha.clear();
  EXPECT_THAT(checkElementwiseProgram(short_alpha), HasSubstr("alpha and beta"));
  // A unary op with a second operand; a binary op without one.
  EXPECT_THAT(checkElementwiseProgram(program(1, {Op::kRelu}, {0, 0})), HasSubstr("takes one operand"));
  EXPECT_THAT(checkElementwiseProgram(program(1, {Op::kAdd}, {0, -1})), HasSubstr("reads slot -1"));
  // Its own result, a later result, a slot past everything.
  EXPECT_THAT(checkElementwiseProgram(program(1, {Op::kExp}, {1, -1})), HasSubstr("reads slot 1"));
  EXPECT_THAT(checkElementwiseProgram(program(1, {Op::kExp, Op::kExp}, {2, -1, 1, -1})), HasSubstr("reads slot 2"));
  EXPECT_EQ(checkElementwiseProgram(program(1, {Op::kExp, Op::kExp}, {0, -1, 1, -1})), "");
}

TEST(ElementwiseProgram, AChainNeedsOneRegister) {
  // ((x + b) * c) -> Relu -> Sigmoid: each result is read once, by the next
  // instruction, which computes in place.
  using Op = ElementwiseOp;
  const ElementwiseProgram p =
      program(3, {Op::kAdd, Op::kMul, Op::kRelu, Op::kSigmoid}, {0, 1, 3, 2, 4, -1, 5, -1});
  const RegisterAssignment r = assignRegisters(p);
  EXPECT_EQ(r.count, 1u);
  EXPECT_EQ(r.result_register, (std::vector<uint32_t>{0, 0, 0, kOutputRegister}));
}

TEST(ElementwiseProgram, LiveResultsHoldTheirRegisters) {
  // a = Sigmoid(x); b = Tanh(x); c = a * b; y = c + a: a lives until the end.
  using Op = ElementwiseOp;
  const ElementwiseProgram p =
      program(1, {Op::kSigmoid, Op::kTanh, Op::kMul, Op::kAdd}, {0, -1, 0, -1, 1, 2, 3, 1});
  const RegisterAssignment r = assignRegisters(p);
  EXPECT_EQ(r.count, 2u);
  EXPECT_EQ(r.result_register, (std::vector<uint32_t>{0, 1, 1, kOutputRegister}));  // c takes b's register
}

TEST(ElementwiseProgram, ASquareOfOneResultFreesItOnce) {
  // a = Exp(x); b = a * a; y = b + x.
  using Op = ElementwiseOp;
  const RegisterAssignment r = assignRegisters(program(1, {Op::kExp, Op::kMul, Op::kAdd}, {0, -1, 1, 1, 2, 0}));
  EXPECT_EQ(r.count, 1u);
  EXPECT_EQ(r.result_register, (std::vector<uint32_t>{0, 0, kOutputRegister}));
}

TEST(ElementwiseProgram, AnUnreadResultGivesItsRegisterBack) {
  // Instruction 0's result is never read; 1 and 2 reuse its register.
  using Op = ElementwiseOp;
  const RegisterAssignment r =
      assignRegisters(program(1, {Op::kExp, Op::kLog, Op::kNeg, Op::kAdd}, {0, -1, 0, -1, 0, -1, 2, 3}));
  EXPECT_EQ(r.count, 2u);
  EXPECT_EQ(r.result_register[0], 0u);
  EXPECT_EQ(r.result_register[1], 0u);
  EXPECT_EQ(r.result_register[2], 1u);
}

}  // namespace
}  // namespace kiln
