#include "core/selection.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstring>
#include <numeric>
#include <string>

#include "core/float_formats.h"
#include "kiln/error.h"

namespace kiln {

bool isNonZeroElement(const std::byte* data, DType dtype) {
  switch (dtype) {
    case DType::kF32: {
      float v;
      std::memcpy(&v, data, sizeof v);
      return v != 0.0f;  // NaN != 0
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, data, sizeof v);
      return v != 0.0;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t bits;
      std::memcpy(&bits, data, sizeof bits);
      return (bits & 0x7FFFu) != 0;  // all but the sign bit: -0 is zero
    }
    default: {
      const size_t size = dtypeSize(dtype);
      for (size_t i = 0; i < size; ++i) {
        if (data[i] != std::byte{0}) return true;
      }
      return false;
    }
  }
}

uint64_t countNonZero(const std::byte* data, DType dtype, uint64_t elements) {
  const size_t element_size = dtypeSize(dtype);
  uint64_t count = 0;
  for (uint64_t i = 0; i < elements; ++i) count += isNonZeroElement(data + i * element_size, dtype) ? 1 : 0;
  return count;
}

void writeNonZeroPositions(const std::byte* data, DType dtype, const std::vector<int64_t>& shape, int64_t* out,
                           uint64_t count) {
  const size_t rank = shape.size();
  uint64_t elements = 1;
  for (int64_t dim : shape) elements *= static_cast<uint64_t>(dim);
  const size_t element_size = dtypeSize(dtype);
  uint64_t n = 0;
  for (uint64_t i = 0; i < elements && n < count; ++i) {
    if (!isNonZeroElement(data + i * element_size, dtype)) continue;
    uint64_t rest = i;
    for (size_t d = rank; d-- > 0;) {
      const auto dim = static_cast<uint64_t>(shape[d]);
      out[d * count + n] = static_cast<int64_t>(rest % dim);
      rest /= dim;
    }
    ++n;
  }
}

NonMaxSuppressionOptions nonMaxSuppressionOptions(int64_t center_point_box, const std::byte* max_boxes,
                                                  const std::byte* iou_threshold, const std::byte* score_threshold) {
  NonMaxSuppressionOptions options;
  options.center_point_box = center_point_box != 0;
  if (max_boxes != nullptr) std::memcpy(&options.max_boxes_per_class, max_boxes, sizeof(int64_t));
  if (iou_threshold != nullptr) std::memcpy(&options.iou_threshold, iou_threshold, sizeof(float));
  if (score_threshold != nullptr) {
    float value;
    std::memcpy(&value, score_threshold, sizeof value);
    options.score_threshold = value;
  }
  return options;
}

namespace {

struct Corners {
  float x_min, y_min, x_max, y_max;
};

// ONNX's box formats: corners [y1, x1, y2, x2] in either order, or
// [x_center, y_center, width, height].
Corners cornersOf(const float* box, bool center_point_box) {
  if (center_point_box) {
    const float half_w = box[2] / 2, half_h = box[3] / 2;
    return {box[0] - half_w, box[1] - half_h, box[0] + half_w, box[1] + half_h};
  }
  return {std::min(box[1], box[3]), std::min(box[0], box[2]), std::max(box[1], box[3]), std::max(box[0], box[2])};
}

// Whether the IoU of a and b exceeds `threshold` (the reference's tests and
// order of operations: empty intersections and degenerate boxes never
// suppress).
bool suppresses(const Corners& a, const Corners& b, float threshold) {
  const float ix_min = std::max(a.x_min, b.x_min), ix_max = std::min(a.x_max, b.x_max);
  if (ix_max <= ix_min) return false;
  const float iy_min = std::max(a.y_min, b.y_min), iy_max = std::min(a.y_max, b.y_max);
  if (iy_max <= iy_min) return false;
  const float intersection = (ix_max - ix_min) * (iy_max - iy_min);
  if (intersection <= 0) return false;
  const float area_a = (a.x_max - a.x_min) * (a.y_max - a.y_min);
  const float area_b = (b.x_max - b.x_min) * (b.y_max - b.y_min);
  const float union_area = area_a + area_b - intersection;
  if (area_a <= 0 || area_b <= 0 || union_area <= 0) return false;
  return intersection / union_area > threshold;
}

}  // namespace

std::vector<int64_t> nonMaxSuppression(const float* boxes, const float* scores, int64_t batches, int64_t classes,
                                       int64_t count, const NonMaxSuppressionOptions& options) {
  std::vector<int64_t> selected;
  if (options.max_boxes_per_class <= 0) return selected;
  std::vector<int64_t> candidates;
  std::vector<Corners> kept;
  for (int64_t b = 0; b < batches; ++b) {
    const float* batch_boxes = boxes + b * count * 4;
    for (int64_t c = 0; c < classes; ++c) {
      const float* class_scores = scores + (b * classes + c) * count;
      candidates.clear();
      for (int64_t i = 0; i < count; ++i) {
        if (!options.score_threshold || class_scores[i] > *options.score_threshold) candidates.push_back(i);
      }
      // Falling score; equal scores by rising index (stable on the index
      // order); NaN scores last.
      const auto key = [&](int64_t i) {
        return std::isnan(class_scores[i]) ? -std::numeric_limits<float>::infinity() : class_scores[i];
      };
      std::stable_sort(candidates.begin(), candidates.end(), [&](int64_t x, int64_t y) { return key(x) > key(y); });
      kept.clear();
      for (int64_t i : candidates) {
        if (static_cast<int64_t>(kept.size()) >= options.max_boxes_per_class) break;
        const Corners box = cornersOf(batch_boxes + i * 4, options.center_point_box);
        const bool suppressed = std::any_of(kept.begin(), kept.end(), [&](const Corners& other) {
          return suppresses(box, other, options.iou_threshold);
        });
        if (suppressed) continue;
        kept.push_back(box);
        selected.insert(selected.end(), {b, c, i});
      }
    }
  }
  return selected;
}

}  // namespace kiln

namespace kiln {

AxisSplit splitAround(const std::vector<int64_t>& shape, std::optional<size_t> axis) {
  AxisSplit split;
  if (!axis) {
    for (int64_t dim : shape) split.length *= dim;
    return split;
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (d < *axis) split.outer *= shape[d];
    else if (d > *axis) split.inner *= shape[d];
  }
  split.length = shape[*axis];
  return split;
}

uint64_t countSelected(const uint8_t* condition, uint64_t conditions, uint64_t length) {
  uint64_t count = 0;
  for (uint64_t i = 0; i < std::min(conditions, length); ++i) count += condition[i] != 0 ? 1 : 0;
  return count;
}

namespace {

// -1, 0 or 1 as a is below, equal to or above b (elements of `dtype`).
template <typename T>
int compareAs(const std::byte* a, const std::byte* b) {
  T x, y;
  std::memcpy(&x, a, sizeof x);
  std::memcpy(&y, b, sizeof y);
  return x < y ? -1 : (y < x ? 1 : 0);
}

using CompareElements = int (*)(const std::byte*, const std::byte*);

// 16-bit floats compare as the floats they widen to.
template <float (*kWiden)(uint16_t)>
int compareWidened(const std::byte* a, const std::byte* b) {
  uint16_t x, y;
  std::memcpy(&x, a, 2);
  std::memcpy(&y, b, 2);
  const float fx = kWiden(x), fy = kWiden(y);
  return fx < fy ? -1 : (fy < fx ? 1 : 0);
}

CompareElements comparisonFor(DType dtype) {
  switch (dtype) {
    case DType::kF32: return &compareAs<float>;
    case DType::kF64: return &compareAs<double>;
    case DType::kF16: return &compareWidened<&halfToFloat>;
    case DType::kBF16: return &compareWidened<&bfloat16ToFloat>;
    case DType::kI8: return &compareAs<int8_t>;
    case DType::kI16: return &compareAs<int16_t>;
    case DType::kI32: return &compareAs<int32_t>;
    case DType::kI64: return &compareAs<int64_t>;
    case DType::kU8:
    case DType::kBool: return &compareAs<uint8_t>;
    case DType::kU16: return &compareAs<uint16_t>;
    case DType::kU32: return &compareAs<uint32_t>;
    case DType::kU64: return &compareAs<uint64_t>;
    default: return nullptr;
  }
}

}  // namespace

UniqueSlices uniqueSlices(const std::byte* data, DType dtype, int64_t outer, int64_t length, int64_t inner,
                          bool sorted) {
  const CompareElements compare = comparisonFor(dtype);
  if (compare == nullptr) throw UsageError("Unique: no comparison for " + std::string(dtypeName(dtype)) + " elements");
  const auto element = static_cast<int64_t>(dtypeSize(dtype));
  // Slice i against slice j, element by element in (outer, inner) order.
  const auto compareSlices = [&](int64_t i, int64_t j) {
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k = 0; k < inner; ++k) {
        const int c = compare(data + ((o * length + i) * inner + k) * element,
                              data + ((o * length + j) * inner + k) * element);
        if (c != 0) return c;
      }
    }
    return 0;
  };
  std::vector<int64_t> order(static_cast<size_t>(length));
  std::iota(order.begin(), order.end(), int64_t{0});
  // Stable: equal slices keep their order, so a group starts at its first occurrence.
  std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return compareSlices(i, j) < 0; });
  UniqueSlices result;
  result.inverse.resize(static_cast<size_t>(length));
  for (size_t n = 0; n < order.size(); ++n) {
    if (n == 0 || compareSlices(order[n - 1], order[n]) != 0) {
      result.first.push_back(order[n]);
      result.counts.push_back(0);
    }
    result.inverse[static_cast<size_t>(order[n])] = static_cast<int64_t>(result.first.size() - 1);
    ++result.counts.back();
  }
  if (!sorted) {
    // By first occurrence: renumber the groups in the order they first appear.
    std::vector<int64_t> by_first(result.first.size());
    std::iota(by_first.begin(), by_first.end(), int64_t{0});
    std::sort(by_first.begin(), by_first.end(), [&](int64_t a, int64_t b) {
      return result.first[static_cast<size_t>(a)] < result.first[static_cast<size_t>(b)];
    });
    std::vector<int64_t> position(by_first.size());
    UniqueSlices reordered;
    for (size_t p = 0; p < by_first.size(); ++p) {
      const auto group = static_cast<size_t>(by_first[p]);
      position[group] = static_cast<int64_t>(p);
      reordered.first.push_back(result.first[group]);
      reordered.counts.push_back(result.counts[group]);
    }
    reordered.inverse.resize(result.inverse.size());
    for (size_t i = 0; i < result.inverse.size(); ++i) {
      reordered.inverse[i] = position[static_cast<size_t>(result.inverse[i])];
    }
    return reordered;
  }
  return result;
}

}  // namespace kiln
