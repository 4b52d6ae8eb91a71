// The six worked examples of the reference's effective-shape rule: the
// replication-factor dimension, then the repeats dimension, each added only
// when it applies.
#include <gtest/gtest.h>

#include "kiln/metadata.h"

namespace kiln {
namespace {

struct ShapeCase {
  bool use_remote_buffers;
  uint32_t repeats;
  uint32_t replication_factor;
  bool is_per_replica;
  std::vector<int64_t> expected;
};

class EffectiveShape : public ::testing::TestWithParam<ShapeCase> {};

TEST_P(EffectiveShape, MatchesTheReference) {
  const ShapeCase& c = GetParam();
  Anchor anchor;
  anchor.info = {DType::kF32, {8, 3, 1}};
  anchor.use_remote_buffers = c.use_remote_buffers;
  anchor.repeats = c.repeats;
  anchor.is_per_replica = c.is_per_replica;
  const TensorInfo effective = effectiveTensorInfo(anchor, c.replication_factor);
  EXPECT_EQ(effective.shape, c.expected);
  EXPECT_EQ(effective.dtype, DType::kF32);
}

INSTANTIATE_TEST_SUITE_P(ReferenceExamples, EffectiveShape,
                         ::testing::Values(ShapeCase{true, 3, 2, true, {2, 3, 8, 3, 1}},  // 1)
                                           ShapeCase{true, 3, 1, true, {3, 8, 3, 1}},     // 2)
                                           ShapeCase{true, 3, 2, false, {3, 8, 3, 1}},    // 3)
                                           ShapeCase{false, 1, 1, false, {8, 3, 1}},      // 4)
                                           ShapeCase{false, 3, 2, true, {2, 8, 3, 1}},    // 5)
                                           ShapeCase{true, 1, 2, true, {2, 8, 3, 1}}));   // 6)

TEST(Metadata, ValidationNamesTheProblem) {
  Metadata m;
  m.executable = "exe";
  m.programs = {{0, "main"}};
  m.program_flow.main = {0};
  EXPECT_EQ(findMetadataProblem(m), "");

  Metadata bad = m;
  bad.program_flow.load = {7};
  EXPECT_NE(findMetadataProblem(bad).find("program 7"), std::string::npos);

  bad = m;
  bad.replication_factor = 0;
  EXPECT_NE(findMetadataProblem(bad).find("replication factor"), std::string::npos);

  Anchor a;
  a.name = "x";
  a.handle = "h";
  a.info = {DType::kF32, {2}};
  a.programs = {0};
  bad = m;
  bad.anchors = {a, a};
  bad.anchors[1].handle = "h2";
  EXPECT_NE(findMetadataProblem(bad).find("two input anchors are named 'x'"), std::string::npos);

  bad = m;
  bad.anchors = {a, a};
  bad.anchors[1].direction = AnchorDirection::kOutput;  // same name, other direction: allowed...
  EXPECT_NE(findMetadataProblem(bad).find("handle 'h'"), std::string::npos);  // ...but not the same handle
  bad.anchors[1].handle = "d2h";
  EXPECT_EQ(findMetadataProblem(bad), "");

  bad = m;
  bad.anchors = {a};
  bad.anchors[0].batch_dim = 1;
  EXPECT_NE(findMetadataProblem(bad).find("batch dimension 1 but rank 1"), std::string::npos);

  bad = m;
  bad.anchors = {a};
  bad.anchors[0].repeats = 0;
  EXPECT_NE(findMetadataProblem(bad).find("repeats 0"), std::string::npos);
}

TEST(Metadata, AnchorsByDirection) {
  Metadata m;
  Anchor in;
  in.name = "a";
  Anchor out;
  out.name = "b";
  out.direction = AnchorDirection::kOutput;
  m.anchors = {in, out};
  ASSERT_EQ(m.inputs().size(), 1u);
  EXPECT_EQ(m.inputs()[0]->name, "a");
  ASSERT_EQ(m.outputs().size(), 1u);
  EXPECT_EQ(m.findAnchor("b", AnchorDirection::kOutput), &m.anchors[1]);
  EXPECT_EQ(m.findAnchor("b", AnchorDirection::kInput), nullptr);
}

}  // namespace
}  // namespace kiln
