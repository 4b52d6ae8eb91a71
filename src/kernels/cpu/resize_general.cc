#include "kernels/cpu/resize_general.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/numeric_types.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using numeric::Arith;
using numeric::TypeTag;
using numeric::withNumericType;

std::string typeString(const TensorInfo& info) { return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString()); }

bool present(const KernelSetup& setup, size_t index) {
  return index < setup.inputs.size() && setup.inputs[index].dtype != DType::kUndefined &&
         setup.inputs[index].numElements() > 0;
}

const std::byte* constantInput(const KernelSetup& setup, size_t index) {
  return index < setup.constants.size() ? setup.constants[index] : nullptr;
}

// Element `i` of a constant float or integer input, as double.
double readNumber(const std::byte* data, DType dtype, uint64_t i) {
  double out = 0;
  withNumericType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    out = static_cast<double>(Arith<T>::load(v));
  });
  return out;
}

std::vector<double> constantNumbers(const KernelSetup& setup, size_t index, const char* what) {
  const std::byte* bytes = constantInput(setup, index);
  if (bytes == nullptr) {
    throw UsageError(fmt::format("Resize: {} must be a constant for this mode (input {} is computed)", what, index));
  }
  std::vector<double> values(setup.inputs[index].numElements());
  for (size_t i = 0; i < values.size(); ++i) values[i] = readNumber(bytes, setup.inputs[index].dtype, i);
  return values;
}

// The (index, weight) taps of each output position along one axis.
struct AxisTable {
  bool identity = true;  // the output index reads the same input index, weight 1
  int64_t taps = 1;
  std::vector<int64_t> index;  // [out][taps], clamped into the input
  std::vector<double> weight;  // [out][taps]
  std::vector<uint8_t> outside;  // [out]: tf_crop_and_resize extrapolates there
};

struct Coefficients {
  std::string mode;
  std::string nearest;
  double cubic_a = -0.75;
  bool antialias = false;

  // ONNX's reference: the weights of the taps around x for `ratio` in (0, 1],
  // into `weights` (whose memory is reused).
  void operator()(double ratio, double scale, std::vector<double>& weights) const {
    weights.clear();
    auto set = [&weights](std::initializer_list<double> values) { weights.assign(values.begin(), values.end()); };
    if (mode == "nearest") {
      if (ratio == 1) return set({0, 1});
      if (nearest == "round_prefer_floor") return set({ratio <= 0.5 ? 1.0 : 0.0, ratio > 0.5 ? 1.0 : 0.0});
      if (nearest == "round_prefer_ceil") return set({ratio < 0.5 ? 1.0 : 0.0, ratio >= 0.5 ? 1.0 : 0.0});
      if (nearest == "floor") return set({1, 0});
      return set({0, 1});  // ceil
    }
    if (mode == "linear" && !antialias) return set({1 - ratio, ratio});
    const double a = cubic_a;
    if (mode == "cubic" && !antialias) {
      const double r1 = ratio + 1, q = 1 - ratio, q1 = q + 1;
      return set({((a * r1 - 5 * a) * r1 + 8 * a) * r1 - 4 * a, ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
                  ((a + 2) * q - (a + 3)) * q * q + 1, ((a * q1 - 5 * a) * q1 + 8 * a) * q1 - 4 * a});
    }
    const double s = std::min(scale, 1.0);
    double sum = 0;
    if (mode == "linear") {
      const auto start = static_cast<int64_t>(std::floor(-1 / s) + 1);
      const int64_t footprint = 2 - 2 * start;
      for (int64_t i = 0; i < footprint; ++i) {
        weights.push_back(std::clamp(1 - std::abs((static_cast<double>(start + i) - ratio) * s), 0.0, 1.0));
        sum += weights.back();
      }
    } else {
      const auto start = static_cast<int64_t>(std::floor(-2 / s) + 1);
      const int64_t end = 2 - start;
      for (int64_t i = start; i < end; ++i) {
        const double x = std::abs(s * (static_cast<double>(i) - ratio));
        const double x2 = x * x, x3 = x2 * x;
        weights.push_back(x <= 1 ? (a + 2) * x3 - (a + 3) * x2 + 1
                          : x < 2 ? a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
                                  : 0.0);
        sum += weights.back();
      }
    }
    for (double& w : weights) w /= sum;
  }
};

struct GeneralResizeState final : KernelState {
  using Loop = void (*)(const GeneralResizeState& s, const std::vector<AxisTable>& axes, const std::byte* x,
                        std::byte* y);
  Loop loop = nullptr;
  uint32_t rank = 0;
  Ints out_dims;
  std::array<int64_t, kMaxRank> in_strides{}, out_strides{};  // elements, per NCHW axis, in memory order
  std::vector<AxisTable> axes;
  std::vector<uint32_t> resized;  // the non-identity axes
  double extrapolation = 0;
  // tf_crop_and_resize with a computed roi: the tables are built at run.
  bool roi_at_run = false;
  DType roi_dtype = DType::kF32;
  Ints roi_axes;  // the axes the roi's values are for, in its order
  Coefficients coefficients;
  std::string transform;
  bool exclude_outside = false;
  Ints in_dims;
  std::vector<double> scale;  // per axis
};


// Fills `table` (reusing its memory, and that of `weights`). `roi`: [start,
// end] along the axis, for tf_crop_and_resize.
void buildTable(const Coefficients& coefficients, const std::string& transform, bool exclude_outside, int64_t in,
                int64_t out, double scale, double roi_start, double roi_end, AxisTable& table,
                std::vector<double>& weights) {
  table.identity = false;
  table.index.clear();
  table.weight.clear();
  // The output width before rounding, in f32 as onnxruntime computes it.
  const auto width = static_cast<double>(static_cast<float>(scale) * static_cast<float>(in));
  const auto n_in = static_cast<double>(in);
  table.outside.assign(static_cast<size_t>(out), 0);
  for (int64_t o = 0; o < out; ++o) {
    const auto y = static_cast<double>(o);
    double x = 0;
    if (transform == "align_corners") {
      x = width == 1 ? 0.0 : y * (n_in - 1) / (width - 1);
    } else if (transform == "asymmetric") {
      x = y / scale;
    } else if (transform == "tf_crop_and_resize") {
      x = width == 1 ? (roi_end - roi_start) * (n_in - 1) / 2 : y * (roi_end - roi_start) * (n_in - 1) / (width - 1);
      x += roi_start * (n_in - 1);
      table.outside[static_cast<size_t>(o)] = x < 0 || x > n_in - 1;
    } else if (transform == "pytorch_half_pixel") {
      x = width == 1 ? -0.5 : (y + 0.5) / scale - 0.5;
    } else if (transform == "half_pixel") {
      x = (y + 0.5) / scale - 0.5;
    } else {  // half_pixel_symmetric
      const double adjustment = static_cast<double>(out) / width;
      x = n_in / 2 * (1 - adjustment) + (y + 0.5) / scale - 0.5;
    }
    const double floor_x = std::floor(x);
    const double ratio = x == floor_x ? 1.0 : x - floor_x;
    coefficients(ratio, scale, weights);
    const auto n = static_cast<int64_t>(weights.size());
    if (o == 0) table.taps = n;
    // The n taps nearest x, the lower one on ties (the reference's edge-padded window).
    const int64_t pad = (n + 1) / 2;
    const double padded = x + static_cast<double>(pad);
    const double p = std::floor(padded);
    const double frac = padded - p;
    int64_t offset;
    if (n % 2 == 0) {
      offset = frac == 0 ? -(n / 2) : -(n / 2) + 1;
    } else {
      offset = frac <= 0.5 ? -((n - 1) / 2) : -((n - 1) / 2) + 1;
    }
    const int64_t first = static_cast<int64_t>(p) + offset - pad;
    if (exclude_outside) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (first + i < 0 || first + i >= in) weights[static_cast<size_t>(i)] = 0;
        sum += weights[static_cast<size_t>(i)];
      }
      if (sum == 0) sum = 1;
      for (double& w : weights) w /= sum;
    }
    for (int64_t i = 0; i < n; ++i) {
      table.index.push_back(std::clamp<int64_t>(first + i, 0, in - 1));
      table.weight.push_back(weights[static_cast<size_t>(i)]);
    }
  }
}

template <typename T>
T storeValue(double v) {
  if constexpr (std::is_integral_v<T>) {
    // As onnx's saturate_cast: round to nearest, clamp to the type.
    const double r = std::nearbyint(v);
    if (!(r == r)) return T(0);
    if (r <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (r >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(r);
  } else {
    return Arith<T>::store(static_cast<typename Arith<T>::Acc>(v));
  }
}

template <typename T>
void generalResizeLoop(const GeneralResizeState& s, const std::vector<AxisTable>& axes, const std::byte* x_bytes,
                       std::byte* y_bytes) {
  using A = Arith<T>;
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  const uint32_t rank = s.rank;
  const auto r = static_cast<uint32_t>(s.resized.size());
  int64_t count = 1;
  for (uint32_t d = 0; d < rank; ++d) count *= s.out_dims[d];
  std::array<int64_t, kMaxRank> coord{};
  std::array<int64_t, kMaxRank> tap{};
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t base = 0, out_at = 0;
    bool outside = false;
    for (uint32_t d = 0; d < rank; ++d) {
      out_at += coord[d] * s.out_strides[d];
      const AxisTable& table = axes[d];
      if (table.identity) {
        base += coord[d] * s.in_strides[d];
      } else {
        outside = outside || table.outside[static_cast<size_t>(coord[d])] != 0;
      }
    }
    double acc = s.extrapolation;
    if (!outside) {
      acc = 0;
      std::fill_n(tap.begin(), r, 0);
      while (true) {
        double w = 1;
        int64_t at = base;
        for (uint32_t i = 0; i < r; ++i) {
          const uint32_t d = s.resized[i];
          const AxisTable& table = axes[d];
          const auto k = static_cast<size_t>(coord[d] * table.taps + tap[i]);
          w *= table.weight[k];
          at += table.index[k] * s.in_strides[d];
        }
        if (w != 0) acc += w * static_cast<double>(A::load(x[at]));
        uint32_t i = r;
        while (i-- > 0) {
          if (++tap[i] < axes[s.resized[i]].taps) break;
          tap[i] = 0;
        }
        if (i == static_cast<uint32_t>(-1)) break;
      }
    }
    y[out_at] = storeValue<T>(acc);
    for (uint32_t d = rank; d-- > 0;) {
      if (++coord[d] < s.out_dims[d]) break;
      coord[d] = 0;
    }
  }
}

// Strides of an NCHW-described tensor: row-major, or [N, spatial..., C] in memory.
std::array<int64_t, kMaxRank> stridesFor(const Ints& dims, bool channels_last) {
  std::array<int64_t, kMaxRank> strides{};
  if (!channels_last) {
    int64_t stride = 1;
    for (size_t d = dims.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= dims[d];
    }
    return strides;
  }
  int64_t stride = dims[1];
  strides[1] = 1;
  for (size_t d = dims.size(); d-- > 2;) {
    strides[d] = stride;
    stride *= dims[d];
  }
  strides[0] = stride;
  return strides;
}

}  // namespace

bool needsGeneralResize(const KernelSetup& setup) {
  const ParamMap& p = setup.params;
  const std::string mode = p.getString("mode", "nearest");
  const std::string transform = p.getString("coordinate_transformation_mode", "half_pixel");
  if (mode != "nearest" && mode != "linear" && mode != "bilinear") return true;
  if (p.getInt("antialias", 0) != 0 || p.has("axes") || p.getString("keep_aspect_ratio_policy", "stretch") != "stretch") {
    return true;
  }
  if (transform == "tf_crop_and_resize" || transform == "half_pixel_symmetric") return true;
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  if (x.shape.size() < 2 || y.shape.size() != x.shape.size()) return false;  // the 2-D kernel reports it
  for (size_t d = 0; d + 2 < x.shape.size(); ++d) {
    if (x.shape[d] != y.shape[d]) return true;
  }
  // align_corners divides by the output width before rounding; the 2-D kernel
  // uses the rounded one, which differs when a constant scale does not land
  // on a whole number.
  const size_t scales_index = setup.inputs.size() == 2 ? 1 : 2;
  const std::byte* bytes = constantInput(setup, scales_index);
  if (transform == "align_corners" && bytes != nullptr && present(setup, scales_index) &&
      setup.inputs[scales_index].numElements() == x.shape.size()) {
    for (size_t d = x.shape.size() - 2; d < x.shape.size(); ++d) {
      const float width = static_cast<float>(readNumber(bytes, setup.inputs[scales_index].dtype, d)) *
                          static_cast<float>(x.shape[d]);
      if (width != static_cast<float>(y.shape[d])) return true;
    }
  }
  return false;
}

std::unique_ptr<KernelState> prepareGeneralResize(const KernelSetup& setup, bool channels_last) {
  const ParamMap& p = setup.params;
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  const size_t rank = x.shape.size();
  if (y.dtype != x.dtype || y.shape.size() != rank || rank == 0 || rank > kMaxRank) {
    throw UsageError(fmt::format("Resize: output {} does not match input {}", typeString(y), typeString(x)));
  }
  Coefficients coefficients;
  coefficients.mode = p.getString("mode", "nearest");
  if (coefficients.mode == "bilinear") coefficients.mode = "linear";
  coefficients.nearest = p.getString("nearest_mode", "round_prefer_floor");
  coefficients.cubic_a = p.getFloat("cubic_coeff_a", -0.75);
  coefficients.antialias = p.getInt("antialias", 0) != 0;
  if (coefficients.mode != "nearest" && coefficients.mode != "linear" && coefficients.mode != "cubic") {
    throw UsageError(fmt::format("Resize: mode '{}' is not nearest, linear or cubic", coefficients.mode));
  }
  if (coefficients.mode == "nearest" && coefficients.antialias) {
    throw UsageError("Resize: antialias does not apply to mode nearest");
  }
  const std::string& nearest = coefficients.nearest;
  if (nearest != "round_prefer_floor" && nearest != "round_prefer_ceil" && nearest != "floor" && nearest != "ceil") {
    throw UsageError(fmt::format("Resize: nearest_mode '{}' is not supported", nearest));
  }
  const std::string transform = p.getString("coordinate_transformation_mode", "half_pixel");
  static const char* const kTransforms[] = {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                                            "align_corners", "asymmetric", "tf_crop_and_resize"};
  if (std::find(std::begin(kTransforms), std::end(kTransforms), transform) == std::end(kTransforms)) {
    throw UsageError(fmt::format("Resize: coordinate_transformation_mode '{}' is not supported", transform));
  }
  const bool exclude_outside = p.getInt("exclude_outside", 0) != 0;
  const std::string policy = p.getString("keep_aspect_ratio_policy", "stretch");
  if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller") {
    throw UsageError(fmt::format("Resize: keep_aspect_ratio_policy '{}' is not supported", policy));
  }

  // The resized axes and, per axis of the tensor, its scale and roi.
  Ints axes = p.getInts("axes", {});
  if (!p.has("axes")) {
    axes.resize(rank);
    for (size_t d = 0; d < rank; ++d) axes[d] = static_cast<int64_t>(d);
  }
  for (int64_t& axis : axes) {
    if (axis < -static_cast<int64_t>(rank) || axis >= static_cast<int64_t>(rank)) {
      throw UsageError(fmt::format("Resize: axis {} is out of range for {}", axis, typeString(x)));
    }
    if (axis < 0) axis += static_cast<int64_t>(rank);
  }
  std::vector<double> scale(rank, 1.0);
  const size_t scales_index = setup.inputs.size() == 2 ? 1 : 2;
  if (present(setup, scales_index) && !present(setup, 3)) {
    const std::vector<double> scales = constantNumbers(setup, scales_index, "scales");
    if (scales.size() != axes.size()) {
      throw UsageError(fmt::format("Resize: {} scales for {} axes", scales.size(), axes.size()));
    }
    for (size_t i = 0; i < axes.size(); ++i) {
      if (!(scales[i] > 0)) throw UsageError(fmt::format("Resize: scale {} is not positive", scales[i]));
      const auto a = static_cast<size_t>(axes[i]);
      scale[a] = scales[i];
      const auto want = static_cast<int64_t>(std::floor(static_cast<float>(x.shape[a]) * static_cast<float>(scales[i])));
      if (want != y.shape[a]) {
        throw UsageError(fmt::format("Resize: scale {} takes axis {} from {} to {}, the output {} has {}", scales[i], a,
                                     x.shape[a], want, typeString(y), y.shape[a]));
      }
    }
  } else if (present(setup, 3)) {
    if (policy == "stretch") {
      for (int64_t axis : axes) {
        const auto a = static_cast<size_t>(axis);
        scale[a] = x.shape[a] == 0 ? 1.0 : static_cast<double>(y.shape[a]) / static_cast<double>(x.shape[a]);
      }
    } else {
      const std::vector<double> sizes = constantNumbers(setup, 3, "sizes (with keep_aspect_ratio_policy)");
      if (sizes.size() != axes.size()) throw UsageError(fmt::format("Resize: {} sizes for {} axes", sizes.size(), axes.size()));
      double common = policy == "not_larger" ? std::numeric_limits<double>::infinity() : 0.0;
      for (size_t i = 0; i < axes.size(); ++i) {
        const double ratio = sizes[i] / static_cast<double>(x.shape[static_cast<size_t>(axes[i])]);
        common = policy == "not_larger" ? std::min(common, ratio) : std::max(common, ratio);
      }
      for (int64_t axis : axes) scale[static_cast<size_t>(axis)] = common;
    }
  } else {
    throw UsageError("Resize: needs scales or sizes");
  }
  std::vector<double> roi_start(rank, 0.0), roi_end(rank, 1.0);
  const bool crop = transform == "tf_crop_and_resize" && setup.inputs.size() > 2 && present(setup, 1);
  if (crop && setup.inputs[1].numElements() != 2 * axes.size()) {
    throw UsageError(fmt::format("Resize: roi has {} values for {} axes", setup.inputs[1].numElements(), axes.size()));
  }
  const bool roi_at_run = crop && constantInput(setup, 1) == nullptr;
  if (crop && !roi_at_run) {
    const std::vector<double> roi = constantNumbers(setup, 1, "roi");
    for (size_t i = 0; i < axes.size(); ++i) {
      roi_start[static_cast<size_t>(axes[i])] = roi[i];
      roi_end[static_cast<size_t>(axes[i])] = roi[i + axes.size()];
    }
  }

  auto state = std::make_unique<GeneralResizeState>();
  state->rank = static_cast<uint32_t>(rank);
  state->out_dims = y.shape;
  state->extrapolation = p.getFloat("extrapolation_value", 0.0);
  if (channels_last && rank < 3) throw UsageError("kiln.NhwcResize: needs rank 3 or more");
  state->in_strides = stridesFor(x.shape, channels_last);
  state->out_strides = stridesFor(y.shape, channels_last);
  state->axes.resize(rank);
  state->roi_at_run = roi_at_run;
  if (roi_at_run) {
    if (!withNumericType(setup.inputs[1].dtype, [](auto) {})) {
      throw UsageError(fmt::format("Resize: roi must be numeric, got {}", typeString(setup.inputs[1])));
    }
    state->roi_dtype = setup.inputs[1].dtype;
    state->roi_axes = axes;
    state->coefficients = coefficients;
    state->transform = transform;
    state->exclude_outside = exclude_outside;
    state->in_dims = x.shape;
    state->scale = scale;
  }
  std::vector<double> weights;
  for (size_t d = 0; d < rank; ++d) {
    const bool listed = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    const bool trivial_roi = !roi_at_run && roi_start[d] == 0 && roi_end[d] == 1;
    if (!listed || (std::abs(scale[d] - 1) < 1e-9 && x.shape[d] == y.shape[d] && trivial_roi)) {
      if (x.shape[d] != y.shape[d]) {
        throw UsageError(fmt::format("Resize: output {} changes axis {} of {}, which is not resized", typeString(y), d,
                                     typeString(x)));
      }
      continue;
    }
    if (x.shape[d] == 0 && y.shape[d] != 0) throw UsageError(fmt::format("Resize: cannot resize {}", typeString(x)));
    // No tables for an empty output, whose other axes may be huge (nothing runs).
    if (y.numElements() == 0) continue;
    buildTable(coefficients, transform, exclude_outside, x.shape[d], y.shape[d], scale[d], roi_start[d], roi_end[d],
               state->axes[d], weights);
    state->resized.push_back(static_cast<uint32_t>(d));
  }
  withNumericType(x.dtype, [&](auto tag) { state->loop = &generalResizeLoop<typename decltype(tag)::type>; });
  if (state->loop == nullptr) throw UsageError(fmt::format("Resize: no kernel for {} data", dtypeName(x.dtype)));
  return state;
}

void runGeneralResize(const KernelCall& call) {
  const auto& s = static_cast<const GeneralResizeState&>(*call.state);
  if (call.outputs[0].numElements() == 0) return;
  if (!s.roi_at_run) {
    s.loop(s, s.axes, call.inputs[0].data, call.outputs[0].data);
    return;
  }
  // The roi is this call's: the tables of the resized axes are built here,
  // in buffers that keep their memory from call to call.
  thread_local std::vector<AxisTable> tables;
  thread_local std::vector<double> weights;
  tables.resize(s.axes.size());
  const std::byte* roi = call.inputs[1].data;
  const size_t count = s.roi_axes.size();
  for (uint32_t d : s.resized) {
    const size_t i = static_cast<size_t>(std::find(s.roi_axes.begin(), s.roi_axes.end(), d) - s.roi_axes.begin());
    buildTable(s.coefficients, s.transform, s.exclude_outside, s.in_dims[d], s.out_dims[d], s.scale[d],
               readNumber(roi, s.roi_dtype, i), readNumber(roi, s.roi_dtype, i + count), tables[d], weights);
  }
  for (size_t d = 0; d < s.axes.size(); ++d) {
    if (s.axes[d].identity) tables[d].identity = true;
  }
  s.loop(s, tables, call.inputs[0].data, call.outputs[0].data);
}

}  // namespace kiln
