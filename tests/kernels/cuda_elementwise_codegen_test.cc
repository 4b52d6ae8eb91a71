// The kernels the runtime compiler specializes (kernels/cuda/
// elementwise_codegen.h, depthwise_conv.h): which shapes get the four-wide
// elementwise kernel, what is left to the built-in kernels, and that NVRTC
// compiles the sources, for every op and the GPUs kiln builds for.
// Compiling needs no GPU; running them is tests/cli/test_cuda.py's part.
#include "kernels/cuda/elementwise_codegen.h"

#include <gtest/gtest.h>

#include <string>

#include "core/elementwise_program.h"
#include "kernels/cuda/copy_codegen.h"
#include "kernels/cuda/depthwise_conv.h"
#include "kernels/cuda/runtime_compiler.h"

namespace kiln::cuda {
namespace {

// y = op(x0, x1) for one binary op, or op(x0) for a unary one.
DeviceProgram single(ElementwiseOp op, int inputs = 2) {
  DeviceProgram program;
  program.ops = 1;
  program.inputs = inputs;
  program.op[0] = static_cast<uint8_t>(op);
  program.a[0] = 0;
  program.b[0] = static_cast<int8_t>(isBinary(op) ? 1 : -1);
  return program;
}

// x0 [rows, cols] with x1 broadcast as a [cols] row (or [rows, 1] column).
Indexing broadcast(int64_t rows, int64_t cols, bool column) {
  Indexing indexing;
  indexing.direct = false;
  indexing.rank = 2;
  indexing.out_dims[0] = rows;
  indexing.out_dims[1] = cols;
  indexing.strides[0][0] = cols;
  indexing.strides[0][1] = 1;
  indexing.strides[1][0] = column ? 1 : 0;
  indexing.strides[1][1] = column ? 0 : 1;
  return indexing;
}

TEST(CudaElementwiseCodegen, FullSizeInputsMoveFourElementsAtATime) {
  const auto source = elementwiseSource(single(ElementwiseOp::kAdd), Indexing{}, 1024);
  ASSERT_TRUE(source);
  EXPECT_EQ(source->vector_width, 4);
  EXPECT_NE(source->text.find("kiln_elementwise_v4"), std::string::npos);
  EXPECT_NE(source->text.find("kiln_elementwise_v1"), std::string::npos);
}

TEST(CudaElementwiseCodegen, OddCountsAndOddRowsGetTheOneWideKernelOnly) {
  const auto odd = elementwiseSource(single(ElementwiseOp::kAdd), Indexing{}, 1023);
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->vector_width, 1);
  EXPECT_EQ(odd->text.find("kiln_elementwise_v4"), std::string::npos);
  // A [6] row over [4, 6]: four lanes would straddle two rows.
  const auto rows = elementwiseSource(single(ElementwiseOp::kMul), broadcast(4, 6, false), 24);
  ASSERT_TRUE(rows);
  EXPECT_EQ(rows->vector_width, 1);
}

TEST(CudaElementwiseCodegen, RowsAndColumnsOfFourBroadcastFourWide) {
  const auto row = elementwiseSource(single(ElementwiseOp::kSub), broadcast(3, 128, false), 384);
  ASSERT_TRUE(row);
  EXPECT_EQ(row->vector_width, 4);
  const auto column = elementwiseSource(single(ElementwiseOp::kDiv), broadcast(3, 128, true), 384);
  ASSERT_TRUE(column);
  EXPECT_EQ(column->vector_width, 4);
  // The sizes are constants of the kernel, not parameters.
  EXPECT_NE(column->text.find("% 128u"), std::string::npos) << column->text;
}

TEST(CudaElementwiseCodegen, LeavesWhatNeedsSixtyFourBitIndicesToTheInterpreter) {
  EXPECT_FALSE(elementwiseSource(single(ElementwiseOp::kRelu, 1), Indexing{}, 1ull << 31));
  EXPECT_TRUE(elementwiseSource(single(ElementwiseOp::kRelu, 1), Indexing{}, (1ull << 31) - 4));
  EXPECT_FALSE(elementwiseSource(single(ElementwiseOp::kRelu, 1), Indexing{}, 0));
}

TEST(CudaElementwiseCodegen, RefusesAnOpOutsideTheList) {
  DeviceProgram program = single(ElementwiseOp::kRelu, 1);
  program.op[0] = static_cast<uint8_t>(ElementwiseOp::kCount);
  EXPECT_FALSE(elementwiseSource(program, Indexing{}, 16));
}

// Every op in one program (each applied to the previous result and, for
// binary ops, to an immediate), so that NVRTC sees every expression.
TEST(CudaElementwiseCodegen, EveryOpCompilesForEachGpuGeneration) {
  DeviceProgram program;
  program.inputs = 1;
  program.immediates = 1;
  program.immediate[0] = 0.5f;
  const int first_result = program.inputs + program.immediates;
  for (int op = 0; op < static_cast<int>(ElementwiseOp::kCount); ++op) {
    const auto which = static_cast<ElementwiseOp>(op);
    program.op[op] = static_cast<uint8_t>(op);
    program.a[op] = static_cast<int8_t>(op == 0 ? 0 : first_result + op - 1);
    program.b[op] = static_cast<int8_t>(isBinary(which) ? 1 : -1);
    program.alpha[op] = 0.25f;
    program.beta[op] = 4.0f;
  }
  program.ops = static_cast<int>(ElementwiseOp::kCount);
  ASSERT_LE(program.ops, kMaxElementwiseOps);
  const auto source = elementwiseSource(program, Indexing{}, 4096);
  ASSERT_TRUE(source);
  for (int op = 0; op < program.ops; ++op) {
    const std::string name(elementwiseOpName(static_cast<ElementwiseOp>(op)));
    EXPECT_NE(source->text.find("float kiln_" + name + "("), std::string::npos) << name;
  }
  for (int capability : {80, 90}) {
    std::string error;
    const std::string image = compileImage(source->text, capability, &error);
    EXPECT_FALSE(image.empty()) << "sm_" << capability << ": " << error << "\n" << source->text;
  }
}

// `kiln compile --fp16` / `--bf16`: 16-bit operands convert as they load
// (four at a time in one 8-byte load where the kernel is four-wide), and a
// 16-bit result rounds as it stores; an f32 operand next to them stays f32.
TEST(CudaElementwiseCodegen, HalfOperandsAndResultsCompile) {
  for (const FloatStorage storage : {FloatStorage::kF16, FloatStorage::kBF16}) {
    const std::string store = storage == FloatStorage::kF16 ? "kiln_f2h(" : "kiln_f2b(";
    const std::string load = storage == FloatStorage::kF16 ? "kiln_h2f(" : "kiln_b2f(";
    for (const bool row_is_half : {true, false}) {
      Indexing indexing = broadcast(16, 64, false);
      indexing.storage[0] = storage;
      indexing.storage[1] = row_is_half ? storage : FloatStorage::kF32;
      indexing.storage_out = storage;
      const auto source = elementwiseSource(single(ElementwiseOp::kMul), indexing, 16 * 64);
      ASSERT_TRUE(source);
      EXPECT_EQ(source->vector_width, 4);
      EXPECT_NE(source->text.find("const uint2 r0 ="), std::string::npos) << source->text;
      EXPECT_NE(source->text.find("make_float4(" + load + "r0.x"), std::string::npos) << source->text;
      EXPECT_EQ(source->text.find("const uint2 r1 =") != std::string::npos, row_is_half) << source->text;
      EXPECT_NE(source->text.find("make_uint2(" + store), std::string::npos) << source->text;
      EXPECT_NE(source->text.find("reinterpret_cast<unsigned short*>(a.out)[e] = " + store), std::string::npos);
      for (int capability : {80, 90}) {
        std::string error;
        EXPECT_FALSE(compileImage(source->text, capability, &error).empty()) << error << "\n" << source->text;
      }
    }
  }
  // f32 programs carry no conversions.
  const auto plain = elementwiseSource(single(ElementwiseOp::kMul), broadcast(16, 64, false), 16 * 64);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->text.find("kiln_h2f"), std::string::npos);
}

TEST(CudaDepthwiseCodegen, CompilesWithAndWithoutPostOps) {
  DepthwiseGeometry g;
  g.batch = 2;
  g.channels = 8;
  g.in_h = g.in_w = 9;
  g.out_h = g.out_w = 5;
  g.kernel_h = g.kernel_w = 3;
  g.stride_h = g.stride_w = 2;
  g.pad_top = g.pad_left = 1;
  DeviceProgram clip_and_add = single(ElementwiseOp::kAdd);  // conv + residual, then Clip(0, 6)
  clip_and_add.ops = 2;
  clip_and_add.op[1] = static_cast<uint8_t>(ElementwiseOp::kClip);
  clip_and_add.a[1] = 2;
  clip_and_add.b[1] = -1;
  clip_and_add.beta[1] = 6.0f;
  for (const FloatStorage storage : {FloatStorage::kF32, FloatStorage::kF16, FloatStorage::kBF16}) {
    for (const DeviceProgram& post : {DeviceProgram{}, clip_and_add}) {
      const auto source = depthwiseSource(g, post, true, post.ops > 0, storage);
      ASSERT_TRUE(source);
      EXPECT_EQ(source->find("a.y[i] = kiln_f2h(") != std::string::npos, storage == FloatStorage::kF16) << *source;
      EXPECT_EQ(source->find("a.y[i] = kiln_f2b(") != std::string::npos, storage == FloatStorage::kBF16) << *source;
      std::string error;
      EXPECT_FALSE(compileImage(*source, 90, &error).empty()) << error << "\n" << *source;
    }
  }
  g.batch = 1 << 24;  // 2^31 or more outputs: the built-in kernel's
  EXPECT_FALSE(depthwiseSource(g, DeviceProgram{}, false, false));
}

// Attention's Transpose [B, S, H, D] -> [B, H, S, D]: D stays innermost.
StridedCopy headsFirst() {
  StridedCopy copy;
  copy.rank = 4;
  const int64_t dims[4] = {2, 12, 128, 32}, strides[4] = {128 * 384, 32, 384, 1};
  for (int d = 0; d < 4; ++d) {
    copy.dims[d] = dims[d];
    copy.strides[d] = strides[d];
  }
  return copy;
}

TEST(CudaCopyCodegen, ATransposeKeepingTheLastAxisMovesFourAtATime) {
  const auto source = stridedCopySource(headsFirst(), 2 * 12 * 128 * 32, 4);
  ASSERT_TRUE(source);
  EXPECT_EQ(source->vector_width, 4);
  std::string error;
  EXPECT_FALSE(compileImage(source->text, 90, &error).empty()) << error << "\n" << source->text;
}

TEST(CudaCopyCodegen, ReversedOddOrWideElementsMoveOneAtATime) {
  StridedCopy reversed = headsFirst();
  reversed.strides[3] = -1;
  reversed.offset = 31;
  StridedCopy odd = headsFirst();
  odd.dims[3] = 30;
  for (const auto& [copy, bytes] : {std::pair{reversed, 4}, std::pair{odd, 4}, std::pair{headsFirst(), 8},
                                    std::pair{headsFirst(), 2}, std::pair{headsFirst(), 1}}) {
    const auto source = stridedCopySource(copy, 2 * 12 * 128 * static_cast<uint64_t>(copy.dims[3]), bytes);
    ASSERT_TRUE(source);
    EXPECT_EQ(source->vector_width, 1);
    std::string error;
    EXPECT_FALSE(compileImage(source->text, 80, &error).empty()) << error << "\n" << source->text;
  }
  EXPECT_FALSE(stridedCopySource(headsFirst(), 1ull << 31, 4));
  EXPECT_FALSE(stridedCopySource(headsFirst(), 16, 3));
}

TEST(CudaElementwiseCodegen, ACompileErrorIsReportedNotThrown) {
  std::string error;
  EXPECT_TRUE(compileImage("this is not CUDA", 90, &error).empty());
  EXPECT_NE(error.find("NVRTC"), std::string::npos) << error;
}

}  // namespace
}  // namespace kiln::cuda
