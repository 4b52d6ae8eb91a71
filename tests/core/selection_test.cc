// NonZero positions and NonMaxSuppression (core/selection.h), on cases whose
// answers are worked out by hand; the ONNX node tests check both ops
// against the reference too.
#include "core/selection.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "core/float_formats.h"
#include "kiln/error.h"

namespace kiln {
namespace {

const std::byte* bytesOf(const void* data) { return static_cast<const std::byte*>(data); }

TEST(NonZero, PositionsInRowMajorOrderWithSignedZerosAndNaN) {
  // [[1, -0], [NaN, 0], [0, 2.5]]: -0 is zero, NaN is not.
  const float x[] = {1, -0.0f, std::nanf(""), 0, 0, 2.5f};
  const std::vector<int64_t> shape{3, 2};
  ASSERT_EQ(countNonZero(bytesOf(x), DType::kF32, 6), 3u);
  int64_t out[6];
  writeNonZeroPositions(bytesOf(x), DType::kF32, shape, out, 3);
  EXPECT_EQ(std::vector<int64_t>(out, out + 6), (std::vector<int64_t>{0, 1, 2, 0, 0, 1}));  // rows, then columns
  // Fewer columns than there are non-zero elements: the first ones.
  writeNonZeroPositions(bytesOf(x), DType::kF32, shape, out, 2);
  EXPECT_EQ(std::vector<int64_t>(out, out + 4), (std::vector<int64_t>{0, 1, 0, 0}));
}

TEST(NonZero, EveryElementKind) {
  const uint16_t halves[] = {0x8000, floatToHalf(0.5f), 0};  // -0, 0.5, 0
  EXPECT_EQ(countNonZero(bytesOf(halves), DType::kF16, 3), 1u);
  EXPECT_EQ(countNonZero(bytesOf(halves), DType::kBF16, 3), 1u);
  const int64_t ints[] = {0, 1ll << 40, -1};
  EXPECT_EQ(countNonZero(bytesOf(ints), DType::kI64, 3), 2u);
  const uint8_t flags[] = {1, 0, 0, 1};
  EXPECT_EQ(countNonZero(bytesOf(flags), DType::kBool, 4), 2u);
}

// Boxes [y1, x1, y2, x2] in one batch: 0 and 1 overlap with IoU 0.6, 2 is
// apart, 3 equals 0.
const float kBoxes[] = {0, 0, 1, 1, 0, 0.25f, 1, 1.25f, 0, 2, 1, 3, 1, 1, 0, 0};

TEST(NonMaxSuppression, KeepsTheBestOfEachOverlappingGroup) {
  const float scores[] = {0.9f, 0.95f, 0.5f, 0.9f};  // one class
  NonMaxSuppressionOptions options;
  options.max_boxes_per_class = 10;
  options.iou_threshold = 0.5f;
  // Box 1 first; 0 and 3 overlap it by 0.6 and go; 2 stays.
  EXPECT_EQ(nonMaxSuppression(kBoxes, scores, 1, 1, 4, options), (std::vector<int64_t>{0, 0, 1, 0, 0, 2}));
  options.iou_threshold = 0.7f;  // 0.6 no longer suppresses; 3 (same box as 0) still does
  EXPECT_EQ(nonMaxSuppression(kBoxes, scores, 1, 1, 4, options),
            (std::vector<int64_t>{0, 0, 1, 0, 0, 0, 0, 0, 2}));
  options.max_boxes_per_class = 1;
  EXPECT_EQ(nonMaxSuppression(kBoxes, scores, 1, 1, 4, options), (std::vector<int64_t>{0, 0, 1}));
  options.max_boxes_per_class = 0;  // absent input: nothing
  EXPECT_TRUE(nonMaxSuppression(kBoxes, scores, 1, 1, 4, options).empty());
}

TEST(NonMaxSuppression, TiesGoToTheLowerIndexAndThresholdsAreStrict) {
  const float scores[] = {0.9f, 0.9f, 0.5f, 0.9f};
  NonMaxSuppressionOptions options;
  options.max_boxes_per_class = 10;
  options.iou_threshold = 0.99f;
  options.score_threshold = 0.5f;  // box 2's 0.5 is not above it
  // Equal scores: 0, 1, 3 in index order; 3 is box 0 again (IoU 1 > 0.99).
  EXPECT_EQ(nonMaxSuppression(kBoxes, scores, 1, 1, 4, options), (std::vector<int64_t>{0, 0, 0, 0, 0, 1}));
}

TEST(NonMaxSuppression, CenterPointBoxesAndSeveralBatchesAndClasses) {
  // The same two boxes as centers: (0.5, 0.5, 1, 1) and (2.5, 0.5, 1, 1), per batch.
  const float boxes[] = {0.5f, 0.5f, 1, 1, 2.5f, 0.5f, 1, 1, 0.5f, 0.5f, 1, 1, 0.6f, 0.5f, 1, 1};
  // [batch 2, class 2, box 2]
  const float scores[] = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f, std::nanf("")};
  NonMaxSuppressionOptions options;
  options.max_boxes_per_class = 5;
  options.iou_threshold = 0.5f;
  options.center_point_box = true;
  // Batch 0: boxes apart, both kept per class, by falling score. Batch 1:
  // boxes overlap (IoU 0.82): the better one only; NaN scores go last.
  EXPECT_EQ(nonMaxSuppression(boxes, scores, 2, 2, 2, options),
            (std::vector<int64_t>{0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 1, 0, 1, 0, 1, 1, 1, 0}));
}

TEST(Compress, CountsTheTrueConditionsWithinTheAxis) {
  const uint8_t condition[] = {1, 0, 1, 1};
  EXPECT_EQ(countSelected(condition, 4, 4), 3u);
  EXPECT_EQ(countSelected(condition, 4, 2), 1u);  // the axis is shorter: the rest is not read
}

TEST(Unique, SortedOrByFirstOccurrenceWithCountsAndInverse) {
  const float x[] = {2, 1, 1, 3, 4, 3};
  const UniqueSlices sorted = uniqueSlices(bytesOf(x), DType::kF32, 1, 6, 1, true);
  EXPECT_EQ(sorted.first, (std::vector<int64_t>{1, 0, 3, 4}));  // values 1, 2, 3, 4
  EXPECT_EQ(sorted.inverse, (std::vector<int64_t>{1, 0, 0, 2, 3, 2}));
  EXPECT_EQ(sorted.counts, (std::vector<int64_t>{2, 1, 2, 1}));
  const UniqueSlices unsorted = uniqueSlices(bytesOf(x), DType::kF32, 1, 6, 1, false);
  EXPECT_EQ(unsorted.first, (std::vector<int64_t>{0, 1, 3, 4}));  // values 2, 1, 3, 4
  EXPECT_EQ(unsorted.inverse, (std::vector<int64_t>{0, 1, 1, 2, 3, 2}));
  EXPECT_EQ(unsorted.counts, (std::vector<int64_t>{1, 2, 2, 1}));
}

TEST(Unique, RowsAlongAnAxisCompareElementByElement) {
  // Rows of [[1, 0], [0, 5], [1, 0], [0, 2]]: [0, 2] < [0, 5] < [1, 0].
  const int64_t x[] = {1, 0, 0, 5, 1, 0, 0, 2};
  const UniqueSlices rows = uniqueSlices(bytesOf(x), DType::kI64, 1, 4, 2, true);
  EXPECT_EQ(rows.first, (std::vector<int64_t>{3, 1, 0}));
  EXPECT_EQ(rows.inverse, (std::vector<int64_t>{2, 1, 2, 0}));
  EXPECT_EQ(rows.counts, (std::vector<int64_t>{1, 1, 2}));
  const uint8_t strings[] = {'a'};
  EXPECT_THROW(uniqueSlices(bytesOf(strings), DType::kF8E4M3, 1, 1, 1, true), UsageError);
}

}  // namespace
}  // namespace kiln
