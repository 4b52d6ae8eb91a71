#include "passes/batchnorm_folding.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

const std::map<std::string, int64_t> kOpsets = {{"", 17}};

// Conv: 2 input channels -> 3 output channels, 3x3 kernel.
constexpr int64_t kOut = 3, kIn = 2, kK = 3;

std::vector<float> floatsOf(const Graph& graph, ValueId id) {
  const ConstantPtr& c = graph.value(id).initializer;
  EXPECT_TRUE(c != nullptr);
  if (!c) return {};
  EXPECT_EQ(c->info.dtype, DType::kF32);
  std::vector<float> values(static_cast<size_t>(c->info.numElements()));
  std::memcpy(values.data(), c->bytes.data(), c->bytes.size());
  return values;
}

std::vector<std::string> opsOf(const Graph& graph) {
  std::vector<std::string> ops;
  for (NodeId id : graph.nodeIds()) ops.push_back(graph.node(id).op_type);
  return ops;
}

std::vector<float> ramp(size_t n, float start, float step) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + step * static_cast<float>(i);
  return v;
}

struct Params {
  std::vector<float> w = ramp(kOut * kIn * kK * kK, -0.5f, 0.02f);
  std::vector<float> bias = {0.1f, -0.2f, 0.3f};
  std::vector<float> scale = {1.5f, 0.5f, -2.0f};
  std::vector<float> beta = {0.05f, 0.0f, -0.4f};
  std::vector<float> mean = {0.2f, -0.1f, 0.7f};
  std::vector<float> var = {0.9f, 0.25f, 2.0f};
};

// Expected W' and B', in double as the pass computes them.
std::pair<std::vector<float>, std::vector<float>> expectedFold(const Params& p, bool with_bias, double epsilon) {
  std::vector<float> w(p.w.size()), b(kOut);
  const size_t per_channel = p.w.size() / kOut;
  for (size_t m = 0; m < kOut; ++m) {
    const double a = double{p.scale[m]} / std::sqrt(double{p.var[m]} + epsilon);
    for (size_t i = 0; i < per_channel; ++i) {
      w[m * per_channel + i] = static_cast<float>(double{p.w[m * per_channel + i]} * a);
    }
    b[m] = static_cast<float>(((with_bias ? double{p.bias[m]} : 0.0) - double{p.mean[m]}) * a + double{p.beta[m]});
  }
  return {w, b};
}

void expectNear(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6f * (1 + std::abs(want[i]))) << i;
}

// x -> Conv -> BatchNormalization -> Relu -> y. Returns the builder's graph
// and the Conv's output.
struct ConvBn {
  GraphPtr graph;
  ValueId conv_out;
  ValueId relu_out;
};

ConvBn buildConvBn(const Params& p, bool with_bias, Attributes bn_attributes = {}, bool mean_is_input = false,
                   bool conv_out_also_output = false) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, kIn, 5, 5});
  const ValueId w = b.constant<float>("w", {kOut, kIn, kK, kK}, p.w);
  std::vector<ValueId> conv_inputs = {x, w};
  if (with_bias) conv_inputs.push_back(b.constant<float>("b", {kOut}, p.bias));
  const ValueId conv = b.op("Conv", conv_inputs, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const ValueId mean = mean_is_input ? b.input("mean", DType::kF32, {kOut}) : b.constant<float>("mean", {kOut}, p.mean);
  const ValueId bn = b.op("BatchNormalization",
                          {conv, b.constant<float>("scale", {kOut}, p.scale), b.constant<float>("beta", {kOut}, p.beta),
                           mean, b.constant<float>("var", {kOut}, p.var)},
                          std::move(bn_attributes));
  const ValueId relu = b.op("Relu", {bn});
  b.output(relu);
  if (conv_out_also_output) b.output(conv);
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  return {graph, conv, relu};
}

TEST(BatchNormFolding, FoldsIntoConvWithBias) {
  const Params p;
  ConvBn m = buildConvBn(p, /*with_bias=*/true);
  EXPECT_EQ(foldBatchNormIntoConv(*m.graph), 1u);
  inferTypes(*m.graph, kOpsets);
  const Graph& g = *m.graph;
  EXPECT_EQ(opsOf(g), (std::vector<std::string>{"Conv", "Relu"}));
  const Node& conv = g.node(g.nodeIds()[0]);
  const Node& relu = g.node(g.nodeIds()[1]);
  EXPECT_EQ(relu.inputs, (std::vector<ValueId>{m.conv_out}));
  ASSERT_EQ(conv.inputs.size(), 3u);
  EXPECT_EQ(conv.outputs, (std::vector<ValueId>{m.conv_out}));
  EXPECT_EQ(conv.intsAttribute("pads", {}), (std::vector<int64_t>{1, 1, 1, 1}));
  const auto [want_w, want_b] = expectedFold(p, true, 1e-5);
  expectNear(floatsOf(g, conv.inputs[1]), want_w);
  expectNear(floatsOf(g, conv.inputs[2]), want_b);
  EXPECT_EQ(g.value(conv.inputs[1]).type.toString(), "f32[3, 2, 3, 3]");
  EXPECT_EQ(g.value(conv.inputs[2]).type.toString(), "f32[3]");
  // The original weights are untouched; the new ones have their own names.
  EXPECT_EQ(floatsOf(g, *g.findValue("w")), p.w);
  EXPECT_EQ(floatsOf(g, *g.findValue("b")), p.bias);
  EXPECT_NE(g.value(conv.inputs[1]).name, "w");
  EXPECT_EQ(g.outputs(), (std::vector<ValueId>{m.relu_out}));
  EXPECT_EQ(g.value(m.relu_out).type.toString(), "f32[1, 3, 5, 5]");
  EXPECT_TRUE(findGraphProblems(g, /*require_types=*/true).empty());
}

TEST(BatchNormFolding, FoldsIntoConvWithoutBiasUsingEpsilon) {
  const Params p;
  ConvBn m = buildConvBn(p, /*with_bias=*/false, {{"epsilon", 1e-2f}});
  EXPECT_EQ(foldBatchNormIntoConv(*m.graph), 1u);
  inferTypes(*m.graph, kOpsets);
  const Graph& g = *m.graph;
  EXPECT_EQ(opsOf(g), (std::vector<std::string>{"Conv", "Relu"}));
  const Node& conv = g.node(g.nodeIds()[0]);
  ASSERT_EQ(conv.inputs.size(), 3u);
  const auto [want_w, want_b] = expectedFold(p, false, double{1e-2f});
  expectNear(floatsOf(g, conv.inputs[1]), want_w);
  expectNear(floatsOf(g, conv.inputs[2]), want_b);
  EXPECT_EQ(g.value(conv.inputs[2]).users, (std::vector<Use>{{g.nodeIds()[0], 2}}));
  EXPECT_TRUE(findGraphProblems(g, /*require_types=*/true).empty());
}

TEST(BatchNormFolding, LeavesConvWithAnotherUserAlone) {
  ConvBn m = buildConvBn(Params{}, true, {}, false, /*conv_out_also_output=*/true);
  EXPECT_EQ(foldBatchNormIntoConv(*m.graph), 0u);
  EXPECT_EQ(opsOf(*m.graph), (std::vector<std::string>{"Conv", "BatchNormalization", "Relu"}));

  // A second reader of the Conv's output.
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 1, 4, 4});
  const ValueId conv = b.op("Conv", {x, b.constant<float>("w", {1, 1, 1, 1}, {2.0f})});
  const ValueId one = b.constant<float>("one", {1}, {1.0f});
  const ValueId zero = b.constant<float>("zero", {1}, {0.0f});
  b.output(b.op("BatchNormalization", {conv, one, zero, zero, one}));
  b.output(b.op("Relu", {conv}));
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(foldBatchNormIntoConv(*graph), 0u);
  EXPECT_EQ(opsOf(*graph), (std::vector<std::string>{"Conv", "BatchNormalization", "Relu"}));
}

TEST(BatchNormFolding, LeavesNonConstantParametersAlone) {
  ConvBn m = buildConvBn(Params{}, true, {}, /*mean_is_input=*/true);
  EXPECT_EQ(foldBatchNormIntoConv(*m.graph), 0u);
  EXPECT_EQ(opsOf(*m.graph), (std::vector<std::string>{"Conv", "BatchNormalization", "Relu"}));
}

TEST(BatchNormFolding, LeavesTrainingModeAlone) {
  ConvBn m = buildConvBn(Params{}, true, {{"training_mode", int64_t{1}}});
  EXPECT_EQ(foldBatchNormIntoConv(*m.graph), 0u);
  EXPECT_EQ(opsOf(*m.graph), (std::vector<std::string>{"Conv", "BatchNormalization", "Relu"}));
}

TEST(BatchNormFolding, LeavesBatchNormThatIsAGraphOutputAlone) {
  // Folding would rename the model's output to the Conv's.
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, {1, 1, 4, 4});
  const ValueId conv = b.op("Conv", {x, b.constant<float>("w", {1, 1, 1, 1}, {2.0f})});
  const ValueId one = b.constant<float>("one", {1}, {1.0f});
  const ValueId zero = b.constant<float>("zero", {1}, {0.0f});
  b.output(b.op("BatchNormalization", {conv, one, zero, zero, one}));
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  EXPECT_EQ(foldBatchNormIntoConv(*graph), 0u);
}

}  // namespace
}  // namespace kiln
