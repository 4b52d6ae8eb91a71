// Spatial-sampling kernels (ONNX) on the CPU, as plain loops in double:
// GridSample, AffineGrid, RoiAlign, DeformConv. Element types: f32, f64,
// f16, bf16 (read and written through element_access.h).
//
// GridSample follows onnx's reference implementation exactly:
//   - grid values (x, y[, z]) in [-1, 1] name the last spatial axis first;
//     they map to pixel coordinates by ((v + 1) * size - 1) / 2, or by
//     (v + 1) / 2 * (size - 1) with align_corners;
//   - nearest rounds half to even; linear takes 2 taps per axis, cubic 4
//     (Keys, alpha = -0.75);
//   - a coordinate beyond the border ([-0.5, size - 0.5], or [0, size - 1]
//     with align_corners) is clamped to [0, size - 1] (padding "border") or
//     reflected into it ("reflection"); then each tap outside the input reads
//     0 ("zeros"), the nearest pixel ("border"), or its reflection.
// The taps of a grid point are computed once and used for every channel.
//
// RoiAlign is onnx's (and onnxruntime's) average or max of bilinear samples
// on a sampling_ratio grid per output bin; DeformConv is a 2-D convolution
// whose every kernel tap samples X bilinearly (zero outside) at its offset
// position, scaled by the optional mask.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/conv_geometry.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/element_access.h"
#include "kernels/cpu/kernel_checks.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using checks::constantInput;
using checks::expectCounts;
using checks::inputAt;
using checks::present;
using checks::typeText;

using Ints = std::vector<int64_t>;

void expectFloat(std::string_view op, const TensorInfo& info, const char* what) {
  if (!isFloatType(info.dtype)) {
    throw UsageError(fmt::format("{}: no kernel for {} {} (supports f32, f64, f16, bf16)", op, what, typeText(info)));
  }
}

void expectShape(std::string_view op, const TensorInfo& info, const Ints& shape, const char* what) {
  if (info.shape != shape) {
    throw UsageError(fmt::format("{}: {} is {} but must be {}", op, what, typeText(info),
                                 TensorInfo{info.dtype, shape}.shapeString()));
  }
}

// Reflects x into [lo, hi] by the nearer border until it lies inside (onnx's
// _gs_reflect).
double reflect(double x, double lo, double hi) {
  const double range = hi - lo;
  if (range <= 0) return lo;
  if (x < lo) {
    const double dx = lo - x;
    const auto n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? lo + r : hi - r;
  }
  if (x > hi) {
    const double dx = x - hi;
    const auto n = static_cast<int64_t>(dx / range);
    const double r = dx - static_cast<double>(n) * range;
    return n % 2 == 0 ? hi - r : lo + r;
  }
  return x;
}

// Bilinear sample of one [height, width] plane at (h, w); pixels outside
// read as 0.
double bilinearZeros(const std::byte* x, DType dtype, int64_t plane, int64_t height, int64_t width, double h,
                     double w) {
  const double h0 = std::floor(h);
  const double w0 = std::floor(w);
  const double fh = h - h0;
  const double fw = w - w0;
  double sum = 0;
  for (int dy = 0; dy < 2; ++dy) {
    const auto y = static_cast<int64_t>(h0) + dy;
    if (y < 0 || y >= height) continue;
    for (int dx = 0; dx < 2; ++dx) {
      const auto xx = static_cast<int64_t>(w0) + dx;
      if (xx < 0 || xx >= width) continue;
      const double weight = (dy ? fh : 1 - fh) * (dx ? fw : 1 - fw);
      sum += weight * loadAsDouble(x, dtype, plane + y * width + xx);
    }
  }
  return sum;
}

// --------------------------------------------------------------- GridSample

enum class SampleMode { kNearest, kLinear, kCubic };
enum class PaddingMode { kZeros, kBorder, kReflection };

constexpr int kMaxGridRank = 3;
constexpr int kMaxTaps = 4;

struct GridSampleState final : KernelState {
  DType x_type = DType::kF32;
  DType grid_type = DType::kF32;
  SampleMode mode = SampleMode::kLinear;
  PaddingMode padding = PaddingMode::kZeros;
  bool align_corners = false;
  int rank = 2;  // spatial axes
  int64_t batch = 0;
  int64_t channels = 0;
  std::array<int64_t, kMaxGridRank> in{};  // spatial sizes
  int64_t in_plane = 1;
  int64_t points = 1;  // output points per batch index and channel
};

std::unique_ptr<KernelState> prepareGridSample(const KernelSetup& setup) {
  constexpr std::string_view op = "GridSample";
  expectCounts(op, setup, 2, 2, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& grid = setup.inputs[1];
  expectFloat(op, x, "X");
  expectFloat(op, grid, "grid");
  const size_t rank = x.shape.size() - 2;
  if (x.shape.size() < 3 || rank > kMaxGridRank || grid.shape.size() != x.shape.size() ||
      grid.shape.back() != static_cast<int64_t>(rank) || grid.shape[0] != x.shape[0]) {
    throw UsageError(fmt::format("{}: X {} and grid {} must be [N, C, D1..Dr] and [N, O1..Or, r] with r of 1 to 3", op,
                                 typeText(x), typeText(grid)));
  }
  Ints out{x.shape[0], x.shape[1]};
  out.insert(out.end(), grid.shape.begin() + 1, grid.shape.end() - 1);
  expectShape(op, setup.outputs[0], out, "the output");
  if (setup.outputs[0].dtype != x.dtype) throw UsageError(fmt::format("{}: the output must have X's type", op));
  auto s = std::make_unique<GridSampleState>();
  s->x_type = x.dtype;
  s->grid_type = grid.dtype;
  const std::string mode = setup.params.getString("mode", "linear");
  if (mode == "nearest") s->mode = SampleMode::kNearest;
  else if (mode == "linear" || mode == "bilinear") s->mode = SampleMode::kLinear;
  else if (mode == "cubic" || mode == "bicubic") s->mode = SampleMode::kCubic;
  else throw UsageError(fmt::format("{}: mode '{}' is not nearest, linear or cubic", op, mode));
  const std::string padding = setup.params.getString("padding_mode", "zeros");
  if (padding == "zeros") s->padding = PaddingMode::kZeros;
  else if (padding == "border") s->padding = PaddingMode::kBorder;
  else if (padding == "reflection") s->padding = PaddingMode::kReflection;
  else throw UsageError(fmt::format("{}: padding_mode '{}' is not zeros, border or reflection", op, padding));
  s->align_corners = setup.params.getInt("align_corners", 0) != 0;
  s->rank = static_cast<int>(rank);
  s->batch = x.shape[0];
  s->channels = x.shape[1];
  for (size_t d = 0; d < rank; ++d) {
    s->in[d] = x.shape[d + 2];
    s->in_plane *= s->in[d];
  }
  for (size_t d = 1; d + 1 < grid.shape.size(); ++d) s->points *= grid.shape[d];
  return s;
}

// Keys' cubic convolution weights for the taps at -1, 0, 1, 2 from floor(x),
// t = x - floor(x).
void cubicWeights(double t, double* w) {
  constexpr double a = -0.75;
  auto near = [](double d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };         // |d| <= 1
  auto far = [](double d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };   // 1 < |d| < 2
  w[0] = far(t + 1);
  w[1] = near(t);
  w[2] = near(1 - t);
  w[3] = far(2 - t);
}

// The taps of one axis: input indices (-1 where padding "zeros" reads 0) and
// weights.
struct AxisTaps {
  int count = 0;
  std::array<int64_t, kMaxTaps> index{};
  std::array<double, kMaxTaps> weight{};
};

AxisTaps axisTaps(const GridSampleState& s, int64_t size, double v) {
  const double lo = s.align_corners ? 0.0 : -0.5;
  const double hi = s.align_corners ? static_cast<double>(size - 1) : static_cast<double>(size) - 0.5;
  double x = s.align_corners ? (v + 1) / 2 * static_cast<double>(size - 1) : ((v + 1) * static_cast<double>(size) - 1) / 2;
  if (s.mode == SampleMode::kNearest) x = std::nearbyint(x);
  if (x < lo || x > hi) {
    if (s.padding == PaddingMode::kBorder) x = std::clamp(x, 0.0, static_cast<double>(size - 1));
    if (s.padding == PaddingMode::kReflection) x = reflect(x, lo, hi);
  }
  // A tap's index after padding: -1 reads 0.
  auto place = [&](int64_t i) -> int64_t {
    switch (s.padding) {
      case PaddingMode::kZeros: return i >= 0 && i < size ? i : -1;
      case PaddingMode::kBorder: return std::clamp<int64_t>(i, 0, size - 1);
      case PaddingMode::kReflection:
        return std::clamp<int64_t>(static_cast<int64_t>(reflect(static_cast<double>(i), lo, hi)), 0, size - 1);
    }
    return -1;
  };
  AxisTaps taps;
  if (s.mode == SampleMode::kNearest) {
    taps.count = 1;
    taps.index[0] = place(static_cast<int64_t>(x));
    taps.weight[0] = 1;
    return taps;
  }
  const double x0 = std::floor(x);
  const double t = x - x0;
  const auto base = static_cast<int64_t>(x0);
  if (s.mode == SampleMode::kLinear) {
    taps.count = 2;
    taps.weight = {1 - t, t, 0, 0};
    for (int i = 0; i < 2; ++i) taps.index[static_cast<size_t>(i)] = place(base + i);
    return taps;
  }
  taps.count = 4;
  cubicWeights(t, taps.weight.data());
  for (int i = 0; i < 4; ++i) taps.index[static_cast<size_t>(i)] = place(base - 1 + i);
  return taps;
}

void runGridSample(const KernelCall& call) {
  const auto& s = static_cast<const GridSampleState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  const std::byte* grid = call.inputs[1].data;
  std::byte* y = call.outputs[0].data;
  // Up to 4^3 taps per point: flat offsets into a plane, -1 reads 0.
  std::array<int64_t, 64> offsets{};
  std::array<double, 64> weights{};
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t p = 0; p < s.points; ++p) {
      std::array<AxisTaps, kMaxGridRank> axes{};
      for (int d = 0; d < s.rank; ++d) {
        // The grid names the last spatial axis first.
        const int64_t component = (n * s.points + p) * s.rank + (s.rank - 1 - d);
        axes[static_cast<size_t>(d)] = axisTaps(s, s.in[static_cast<size_t>(d)], loadAsDouble(grid, s.grid_type, component));
      }
      // The product of the axes' taps.
      int taps = 1;
      offsets[0] = 0;
      weights[0] = 1;
      for (int d = 0; d < s.rank; ++d) {
        const AxisTaps& axis = axes[static_cast<size_t>(d)];
        const int64_t size = s.in[static_cast<size_t>(d)];
        for (int t = taps; t-- > 0;) {
          for (int i = axis.count; i-- > 0;) {
            const auto to = static_cast<size_t>(t * axis.count + i);
            const int64_t index = axis.index[static_cast<size_t>(i)];
            const int64_t from = offsets[static_cast<size_t>(t)];
            offsets[to] = from < 0 || index < 0 ? -1 : from * size + index;
            weights[to] = weights[static_cast<size_t>(t)] * axis.weight[static_cast<size_t>(i)];
          }
        }
        taps *= axis.count;
      }
      for (int64_t c = 0; c < s.channels; ++c) {
        const int64_t plane = (n * s.channels + c) * s.in_plane;
        double sum = 0;
        for (int t = 0; t < taps; ++t) {
          if (offsets[static_cast<size_t>(t)] >= 0) {
            sum += weights[static_cast<size_t>(t)] * loadAsDouble(x, s.x_type, plane + offsets[static_cast<size_t>(t)]);
          }
        }
        storeFloat(y, s.x_type, (n * s.channels + c) * s.points + p, sum);
      }
    }
  }
}

// --------------------------------------------------------------- AffineGrid

struct AffineGridState final : KernelState {
  DType dtype = DType::kF32;
  int rank = 2;
  int64_t batch = 0;
  std::array<int64_t, 3> sizes{};  // spatial, outermost first
  bool align_corners = false;
};

std::unique_ptr<KernelState> prepareAffineGrid(const KernelSetup& setup) {
  constexpr std::string_view op = "AffineGrid";
  expectCounts(op, setup, 2, 2, 1, 1);
  const TensorInfo& theta = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  expectFloat(op, theta, "theta");
  if (theta.shape.size() != 3 || (theta.shape[1] != 2 && theta.shape[1] != 3) || theta.shape[2] != theta.shape[1] + 1) {
    throw UsageError(fmt::format("{}: theta {} must be [N, 2, 3] or [N, 3, 4]", op, typeText(theta)));
  }
  auto s = std::make_unique<AffineGridState>();
  s->dtype = theta.dtype;
  s->rank = static_cast<int>(theta.shape[1]);
  s->batch = theta.shape[0];
  if (y.dtype != theta.dtype || y.shape.size() != static_cast<size_t>(s->rank) + 2 || y.shape[0] != s->batch ||
      y.shape.back() != s->rank) {
    throw UsageError(fmt::format("{}: the output {} must be [N, spatial..., {}] of theta's type", op, typeText(y), s->rank));
  }
  for (int d = 0; d < s->rank; ++d) s->sizes[static_cast<size_t>(d)] = y.shape[static_cast<size_t>(d) + 1];
  s->align_corners = setup.params.getInt("align_corners", 0) != 0;
  return s;
}

// Normalised coordinate of pixel i of `size`: pixel centres over [-1, 1], or
// the corners at -1 and 1 with align_corners.
double baseCoordinate(int64_t i, int64_t size, bool align_corners) {
  const auto fi = static_cast<double>(i);
  const auto fs = static_cast<double>(size);
  if (align_corners) return size == 1 ? -1.0 : -1.0 + 2.0 * fi / (fs - 1);
  return -1.0 + (2.0 * fi + 1.0) / fs;
}

void runAffineGrid(const KernelCall& call) {
  const auto& s = static_cast<const AffineGridState&>(*call.state);
  const std::byte* theta = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  const int r = s.rank;
  const int64_t depth = r == 3 ? s.sizes[0] : 1;
  const int64_t height = s.sizes[static_cast<size_t>(r - 2)];
  const int64_t width = s.sizes[static_cast<size_t>(r - 1)];
  int64_t out = 0;
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t d = 0; d < depth; ++d) {
      for (int64_t h = 0; h < height; ++h) {
        for (int64_t w = 0; w < width; ++w) {
          // Homogeneous (x, y[, z], 1): the last spatial axis first.
          std::array<double, 4> v{baseCoordinate(w, width, s.align_corners), baseCoordinate(h, height, s.align_corners),
                                  1.0, 1.0};
          if (r == 3) v[2] = baseCoordinate(d, depth, s.align_corners);
          for (int j = 0; j < r; ++j) {
            double sum = 0;
            for (int k = 0; k <= r; ++k) {
              sum += loadAsDouble(theta, s.dtype, (n * r + j) * (r + 1) + k) * v[static_cast<size_t>(k)];
            }
            storeFloat(y, s.dtype, out++, sum);
          }
        }
      }
    }
  }
}

// ----------------------------------------------------------------- RoiAlign

struct RoiAlignState final : KernelState {
  DType dtype = DType::kF32;
  DType index_type = DType::kI64;
  int64_t batch = 0;
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t rois = 0;
  int64_t out_height = 1;
  int64_t out_width = 1;
  int64_t sampling_ratio = 0;
  double spatial_scale = 1;
  bool half_pixel = true;
  bool max_mode = false;
};

std::unique_ptr<KernelState> prepareRoiAlign(const KernelSetup& setup) {
  constexpr std::string_view op = "RoiAlign";
  expectCounts(op, setup, 3, 3, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  expectFloat(op, x, "X");
  if (x.shape.size() != 4) throw UsageError(fmt::format("{}: X {} must be [N, C, H, W]", op, typeText(x)));
  const TensorInfo& rois = setup.inputs[1];
  const TensorInfo& indices = setup.inputs[2];
  if (rois.dtype != x.dtype || rois.shape.size() != 2 || rois.shape[1] != 4) {
    throw UsageError(fmt::format("{}: rois {} must be [R, 4] of X's type", op, typeText(rois)));
  }
  if ((indices.dtype != DType::kI64 && indices.dtype != DType::kI32) || indices.shape != Ints{rois.shape[0]}) {
    throw UsageError(fmt::format("{}: batch_indices {} must be i64[{}]", op, typeText(indices), rois.shape[0]));
  }
  auto s = std::make_unique<RoiAlignState>();
  s->dtype = x.dtype;
  s->index_type = indices.dtype;
  s->batch = x.shape[0];
  s->channels = x.shape[1];
  s->height = x.shape[2];
  s->width = x.shape[3];
  s->rois = rois.shape[0];
  s->out_height = setup.params.getInt("output_height", 1);
  s->out_width = setup.params.getInt("output_width", 1);
  s->sampling_ratio = setup.params.getInt("sampling_ratio", 0);
  s->spatial_scale = setup.params.getFloat("spatial_scale", 1.0);
  if (s->sampling_ratio < 0) throw UsageError(fmt::format("{}: sampling_ratio must not be negative", op));
  const std::string transform = setup.params.getString("coordinate_transformation_mode", "half_pixel");
  if (transform != "half_pixel" && transform != "output_half_pixel") {
    throw UsageError(fmt::format("{}: coordinate_transformation_mode '{}' is not half_pixel or output_half_pixel", op, transform));
  }
  s->half_pixel = transform == "half_pixel";
  const std::string mode = setup.params.getString("mode", "avg");
  if (mode != "avg" && mode != "max") throw UsageError(fmt::format("{}: mode '{}' is not avg or max", op, mode));
  s->max_mode = mode == "max";
  expectShape(op, setup.outputs[0], {s->rois, s->channels, s->out_height, s->out_width}, "the output");
  return s;
}

// One bilinear sample of RoiAlign (onnxruntime's rules): nothing beyond one
// pixel outside the map; coordinates below 0 clamp to 0; the last row and
// column repeat. Writes the four corner offsets and weights.
void roiSample(const RoiAlignState& s, double y, double x, std::array<int64_t, 4>& at, std::array<double, 4>& w) {
  if (y < -1.0 || y > static_cast<double>(s.height) || x < -1.0 || x > static_cast<double>(s.width)) {
    at = {0, 0, 0, 0};
    w = {0, 0, 0, 0};
    return;
  }
  y = std::max(y, 0.0);
  x = std::max(x, 0.0);
  auto y_low = static_cast<int64_t>(y);
  auto x_low = static_cast<int64_t>(x);
  int64_t y_high = y_low + 1;
  int64_t x_high = x_low + 1;
  if (y_low >= s.height - 1) {
    y_high = y_low = s.height - 1;
    y = static_cast<double>(y_low);
  }
  if (x_low >= s.width - 1) {
    x_high = x_low = s.width - 1;
    x = static_cast<double>(x_low);
  }
  const double ly = y - static_cast<double>(y_low);
  const double lx = x - static_cast<double>(x_low);
  at = {y_low * s.width + x_low, y_low * s.width + x_high, y_high * s.width + x_low, y_high * s.width + x_high};
  w = {(1 - ly) * (1 - lx), (1 - ly) * lx, ly * (1 - lx), ly * lx};
}

void runRoiAlign(const KernelCall& call) {
  const auto& s = static_cast<const RoiAlignState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  const std::byte* rois = call.inputs[1].data;
  const std::byte* indices = call.inputs[2].data;
  std::byte* y = call.outputs[0].data;
  const double offset = s.half_pixel ? 0.5 : 0.0;
  for (int64_t r = 0; r < s.rois; ++r) {
    const int64_t batch = std::clamp<int64_t>(
        s.index_type == DType::kI64 ? loadElement<int64_t>(indices, r) : loadElement<int32_t>(indices, r), 0, s.batch - 1);
    const double x0 = loadAsDouble(rois, s.dtype, r * 4 + 0) * s.spatial_scale - offset;
    const double y0 = loadAsDouble(rois, s.dtype, r * 4 + 1) * s.spatial_scale - offset;
    const double x1 = loadAsDouble(rois, s.dtype, r * 4 + 2) * s.spatial_scale - offset;
    const double y1 = loadAsDouble(rois, s.dtype, r * 4 + 3) * s.spatial_scale - offset;
    double roi_w = x1 - x0;
    double roi_h = y1 - y0;
    if (!s.half_pixel) {  // the legacy mode forces rois of at least one pixel
      roi_w = std::max(roi_w, 1.0);
      roi_h = std::max(roi_h, 1.0);
    }
    const double bin_h = roi_h / static_cast<double>(s.out_height);
    const double bin_w = roi_w / static_cast<double>(s.out_width);
    const int64_t grid_h = s.sampling_ratio > 0 ? s.sampling_ratio : static_cast<int64_t>(std::ceil(roi_h / static_cast<double>(s.out_height)));
    const int64_t grid_w = s.sampling_ratio > 0 ? s.sampling_ratio : static_cast<int64_t>(std::ceil(roi_w / static_cast<double>(s.out_width)));
    const double count = static_cast<double>(std::max<int64_t>(grid_h * grid_w, 1));
    for (int64_t c = 0; c < s.channels; ++c) {
      const int64_t plane = (batch * s.channels + c) * s.height * s.width;
      for (int64_t ph = 0; ph < s.out_height; ++ph) {
        for (int64_t pw = 0; pw < s.out_width; ++pw) {
          double result = 0;
          bool first = true;
          for (int64_t iy = 0; iy < grid_h; ++iy) {
            const double sy = y0 + static_cast<double>(ph) * bin_h + (static_cast<double>(iy) + 0.5) * bin_h / static_cast<double>(grid_h);
            for (int64_t ix = 0; ix < grid_w; ++ix) {
              const double sx = x0 + static_cast<double>(pw) * bin_w + (static_cast<double>(ix) + 0.5) * bin_w / static_cast<double>(grid_w);
              std::array<int64_t, 4> at{};
              std::array<double, 4> w{};
              roiSample(s, sy, sx, at, w);
              if (s.max_mode) {
                // onnx's max mode: the largest weighted corner of each sample.
                double v = w[0] * loadAsDouble(x, s.dtype, plane + at[0]);
                for (size_t k = 1; k < 4; ++k) v = std::max(v, w[k] * loadAsDouble(x, s.dtype, plane + at[k]));
                result = first ? v : std::max(result, v);
                first = false;
              } else {
                for (size_t k = 0; k < 4; ++k) result += w[k] * loadAsDouble(x, s.dtype, plane + at[k]);
              }
            }
          }
          if (!s.max_mode) result /= count;
          storeFloat(y, s.dtype, ((r * s.channels + c) * s.out_height + ph) * s.out_width + pw, result);
        }
      }
    }
  }
}

// --------------------------------------------------------------- DeformConv

struct DeformConvState final : KernelState {
  DType dtype = DType::kF32;
  ConvGeometry g;
  int64_t offset_groups = 1;
  bool has_bias = false;
  bool has_mask = false;
};

// Inputs: X [N, C, H, W], W [M, C/group, kH, kW], offset [N, G*2*kH*kW, oH,
// oW], B? [M], mask? [N, G*kH*kW, oH, oW] (G = offset_group).
std::unique_ptr<KernelState> prepareDeformConv(const KernelSetup& setup) {
  constexpr std::string_view op = "DeformConv";
  expectCounts(op, setup, 3, 5, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  expectFloat(op, x, "X");
  if (x.shape.size() != 4) throw UsageError(fmt::format("{}: supports 2-D inputs [N, C, H, W] only, got {}", op, typeText(x)));
  for (size_t i = 1; i < setup.inputs.size(); ++i) {
    if (present(setup.inputs[i]) && setup.inputs[i].dtype != x.dtype) {
      throw UsageError(fmt::format("{}: input {} {} must have X's type", op, i, typeText(setup.inputs[i])));
    }
  }
  auto s = std::make_unique<DeformConvState>();
  s->dtype = x.dtype;
  s->g = convGeometry(op, setup.params, x, setup.inputs[1], setup.outputs[0]);
  s->offset_groups = setup.params.getInt("offset_group", 1);
  if (s->offset_groups < 1 || s->g.in_channels % s->offset_groups != 0) {
    throw UsageError(fmt::format("{}: offset_group {} must divide the {} input channels", op, s->offset_groups, s->g.in_channels));
  }
  const ConvGeometry& g = s->g;
  const int64_t taps = g.kernelSize();
  expectShape(op, setup.inputs[2], {g.batch, s->offset_groups * 2 * taps, g.out[1], g.out[2]}, "offset");
  s->has_bias = setup.inputs.size() > 3 && present(setup.inputs[3]);
  if (s->has_bias) expectShape(op, setup.inputs[3], {g.out_channels}, "B");
  s->has_mask = setup.inputs.size() > 4 && present(setup.inputs[4]);
  if (s->has_mask) expectShape(op, setup.inputs[4], {g.batch, s->offset_groups * taps, g.out[1], g.out[2]}, "mask");
  return s;
}

void runDeformConv(const KernelCall& call) {
  const auto& s = static_cast<const DeformConvState&>(*call.state);
  const ConvGeometry& g = s.g;
  const TensorView* in = call.inputs;
  const std::byte* x = in[0].data;
  const std::byte* w = in[1].data;
  const std::byte* offset = in[2].data;
  const std::byte* bias = s.has_bias ? in[3].data : nullptr;
  const std::byte* mask = s.has_mask ? in[4].data : nullptr;
  const int64_t height = g.in[1];
  const int64_t width = g.in[2];
  const int64_t kernel_h = g.kernel[1];
  const int64_t kernel_w = g.kernel[2];
  const int64_t taps = kernel_h * kernel_w;
  const int64_t out_plane = g.out[1] * g.out[2];
  const int64_t group_in = g.in_channels / g.group;
  const int64_t group_out = g.out_channels / g.group;
  const int64_t offset_group_in = g.in_channels / s.offset_groups;
  for (int64_t n = 0; n < g.batch; ++n) {
    for (int64_t m = 0; m < g.out_channels; ++m) {
      const int64_t first_channel = (m / group_out) * group_in;
      for (int64_t oh = 0; oh < g.out[1]; ++oh) {
        for (int64_t ow = 0; ow < g.out[2]; ++ow) {
          const int64_t position = oh * g.out[2] + ow;
          double sum = bias ? loadAsDouble(bias, s.dtype, m) : 0.0;
          for (int64_t c = 0; c < group_in; ++c) {
            const int64_t channel = first_channel + c;
            const int64_t og = channel / offset_group_in;
            const int64_t plane = (n * g.in_channels + channel) * height * width;
            for (int64_t kh = 0; kh < kernel_h; ++kh) {
              for (int64_t kw = 0; kw < kernel_w; ++kw) {
                const int64_t tap = kh * kernel_w + kw;
                const int64_t offset_at = ((n * s.offset_groups + og) * 2 * taps + 2 * tap) * out_plane + position;
                const double h = static_cast<double>(oh * g.strides[1] - g.pad_begin[1] + kh * g.dilations[1]) +
                                 loadAsDouble(offset, s.dtype, offset_at);
                const double ww = static_cast<double>(ow * g.strides[2] - g.pad_begin[2] + kw * g.dilations[2]) +
                                  loadAsDouble(offset, s.dtype, offset_at + out_plane);
                const double scale =
                    mask ? loadAsDouble(mask, s.dtype, ((n * s.offset_groups + og) * taps + tap) * out_plane + position) : 1.0;
                const double weight = loadAsDouble(w, s.dtype, (m * group_in + c) * taps + tap);
                sum += weight * scale * bilinearZeros(x, s.dtype, plane, height, width, h, ww);
              }
            }
          }
          storeFloat(call.outputs[0].data, s.dtype, (n * g.out_channels + m) * out_plane + position, sum);
        }
      }
    }
  }
}

}  // namespace

void registerSamplingKernels(KernelRegistry& registry) {
  registry.add({"GridSample", prepareGridSample, runGridSample});
  registry.add({"AffineGrid", prepareAffineGrid, runAffineGrid});
  registry.add({"RoiAlign", prepareRoiAlign, runRoiAlign});
  registry.add({"DeformConv", prepareDeformConv, runDeformConv});
}

}  // namespace kiln
