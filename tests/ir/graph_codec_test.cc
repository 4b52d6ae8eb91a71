// Graph codec: round trips (symbolic dims, every attribute kind, subgraphs,
// initializers inline and by name) and corrupt encodings.
#include "ir/graph_codec.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>

#include "kiln/error.h"

namespace kiln {
namespace {

ConstantPtr floats(std::vector<float> values, std::vector<int64_t> shape) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return makeConstant(TensorInfo{DType::kF32, std::move(shape)}, std::move(bytes));
}

// x[batch, 4] -> Add(w) -> If(cond){then: Relu(outer y), else: Neg(outer y)}
Graph sampleGraph() {
  Graph graph("main");
  const ValueId x = graph.addInput("x", ValueType{DType::kF32, std::vector<Dim>{Dim::symbolic("batch"), Dim::known(4)}});
  const ValueId cond = graph.addInput("cond", ValueType::tensor(DType::kBool, {}));
  const ValueId w = graph.addInitializer("w", floats({1, 2, 3, 4}, {4}));
  const ValueId big = graph.addInitializer("big", floats(std::vector<float>(300, 0.5f), {300}));
  (void)big;
  const NodeId add = graph.addNode("Add", {x, w}, {"y"}, {{"note", std::string("plain")}});
  auto then_branch = std::make_shared<Graph>("then");
  const ValueId y_then = then_branch->addOuterScopeValue("y");
  then_branch->addOutput(then_branch->node(then_branch->addNode("Relu", {y_then}, {"t"})).outputs[0]);
  auto else_branch = std::make_shared<Graph>("else");
  const ValueId y_else = else_branch->addOuterScopeValue("y");
  else_branch->addOutput(else_branch->node(else_branch->addNode("Neg", {y_else}, {"e"})).outputs[0]);
  Attributes attributes{{"then_branch", GraphPtr(then_branch)},
                        {"else_branch", GraphPtr(else_branch)},
                        {"i", int64_t{-7}},
                        {"f", 2.5f},
                        {"ints", std::vector<int64_t>{1, -2, 3}},
                        {"floats", std::vector<float>{0.25f}},
                        {"strings", std::vector<std::string>{"a", ""}},
                        {"tensor", floats({9}, {1})},
                        {"tensors", std::vector<ConstantPtr>{floats({1, 2}, {2})}}};
  const NodeId branch = graph.addNode("If", {cond}, {"z"}, attributes);
  graph.value(graph.node(add).outputs[0]).type = ValueType{DType::kF32, std::vector<Dim>{Dim::symbolic("batch"), Dim::known(4)}};
  graph.addOutput(graph.node(branch).outputs[0]);
  return graph;
}

TEST(GraphCodec, RoundTripKeepsTheGraph) {
  const Graph graph = sampleGraph();
  const auto bytes = encodeGraph(graph);
  const Graph decoded = decodeGraph(bytes, "test");
  EXPECT_EQ(decoded.toString(), graph.toString());
  EXPECT_EQ(decoded.value(decoded.inputs()[0]).type.toString(), "f32[batch, 4]");
  const Node& branch = decoded.node(decoded.nodeIds().back());
  EXPECT_EQ(branch.intAttribute("i", 0), -7);
  EXPECT_EQ(branch.intsAttribute("ints", {}), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(branch.subgraphs().size(), 2u);
  EXPECT_EQ(encodeGraph(decoded), bytes);  // stable
}

TEST(GraphCodec, LargeInitializersCanStayOutside) {
  const Graph graph = sampleGraph();
  auto keep_out = [](const Value& value) { return value.initializer->bytes.size() > 100; };
  const auto bytes = encodeGraph(graph, keep_out);
  EXPECT_LT(bytes.size(), encodeGraph(graph).size() - 1000);
  EXPECT_THROW(decodeGraph(bytes, "test"), FormatError);  // nobody resolves 'big'
  const ConstantPtr big = graph.value(*graph.findValue("big")).initializer;
  std::vector<std::string> asked;
  const Graph decoded = decodeGraph(bytes, "test", [&](const std::string& name) {
    asked.push_back(name);
    return name == "big" ? big : nullptr;
  });
  EXPECT_EQ(asked, std::vector<std::string>{"big"});
  EXPECT_EQ(decoded.value(*decoded.findValue("big")).initializer, big);  // shared, not copied
}

TEST(GraphCodec, EveryTruncationIsAFormatError) {
  const auto bytes = encodeGraph(sampleGraph());
  for (size_t size = 0; size < bytes.size(); ++size) {
    EXPECT_THROW(decodeGraph(std::span(bytes).first(size), "test"), FormatError) << size;
  }
}

// A constant of dtype 0 (undefined, no element size) declared 2^62 elements
// in 0 bytes and was accepted (issue 12).
TEST(GraphCodec, ConstantWithoutDtypeIsRefused) {
  Graph graph("main");
  const std::vector<float> marker = {1.5f, -2.25f, 3.125f, 7.75f};
  const ValueId w = graph.addInitializer("w", floats(marker, {4}));
  graph.addOutput(graph.node(graph.addNode("Neg", {w}, {"y"})).outputs[0]);
  auto bytes = encodeGraph(graph);
  std::vector<std::byte> data(16);
  std::memcpy(data.data(), marker.data(), 16);
  const auto at = std::search(bytes.begin(), bytes.end(), data.begin(), data.end());
  ASSERT_NE(at, bytes.end());
  // Before the data: u8 dtype, u32 rank (1), i64 dimension (4), u64 size (16).
  const auto data_offset = static_cast<size_t>(at - bytes.begin());
  const int64_t huge = int64_t{1} << 62;
  const uint64_t none = 0;
  ASSERT_EQ(bytes[data_offset - 21], static_cast<std::byte>(DType::kF32));
  bytes[data_offset - 21] = std::byte{0};
  std::memcpy(&bytes[data_offset - 16], &huge, 8);
  std::memcpy(&bytes[data_offset - 8], &none, 8);
  bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(data_offset),
              bytes.begin() + static_cast<std::ptrdiff_t>(data_offset + 16));
  try {
    decodeGraph(bytes, "test");
    ADD_FAILURE() << "a constant without a dtype was decoded";
  } catch (const FormatError& error) {
    EXPECT_NE(std::string(error.what()).find("a constant has no dtype"), std::string::npos) << error.what();
  }
}

TEST(GraphCodec, CorruptBytesNeverCrash) {
  const auto original = encodeGraph(sampleGraph());
  for (size_t i = 0; i < original.size(); ++i) {
    for (uint8_t flip : {0x01, 0x80, 0xFF}) {
      auto bytes = original;
      bytes[i] ^= static_cast<std::byte>(flip);
      try {
        decodeGraph(bytes, "test");
      } catch (const Error&) {
        // A clear error is the expected outcome for most flips.
      }
    }
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// `KILN_GRAPH_SEED=path kiln_ir_tests --gtest_filter=GraphCodec.FuzzSeed`
// writes the sample graph's encoding: the seed of graph_codec_fuzz.
TEST(GraphCodec, FuzzSeed) {
  const char* path = std::getenv("KILN_GRAPH_SEED");
  if (path == nullptr) GTEST_SKIP() << "set KILN_GRAPH_SEED to write the fuzz seed";
  const auto bytes = encodeGraph(sampleGraph());
  std::FILE* file = std::fopen(path, "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), file), bytes.size());
  std::fclose(file);
}

}  // namespace
}  // namespace kiln
