// Selections whose output size depends on the values they read: ONNX
// NonZero, NonMaxSuppression, Compress and Unique. One implementation serves both shape
// inference (which, when the inputs are constants, needs the output's size)
// and the CPU kernels (which write the values), so the two always agree.
//
// In a model these ops read values computed at run time: the compiler cannot
// size their outputs ahead, and DynamicExecutor evaluates them on the host
// as the model runs, specializing what follows on the sizes they gave
// (src/compiler/runtime_shapes.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/tensor_info.h"

namespace kiln {

// Whether the element at `data` of `dtype` is non-zero: any bit set for
// integers and bools, a value other than +0 or -0 for floats (NaN counts).
bool isNonZeroElement(const std::byte* data, DType dtype);

// How many of the `elements` elements at `data` are non-zero.
uint64_t countNonZero(const std::byte* data, DType dtype, uint64_t elements);

// NonZero of `data` (`shape`, at least rank 1) into `out`: the positions of
// its first `count` non-zero elements in row-major order, as the
// [rank, count] int64 matrix NonZero gives (row d holds the coordinates
// along axis d). Allocates nothing.
void writeNonZeroPositions(const std::byte* data, DType dtype, const std::vector<int64_t>& shape, int64_t* out,
                           uint64_t count);

struct NonMaxSuppressionOptions {
  int64_t max_boxes_per_class = 0;       // input 2 (absent: 0, which selects nothing)
  float iou_threshold = 0;               // input 3; a box whose IoU with a kept one exceeds it goes
  std::optional<float> score_threshold;  // input 4; only scores above it are candidates
  bool center_point_box = false;         // boxes as [x_center, y_center, width, height]
};

// The options from NonMaxSuppression's attribute and the bytes of its
// scalar inputs (nullptr: absent; max_output_boxes_per_class i64, the
// thresholds f32).
NonMaxSuppressionOptions nonMaxSuppressionOptions(int64_t center_point_box, const std::byte* max_boxes,
                                                  const std::byte* iou_threshold, const std::byte* score_threshold);

// NonMaxSuppression over `boxes` [batches, count, 4] and `scores`
// [batches, classes, count] (f32): per batch and class, the candidates by
// falling score (ties: the lower box index first), each kept unless its IoU
// with a box kept before exceeds the threshold, up to max_boxes_per_class.
// Returns the kept boxes as [selected, 3] int64 rows (batch, class, box),
// batch by batch and class by class, as the ONNX reference orders them.
std::vector<int64_t> nonMaxSuppression(const float* boxes, const float* scores, int64_t batches, int64_t classes,
                                       int64_t count, const NonMaxSuppressionOptions& options);

// Compress: how many of the first min(conditions, length) bools at
// `condition` are true (the size of Compress's output along its axis).
uint64_t countSelected(const uint8_t* condition, uint64_t conditions, uint64_t length);

// A tensor of `shape` as [outer, length, inner] around `axis`, or
// flattened (outer = inner = 1) without one: how Compress and Unique walk it.
struct AxisSplit {
  int64_t outer = 1, length = 1, inner = 1;
};
AxisSplit splitAround(const std::vector<int64_t>& shape, std::optional<size_t> axis);

// Unique over the `length` slices along an axis of a tensor viewed as
// [outer, length, inner] (`data` of `dtype`; the whole tensor flattened is
// outer = inner = 1): slices compare element by element in order, by value.
struct UniqueSlices {
  std::vector<int64_t> first;    // per unique slice, in output order: where it first occurs
  std::vector<int64_t> inverse;  // per slice: the position of its unique slice in the output
  std::vector<int64_t> counts;   // per unique slice: how many times it occurs
};
// Output order: ascending (`sorted`, ONNX's default) or by first occurrence.
// UsageError for a dtype it cannot compare (strings aside, every numeric
// type compares).
UniqueSlices uniqueSlices(const std::byte* data, DType dtype, int64_t outer, int64_t length, int64_t inner,
                          bool sorted);

}  // namespace kiln
