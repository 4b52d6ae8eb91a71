#include "passes/conv_tap_trimming.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"

namespace kiln {
namespace {

const std::map<std::string, int64_t> kOpsets = {{"", 17}};

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return v;
}

std::vector<float> floatsOf(const Graph& graph, ValueId id) {
  const ConstantPtr& c = graph.value(id).initializer;
  if (!c) return {};
  std::vector<float> values(static_cast<size_t>(c->info.numElements()));
  std::memcpy(values.data(), c->bytes.data(), c->bytes.size());
  return values;
}

struct OneConv {
  GraphPtr graph;
  NodeId conv;
  ValueId y;
};

// x [shape] -> Conv(w [out, in, kernel...], attributes) -> y.
OneConv buildConv(const std::vector<int64_t>& x_shape, const std::vector<int64_t>& w_shape, Attributes attributes,
                  bool share_weights = false) {
  GraphBuilder b;
  const ValueId x = b.input("x", DType::kF32, x_shape);
  int64_t count = 1;
  for (int64_t d : w_shape) count *= d;
  const ValueId w = b.constant<float>("w", w_shape, ramp(static_cast<size_t>(count)));
  const ValueId y = b.op("Conv", {x, w}, std::move(attributes));
  b.output(y);
  if (share_weights) b.output(b.op("Conv", {x, w}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}}));
  GraphPtr graph = b.build();
  inferTypes(*graph, kOpsets);
  return {graph, graph->nodeIds()[0], y};
}

TEST(ConvTapTrimming, OneRowMapKeepsTheMiddleKernelRow) {
  OneConv m = buildConv({1, 2, 1, 10}, {3, 2, 3, 3}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const std::string before = m.graph->value(m.y).type.toString();
  EXPECT_EQ(trimPaddingTaps(*m.graph), 1u);
  inferTypes(*m.graph, kOpsets);
  const Node& conv = m.graph->node(m.conv);
  EXPECT_EQ(conv.intsAttribute("kernel_shape", {}), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(conv.intsAttribute("pads", {}), (std::vector<int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(m.graph->value(m.y).type.toString(), before);
  // w[m][c][1][j] of the ramp: 9 * (2 m + c) + 3 + j.
  std::vector<float> want;
  for (int mc = 0; mc < 6; ++mc) {
    for (int j = 0; j < 3; ++j) want.push_back(static_cast<float>(9 * mc + 3 + j));
  }
  EXPECT_EQ(floatsOf(*m.graph, conv.inputs[1]), want);
}

TEST(ConvTapTrimming, WideKernelOverASmallMap) {
  // 5x5 with pads 2 over 2x2: output positions 0 and 1 read taps 1-3 only.
  OneConv m = buildConv({1, 1, 2, 2}, {1, 1, 5, 5}, {{"pads", std::vector<int64_t>{2, 2, 2, 2}}});
  EXPECT_EQ(trimPaddingTaps(*m.graph), 1u);
  inferTypes(*m.graph, kOpsets);
  const Node& conv = m.graph->node(m.conv);
  EXPECT_EQ(conv.intsAttribute("kernel_shape", {}), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(conv.intsAttribute("pads", {}), (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(m.graph->value(m.y).type.toString(), "f32[1, 1, 2, 2]");
  EXPECT_EQ(floatsOf(*m.graph, conv.inputs[1]), (std::vector<float>{6, 7, 8, 11, 12, 13, 16, 17, 18}));
}

TEST(ConvTapTrimming, DilatedKernelOverOneRow) {
  // Dilation 2, pads 2 over one row: of taps at -2, 0 and 2 only the middle reads it.
  OneConv m = buildConv({1, 1, 1, 7}, {1, 1, 3, 3},
                        {{"pads", std::vector<int64_t>{2, 2, 2, 2}}, {"dilations", std::vector<int64_t>{2, 2}}});
  EXPECT_EQ(trimPaddingTaps(*m.graph), 1u);
  inferTypes(*m.graph, kOpsets);
  const Node& conv = m.graph->node(m.conv);
  EXPECT_EQ(conv.intsAttribute("kernel_shape", {}), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(conv.intsAttribute("pads", {}), (std::vector<int64_t>{0, 2, 0, 2}));
  EXPECT_EQ(m.graph->value(m.y).type.toString(), "f32[1, 1, 1, 7]");
}

TEST(ConvTapTrimming, LeavesConvsThatReadEveryTap) {
  OneConv m = buildConv({1, 2, 5, 5}, {3, 2, 3, 3}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  EXPECT_EQ(trimPaddingTaps(*m.graph), 0u);
  EXPECT_FALSE(m.graph->node(m.conv).hasAttribute("kernel_shape"));
  // SAME padding is computed by shape inference: left alone.
  OneConv same = buildConv({1, 2, 1, 5}, {3, 2, 3, 3}, {{"auto_pad", std::string("SAME_UPPER")}});
  EXPECT_EQ(trimPaddingTaps(*same.graph), 0u);
}

TEST(ConvTapTrimming, SharedWeightsStayForTheirOtherReaders) {
  OneConv m = buildConv({1, 2, 1, 10}, {3, 2, 3, 3}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}},
                        /*share_weights=*/true);
  EXPECT_EQ(trimPaddingTaps(*m.graph), 2u);
  const ValueId original = *m.graph->findValue("w");
  EXPECT_EQ(floatsOf(*m.graph, original), ramp(54));
  for (NodeId id : m.graph->nodeIds()) EXPECT_NE(m.graph->node(id).inputs[1], original);
}

}  // namespace
}  // namespace kiln
