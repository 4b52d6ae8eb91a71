// The channels-last pass end to end: a small convolutional graph compiled
// with and without it must compute the same outputs, under the same output
// names, with the convolutions and pools in their kiln.Nhwc* forms and one
// layout conversion per value that crosses between the layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kiln/compiler.h"
#include "kiln/executor.h"
#include "kiln/graph_builder.h"
#include "passes/channels_last.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

const std::map<std::string, int64_t> kOpsets = {{"", 17}};

std::vector<float> randomFloats(size_t count, unsigned seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = dist(random);
  return values;
}

// x [1, 4, 8, 8] -> Conv 3x3 (8) -> Relu -> MaxPool 2x2 -> a
// a -> Conv 1x1 (8, bias) -> Add(a) -> Mul([8, 1, 1] constant) -> b
// (compiled channels-last, Relu and the Add become post-ops of the Convs)
// Concat(b, Sigmoid(a)) on channels -> Split in two -> GlobalAveragePool -> "pooled"
//                                                    -> Flatten -> "flat"
// and "features" = b, a graph output read also by the Concat.
GraphPtr buildGraph() {
  GraphBuilder g("convnet");
  const ValueId x = g.input("x", DType::kF32, {1, 4, 8, 8});
  const ValueId w1 = g.constant("w1", {8, 4, 3, 3}, randomFloats(8 * 4 * 9, 1));
  const ValueId b1 = g.constant("b1", {8}, randomFloats(8, 2));
  const ValueId w2 = g.constant("w2", {8, 8, 1, 1}, randomFloats(64, 3));
  const ValueId b2 = g.constant("b2", {8}, randomFloats(8, 6));
  const ValueId scale = g.constant("scale", {8, 1, 1}, randomFloats(8, 4));
  const ValueId c1 = g.op("Conv", {x, w1, b1}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const ValueId r1 = g.op("Relu", {c1});
  const ValueId a = g.op("MaxPool", {r1}, {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                           {"strides", std::vector<int64_t>{2, 2}}});
  const ValueId c2 = g.op("Conv", {a, w2, b2});
  const ValueId sum = g.op("Add", {c2, a});
  const ValueId b = g.op("Mul", {sum, scale});
  g.graph().renameValue(b, "features");
  const ValueId s = g.op("Sigmoid", {a});
  const ValueId cat = g.op("Concat", {b, s}, {{"axis", int64_t{1}}});
  const std::vector<ValueId> halves = g.ops("Split", {cat}, 2, {{"axis", int64_t{1}}});
  const ValueId pooled = g.op("GlobalAveragePool", {halves[0]});
  g.graph().renameValue(pooled, "pooled");
  const ValueId flat = g.op("Flatten", {halves[1]});
  g.graph().renameValue(flat, "flat");
  g.output(b);
  g.output(pooled);
  g.output(flat);
  return g.build();
}

struct Outputs {
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<std::string> kernels;
};

// Pools with the attributes that change the window arithmetic: x
// [1, 5, 9, 7] -> AveragePool 3x3 pads 1 counting pads -> "avg";
// MaxPool 3x2 dilated 2, stride 2, ceil_mode -> "max"; GlobalMaxPool -> "gmax";
// Resize x2 x1.5, nearest -> "up" and linear -> "smooth".
GraphPtr buildPoolGraph() {
  GraphBuilder g("pools");
  const ValueId x = g.input("x", DType::kF32, {1, 5, 9, 7});
  const ValueId w = g.constant("w", {5, 5, 1, 1}, randomFloats(25, 5));
  const ValueId c = g.op("Conv", {x, w});
  const ValueId avg = g.op("AveragePool", {c}, {{"kernel_shape", std::vector<int64_t>{3, 3}},
                                               {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                                               {"count_include_pad", int64_t{1}}});
  const ValueId max = g.op("MaxPool", {c}, {{"kernel_shape", std::vector<int64_t>{3, 2}},
                                           {"dilations", std::vector<int64_t>{2, 2}},
                                           {"strides", std::vector<int64_t>{2, 2}},
                                           {"ceil_mode", int64_t{1}}});
  const ValueId gmax = g.op("GlobalMaxPool", {c});
  const ValueId scales = g.constant("scales", {4}, std::vector<float>{1, 1, 2, 1.5f});
  const ValueId up = g.op("Resize", {c, kNoValue, scales}, {{"mode", std::string("nearest")}});
  const ValueId smooth = g.op("Resize", {c, kNoValue, scales}, {{"mode", std::string("linear")}});
  g.graph().renameValue(avg, "avg");
  g.graph().renameValue(max, "max");
  g.graph().renameValue(gmax, "gmax");
  g.graph().renameValue(up, "up");
  g.graph().renameValue(smooth, "smooth");
  for (ValueId v : {avg, max, gmax, up, smooth}) g.output(v);
  return g.build();
}

// DBNet's head: x [1, 8, 5, 5] -> Conv 1x1 (16) -> ConvTranspose 2x2 stride
// 2 (16, bias) -> BatchNormalization -> Relu -> ConvTranspose 2x2 stride 2
// (1) -> Sigmoid -> "map"; and beside it an overlapping ConvTranspose
// (3x3, stride 2) -> Relu -> "overlap".
GraphPtr buildUpsamplingGraph() {
  GraphBuilder g("head");
  const ValueId x = g.input("x", DType::kF32, {1, 8, 5, 5});
  const ValueId c = g.op("Conv", {x, g.constant("w", {16, 8, 1, 1}, randomFloats(128, 11))});
  const std::vector<int64_t> two = {2, 2};
  const ValueId up = g.op("ConvTranspose", {c, g.constant("wt", {16, 16, 2, 2}, randomFloats(1024, 12)),
                                            g.constant("bt", {16}, randomFloats(16, 13))},
                          {{"strides", two}});
  std::vector<float> variance = randomFloats(16, 17);
  for (float& v : variance) v = 0.5f + std::fabs(v);
  const ValueId bn = g.op("BatchNormalization", {up, g.constant("gamma", {16}, randomFloats(16, 14)),
                                                 g.constant("beta", {16}, randomFloats(16, 15)),
                                                 g.constant("mean", {16}, randomFloats(16, 16)),
                                                 g.constant("var", {16}, variance)});
  const ValueId map = g.op("Sigmoid", {g.op("ConvTranspose", {g.op("Relu", {bn}),
                                                              g.constant("w1", {16, 1, 2, 2}, randomFloats(64, 18))},
                                            {{"strides", two}})});
  const ValueId overlap = g.op("Relu", {g.op("ConvTranspose", {c, g.constant("w3", {16, 4, 3, 3}, randomFloats(576, 19))},
                                             {{"strides", two}})});
  g.graph().renameValue(map, "map");
  g.graph().renameValue(overlap, "overlap");
  g.output(map);
  g.output(overlap);
  return g.build();
}

// A feature pyramid's top-down step: x [1, 8, 6, 6] -> Conv 1x1 -> c;
// MaxPool 2x2 (x) -> Conv 1x1 -> Resize x2 nearest -> up;
// c * c + up -> "fpn" (not a Conv's fold or residual post-op). The Resize's
// modes come from the test.
std::string fpn_coordinates = "asymmetric";
std::string fpn_rounding = "floor";
GraphPtr buildFpnGraph() {
  GraphBuilder g("fpn");
  const ValueId x = g.input("x", DType::kF32, {1, 8, 6, 6});
  const ValueId c = g.op("Conv", {x, g.constant("w1", {8, 8, 1, 1}, randomFloats(64, 31))});
  const ValueId pooled = g.op("MaxPool", {x}, {{"kernel_shape", std::vector<int64_t>{2, 2}},
                                               {"strides", std::vector<int64_t>{2, 2}}});
  const ValueId coarse = g.op("Conv", {pooled, g.constant("w2", {8, 8, 1, 1}, randomFloats(64, 32))});
  const ValueId scales = g.constant("scales", {4}, std::vector<float>{1, 1, 2, 2});
  const ValueId up = g.op("Resize", {coarse, kNoValue, scales},
                          {{"mode", std::string("nearest")}, {"coordinate_transformation_mode", fpn_coordinates},
                           {"nearest_mode", fpn_rounding}});
  const ValueId fpn = g.op("Add", {g.op("Mul", {c, c}), up});
  g.graph().renameValue(fpn, "fpn");
  g.output(fpn);
  return g.build();
}

Outputs compileAndRun(bool channels_last, const std::vector<float>& input, GraphPtr (*build)() = buildGraph) {
  GraphPtr graph = build();
  // Tests run as parallel processes: each its own files.
  const std::string test = testing::UnitTest::GetInstance()->current_test_info()->name();
  const auto path = std::filesystem::path(testing::TempDir()) / (test + (channels_last ? ".nhwc.kiln" : ".nchw.kiln"));
  CompileOptions options;
  options.channels_last = channels_last;
  compile(*graph, kOpsets, path, options);
  Executor executor(path);
  Outputs result;
  std::vector<std::byte*> out;
  for (const TensorSlot& slot : executor.outputs()) {
    result.names.push_back(slot.name);
    result.values.emplace_back(slot.info.numElements());
  }
  for (auto& v : result.values) out.push_back(reinterpret_cast<std::byte*>(v.data()));
  const std::byte* in[] = {reinterpret_cast<const std::byte*>(input.data())};
  executor.run(in, out);
  for (size_t i = 0; i < executor.stepCount(); ++i) result.kernels.push_back(executor.stepKernel(i));
  return result;
}

void expectSameOutputs(const Outputs& nhwc, const Outputs& nchw) {
  ASSERT_EQ(nhwc.names, nchw.names);
  for (size_t o = 0; o < nchw.values.size(); ++o) {
    ASSERT_EQ(nhwc.values[o].size(), nchw.values[o].size());
    for (size_t i = 0; i < nchw.values[o].size(); ++i) {
      EXPECT_NEAR(nhwc.values[o][i], nchw.values[o][i], 1e-5f * std::max(1.0f, std::fabs(nchw.values[o][i])))
          << nchw.names[o] << "[" << i << "]";
    }
  }
}

TEST(ChannelsLast, SameOutputsUnderTheSameNames) {
  const std::vector<float> input = randomFloats(4 * 8 * 8, 7);
  const Outputs nchw = compileAndRun(false, input);
  const Outputs nhwc = compileAndRun(true, input);
  ASSERT_EQ(nchw.names, (std::vector<std::string>{"features", "pooled", "flat"}));
  EXPECT_EQ(nhwc.names, nchw.names);
  expectSameOutputs(nhwc, nchw);
  auto count = [](const Outputs& r, const std::string& kernel) {
    return std::count(r.kernels.begin(), r.kernels.end(), kernel);
  };
  EXPECT_EQ(count(nchw, "Transpose"), 0);
  EXPECT_EQ(count(nhwc, "Conv"), 0);
  EXPECT_EQ(count(nhwc, "kiln.NhwcConv"), 2);
  EXPECT_EQ(count(nhwc, "kiln.NhwcMaxPool"), 1);
  EXPECT_EQ(count(nhwc, "kiln.NhwcGlobalAveragePool"), 1);
  // x in; "features" and "pooled" out. The Flatten's input goes back from
  // [N, 1, 1, C] to [N, C, 1, 1] too, but that Transpose moves only axes of
  // size 1: a view, not a step.
  EXPECT_EQ(count(nhwc, "Transpose"), 3);
}

TEST(ChannelsLast, PoolsMatchTheirNchwForms) {
  const std::vector<float> input = randomFloats(5 * 9 * 7, 8);
  const Outputs nchw = compileAndRun(false, input, buildPoolGraph);
  const Outputs nhwc = compileAndRun(true, input, buildPoolGraph);
  EXPECT_EQ(nhwc.names, nchw.names);
  expectSameOutputs(nhwc, nchw);
  for (const char* kernel : {"kiln.NhwcAveragePool", "kiln.NhwcMaxPool", "kiln.NhwcGlobalMaxPool"}) {
    EXPECT_EQ(std::count(nhwc.kernels.begin(), nhwc.kernels.end(), kernel), 1) << kernel;
  }
  EXPECT_EQ(std::count(nhwc.kernels.begin(), nhwc.kernels.end(), "kiln.NhwcResize"), 2);
}

// A ConvTranspose whose kernel equals its strides takes the BatchNormalization
// after it into its weights and the Relu as a post-op (its CPU kernel is a
// matmul); the one to a single channel keeps its Sigmoid apart (too few
// columns for oneDNN's post-ops), and the overlapping one its Relu.
TEST(ChannelsLast, NonOverlappingConvTransposeTakesFoldsAndPostOps) {
  const std::vector<float> input = randomFloats(8 * 5 * 5, 20);
  const Outputs nchw = compileAndRun(false, input, buildUpsamplingGraph);
  const Outputs nhwc = compileAndRun(true, input, buildUpsamplingGraph);
  expectSameOutputs(nhwc, nchw);
  auto count = [&](const std::string& kernel) { return std::count(nhwc.kernels.begin(), nhwc.kernels.end(), kernel); };
  EXPECT_EQ(count("kiln.NhwcConvTranspose"), 3);
  // The Sigmoid and the overlapping ConvTranspose's Relu, each its own step.
  EXPECT_EQ(count("Sigmoid") + count("Relu") + count("kiln.FusedElementwise"), 2) << ::testing::PrintToString(nhwc.kernels);
}

// The upsampling is read by the fused step itself where its modes map output
// row y to input row y / 2; align_corners does not, and keeps its Resize.
TEST(ChannelsLast, NearestUpsamplingFusesIntoTheElementwiseStep) {
  const std::vector<float> input = randomFloats(8 * 6 * 6, 34);
  const std::pair<const char*, const char*> fused[] = {
      {"asymmetric", "floor"}, {"half_pixel", "round_prefer_floor"}, {"pytorch_half_pixel", "round_prefer_ceil"},
      {"tf_half_pixel_for_nearest", "floor"}};
  for (const auto& [coordinates, rounding] : fused) {
    fpn_coordinates = coordinates;
    fpn_rounding = rounding;
    const Outputs nchw = compileAndRun(false, input, buildFpnGraph);
    const Outputs nhwc = compileAndRun(true, input, buildFpnGraph);
    expectSameOutputs(nhwc, nchw);
    EXPECT_EQ(std::count(nhwc.kernels.begin(), nhwc.kernels.end(), "kiln.NhwcResize"), 0) << coordinates;
    EXPECT_EQ(std::count(nhwc.kernels.begin(), nhwc.kernels.end(), "kiln.FusedElementwise"), 1) << coordinates;
  }
  fpn_coordinates = "align_corners";
  fpn_rounding = "round_prefer_floor";
  const Outputs nchw = compileAndRun(false, input, buildFpnGraph);
  const Outputs nhwc = compileAndRun(true, input, buildFpnGraph);
  expectSameOutputs(nhwc, nchw);
  EXPECT_EQ(std::count(nhwc.kernels.begin(), nhwc.kernels.end(), "kiln.NhwcResize"), 1);
}

TEST(ChannelsLast, PassKeepsTypesConsistentWithInference) {
  GraphPtr graph = buildGraph();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(convertToChannelsLast(*graph), 4u);  // two Convs, MaxPool, GlobalAveragePool
  std::map<ValueId, ValueType> after_pass;
  for (ValueId id = 0; id < graph->valueCount(); ++id) after_pass[id] = graph->value(id).type;
  inferTypes(*graph, kOpsets);
  for (NodeId id : graph->nodeIds()) {
    for (ValueId v : graph->node(id).outputs) {
      EXPECT_EQ(graph->value(v).type, after_pass[v]) << graph->value(v).name;
    }
  }
  EXPECT_TRUE(graph->findValue("features/nhwc").has_value());
  const ValueId features = *graph->findValue("features");
  EXPECT_EQ(graph->node(graph->value(features).producer).op_type, "Transpose");
  verifyGraph(*graph, /*require_types=*/true);
}

TEST(ChannelsLast, LeavesGraphsWithoutConvolutionsAlone) {
  GraphBuilder g;
  const ValueId x = g.input("x", DType::kF32, {1, 3, 4, 4});
  g.output(g.op("Relu", {g.op("Add", {x, x})}));
  GraphPtr graph = g.build();
  inferTypes(*graph, kOpsets);
  const std::string before = graph->toString();
  EXPECT_EQ(convertToChannelsLast(*graph), 0u);
  EXPECT_EQ(graph->toString(), before);
}

}  // namespace
}  // namespace kiln
