// Pooling (ONNX) on the CPU in f32: MaxPool, AveragePool and LpPool over 1 to 3
// spatial axes through oneDNN's pooling_v2 primitive, with a loop kernel of
// our own where oneDNN would compute something else or refuses; and
// GlobalAveragePool and GlobalMaxPool as loops. The kiln.Nhwc* forms (see
// src/passes/channels_last.h) take [N, H, W, C] tensors.
//
// Window arithmetic follows the ONNX formulas (as src/ops/nn_ops.cc does):
// auto_pad SAME_* pads ceil(in / stride) outputs, ceil_mode adds one output
// when the windows do not fit exactly, as long as the last window starts
// inside the input or the left padding. oneDNN gets that output size through
// a larger right padding. Padding never counts for MaxPool; for AveragePool
// with count_include_pad it counts only inside the explicit pads (as
// onnxruntime and PyTorch do), never in the part ceil_mode adds, which
// oneDNN's avg_include_padding would count: those cases use the loop kernel.
//
// Concurrency and allocation: execution slots (see onednn_support.h) made at
// prepare; dnnl_primitive_execute allocates a few small objects per call
// inside oneDNN. The loop kernels allocate nothing.
#include <dnnl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <dnnl.hpp>

#include "core/log.h"
#include "kernels/cpu/channels_last.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/cpu/onednn_support.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/window_attributes.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr int64_t kBlock = 16;
constexpr size_t kMaxSpatial = 3;
constexpr const char* kKernel = "pooling";

using onednn::Dims;
using onednn::ExecutionSlot;
using Ints = std::vector<int64_t>;

std::string typeString(const TensorInfo& info) {
  return fmt::format("{}{}", dtypeName(info.dtype), info.shapeString());
}

// A window over 3 spatial axes (missing leading axes have size 1).
struct Window {
  bool max = false;
  bool count_include_pad = false;
  bool channels_last = false;  // [N, spatial..., C] in memory (kiln.Nhwc* pools)
  int64_t p = 0;               // LpPool's exponent; 0 for the other pools
  bool indices = false;        // MaxPool's Indices output is wanted
  bool column_major = false;   // storage_order 1: the indices count the spatial axes from the last
  int64_t batch = 0;
  int64_t channels = 0;
  int64_t rows = 0;  // N * C
  std::array<int64_t, kMaxSpatial> in{1, 1, 1};
  std::array<int64_t, kMaxSpatial> out{1, 1, 1};
  std::array<int64_t, kMaxSpatial> kernel{1, 1, 1};
  std::array<int64_t, kMaxSpatial> stride{1, 1, 1};
  std::array<int64_t, kMaxSpatial> dilation{1, 1, 1};
  std::array<int64_t, kMaxSpatial> pad_begin{0, 0, 0};
  std::array<int64_t, kMaxSpatial> pad_end{0, 0, 0};  // the explicit (or auto_pad) end pads, without ceil_mode's
};

struct PoolState final : KernelState {
  Window window;
  DType dtype = DType::kF32;  // MaxPool also takes u8 and i8 (oneDNN, or the loop kernel with Indices)
  bool use_rows = false;      // runRowMaxPool
  bool use_dnnl = false;
  dnnl::pooling_v2_forward primitive;
  onednn::ExecutionSlots slots;
};

// ------------------------------------------------------------- loop kernel

// `indices`: MaxPool's Indices output, or nullptr. T is float, or for
// MaxPool an 8-bit integer.
template <typename T>
void loopPool(const T* x, T* y, const Window& w, int64_t* indices = nullptr) {
  const int64_t in_plane = w.in[0] * w.in[1] * w.in[2];
  const int64_t out_plane = w.out[0] * w.out[1] * w.out[2];
  // Row r is one (n, c) plane; its elements are `step` apart.
  const int64_t step = w.channels_last ? w.channels : 1;
  for (int64_t r = 0; r < w.rows; ++r) {
    const int64_t n = r / w.channels;
    const int64_t c = r % w.channels;
    const T* xr = w.channels_last ? x + n * in_plane * w.channels + c : x + r * in_plane;
    T* yr = w.channels_last ? y + n * out_plane * w.channels + c : y + r * out_plane;
    for (int64_t o0 = 0; o0 < w.out[0]; ++o0) {
      for (int64_t o1 = 0; o1 < w.out[1]; ++o1) {
        for (int64_t o2 = 0; o2 < w.out[2]; ++o2) {
          const std::array<int64_t, kMaxSpatial> start{o0 * w.stride[0] - w.pad_begin[0],
                                                       o1 * w.stride[1] - w.pad_begin[1],
                                                       o2 * w.stride[2] - w.pad_begin[2]};
          float acc = w.max ? -std::numeric_limits<float>::infinity() : 0.0f;
          int64_t best = -1;  // MaxPool: where acc came from, in the input plane
          int64_t valid = 0;
          int64_t padded = 0;  // taps inside the explicit pads or the input
          for (int64_t k0 = 0; k0 < w.kernel[0]; ++k0) {
            const int64_t i0 = start[0] + k0 * w.dilation[0];
            const bool in0 = i0 >= 0 && i0 < w.in[0];
            const bool pad0 = i0 >= -w.pad_begin[0] && i0 < w.in[0] + w.pad_end[0];
            for (int64_t k1 = 0; k1 < w.kernel[1]; ++k1) {
              const int64_t i1 = start[1] + k1 * w.dilation[1];
              const bool in1 = in0 && i1 >= 0 && i1 < w.in[1];
              const bool pad1 = pad0 && i1 >= -w.pad_begin[1] && i1 < w.in[1] + w.pad_end[1];
              for (int64_t k2 = 0; k2 < w.kernel[2]; ++k2) {
                const int64_t i2 = start[2] + k2 * w.dilation[2];
                if (pad1 && i2 >= -w.pad_begin[2] && i2 < w.in[2] + w.pad_end[2]) ++padded;
                if (!in1 || i2 < 0 || i2 >= w.in[2]) continue;
                const auto v = static_cast<float>(xr[((i0 * w.in[1] + i1) * w.in[2] + i2) * step]);
                ++valid;
                if (w.max) {
                  if (best < 0 || v > acc || (v != v && acc == acc)) {  // NaN propagates
                    acc = v;
                    best = w.column_major ? (i2 * w.in[1] + i1) * w.in[0] + i0 : (i0 * w.in[1] + i1) * w.in[2] + i2;
                  }
                } else if (w.p == 1) {
                  acc += std::abs(v);
                } else if (w.p == 2) {
                  acc += v * v;
                } else if (w.p > 0) {
                  acc += std::pow(std::abs(v), static_cast<float>(w.p));
                } else {
                  acc += v;
                }
              }
            }
          }
          if (w.p == 2) {
            acc = std::sqrt(acc);
          } else if (w.p > 2) {
            acc = std::pow(acc, 1.0f / static_cast<float>(w.p));
          } else if (!w.max && w.p == 0) {
            acc /= static_cast<float>(w.count_include_pad ? padded : valid);
          }
          const int64_t at = ((o0 * w.out[1] + o1) * w.out[2] + o2) * step;
          if constexpr (std::is_integral_v<T>) {
            yr[at] = best < 0 ? std::numeric_limits<T>::lowest() : static_cast<T>(acc);  // a window of padding only
          } else {
            yr[at] = static_cast<T>(acc);
          }
          if (indices != nullptr) indices[r * out_plane + at] = r * in_plane + std::max<int64_t>(best, 0);
        }
      }
    }
  }
}

// -------------------------------------------------- channels-last row max

// A channels-last f32 MaxPool over 1 or 2 spatial axes with unit stride
// along W and no dilation (YOLO's SPPF, 5x5; DBNet's 2x2 SAME window), no
// Indices output.
bool rowMaxPoolApplies(const Window& w, DType dtype) {
  return w.max && w.channels_last && dtype == DType::kF32 && !w.indices && w.in[0] == 1 && w.kernel[0] == 1 &&
         w.stride[2] == 1 && w.dilation[1] == 1 && w.dilation[2] == 1;
}

// Output rows [begin, end) of runRowMaxPool's (image, row) items.
void rowMaxPoolRows(const Window& w, const float* x, float* y, int64_t begin, int64_t end) {
  const vec::BinaryFn max = vec::vectorKernels().binaryFn(vec::Binary::kMax, vec::Operands::kBoth);
  const int64_t c = w.channels;
  const int64_t in_w = w.in[2], out_w = w.out[2];
  const int64_t pad_w = w.pad_begin[2];
  // Outputs [first, last) have every column of their window inside the row.
  const int64_t first = std::min(pad_w, out_w);
  const int64_t last = std::max(first, std::min(out_w, in_w - w.kernel[2] + 1 + pad_w));
  for (int64_t item = begin; item < end; ++item) {
    const int64_t n = item / w.out[1];
    const int64_t oy = item % w.out[1];
    float* out = y + item * out_w * c;
    const int64_t iy0 = oy * w.stride[1] - w.pad_begin[1];
    // The first two taps make the output in one pass; each next one folds in.
    const float* pending = nullptr;
    bool started = false;
    for (int64_t ky = 0; ky < w.kernel[1]; ++ky) {
      const int64_t iy = iy0 + ky;
      if (iy < 0 || iy >= w.in[1]) continue;
      const float* row = x + (n * w.in[1] + iy) * in_w * c;
      for (int64_t kx = 0; kx < w.kernel[2]; ++kx) {
        const float* from = row + (first - pad_w + kx) * c;
        if (started) {
          max(out + first * c, from, out + first * c, (last - first) * c);
        } else if (pending != nullptr) {
          max(pending, from, out + first * c, (last - first) * c);
          started = true;
        } else {
          pending = from;
        }
      }
    }
    if (!started && pending != nullptr) {
      std::copy_n(pending, (last - first) * c, out + first * c);
      started = true;
    }
    // The edge outputs, whose windows reach into the padding: per pixel.
    for (int64_t ox = 0; ox < out_w; ++ox) {
      if (ox == first) ox = last;
      if (ox >= out_w) break;
      float* pixel = out + ox * c;
      std::fill_n(pixel, c, -std::numeric_limits<float>::infinity());
      for (int64_t ky = 0; ky < w.kernel[1]; ++ky) {
        const int64_t iy = iy0 + ky;
        if (iy < 0 || iy >= w.in[1]) continue;
        for (int64_t kx = 0; kx < w.kernel[2]; ++kx) {
          const int64_t ix = ox - pad_w + kx;
          if (ix >= 0 && ix < in_w) max(pixel, x + ((n * w.in[1] + iy) * in_w + ix) * c, pixel, c);
        }
      }
    }
    if (!started) std::fill_n(out + first * c, (last - first) * c, -std::numeric_limits<float>::infinity());
  }
}

// Each output row is the maximum of whole input rows shifted by the window's
// column offsets: one vector call per tap over the row's inner outputs
// (W x C elements), the few outputs at the edges per pixel. oneDNN 2.6's
// pooling ran PP-OCRv6's detector's 2x2 window over 320x320x24 in 2.1 ms,
// at half the speed of this.
void runRowMaxPool(const Window& w, const float* x, float* y) {
  parallelForItems(w.batch * w.out[1], w.out[2] * w.channels * w.kernel[1] * w.kernel[2],
                   [&](int64_t begin, int64_t end) { rowMaxPoolRows(w, x, y, begin, end); });
}

// ------------------------------------------------------------------ oneDNN

void prepareDnnl(PoolState& state, size_t spatial, const std::array<int64_t, kMaxSpatial>& pad_right) {
  const Window& w = state.window;
  const size_t first = kMaxSpatial - spatial;
  Dims src_dims{w.batch, w.channels};
  Dims dst_dims{w.batch, w.channels};
  Dims strides, kernel, dilation, pad_l, pad_r;
  for (size_t i = first; i < kMaxSpatial; ++i) {
    src_dims.push_back(w.in[i]);
    dst_dims.push_back(w.out[i]);
    strides.push_back(w.stride[i]);
    kernel.push_back(w.kernel[i]);
    dilation.push_back(w.dilation[i] - 1);
    pad_l.push_back(w.pad_begin[i]);
    pad_r.push_back(pad_right[i]);
  }
  const dnnl::engine& engine = onednn::cpuEngine();
  using tag = dnnl::memory::format_tag;
  const tag plain = spatial == 1 ? tag::ncw : spatial == 2 ? (w.channels_last ? tag::nhwc : tag::nchw) : tag::ncdhw;
  const dnnl::memory::data_type type = state.dtype == DType::kU8   ? dnnl::memory::data_type::u8
                                       : state.dtype == DType::kI8 ? dnnl::memory::data_type::s8
                                                                   : dnnl::memory::data_type::f32;
  const dnnl::memory::desc src(src_dims, type, plain);
  const dnnl::memory::desc dst(dst_dims, type, plain);
  const dnnl::algorithm algorithm = w.max                 ? dnnl::algorithm::pooling_max
                                    : w.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                                          : dnnl::algorithm::pooling_avg_exclude_padding;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  const dnnl::pooling_v2_forward::desc desc(dnnl::prop_kind::forward_inference, algorithm, src, dst, strides, kernel,
                                            dilation, pad_l, pad_r);
  const dnnl::pooling_v2_forward::primitive_desc pd(desc, attr, engine);
  state.primitive = dnnl::pooling_v2_forward(pd);
  state.slots.create(engine, pd.scratchpad_desc());
  for (size_t i = 0; i < onednn::kExecutionSlots; ++i) {
    ExecutionSlot& slot = state.slots[i];
    slot.src = dnnl::memory(pd.src_desc(), engine, DNNL_MEMORY_NONE);
    slot.dst = dnnl::memory(pd.dst_desc(), engine, DNNL_MEMORY_NONE);
  }
  state.use_dnnl = true;
}

void runPool(const KernelCall& call) {
  const auto& state = static_cast<const PoolState&>(*call.state);
  if (state.use_rows) {
    runRowMaxPool(state.window, call.inputs[0].as<const float>(), call.outputs[0].as<float>());
    return;
  }
  if (!state.use_dnnl) {
    int64_t* indices = state.window.indices ? call.outputs[1].as<int64_t>() : nullptr;
    switch (state.dtype) {
      case DType::kU8:
        loopPool(call.inputs[0].as<const uint8_t>(), call.outputs[0].as<uint8_t>(), state.window, indices);
        break;
      case DType::kI8:
        loopPool(call.inputs[0].as<const int8_t>(), call.outputs[0].as<int8_t>(), state.window, indices);
        break;
      default:
        loopPool(call.inputs[0].as<const float>(), call.outputs[0].as<float>(), state.window, indices);
    }
    return;
  }
  ExecutionSlot& slot = state.slots.claim();
  dnnl_exec_arg_t args[3];
  int count = 0;
  onednn::setHandle(kKernel, slot.src, call.inputs[0].data);
  args[count++] = {DNNL_ARG_SRC, slot.src.get()};
  onednn::setHandle(kKernel, slot.dst, call.outputs[0].data);
  args[count++] = {DNNL_ARG_DST, slot.dst.get()};
  onednn::execute(kKernel, state.primitive, state.slots, slot, args, count);
}

// ------------------------------------------------------------------ prepare

// `bytes`: u8 and i8 are allowed too (MaxPool).
void expectF32Input(std::string_view op, const KernelSetup& setup, bool bytes = false) {
  if (setup.inputs.size() != 1) throw UsageError(fmt::format("{}: expects 1 input, got {}", op, setup.inputs.size()));
  const TensorInfo& x = setup.inputs[0];
  if (x.dtype != DType::kF32 && !(bytes && (x.dtype == DType::kU8 || x.dtype == DType::kI8))) {
    throw UsageError(
        fmt::format("{}: no kernel for {} inputs (supports f32); input 0 is {}", op, dtypeName(x.dtype), typeString(x)));
  }
  if (!x.isStatic()) throw UsageError(fmt::format("{}: needs static shapes, input 0 is {}", op, typeString(x)));
  if (x.shape.size() < 3) {
    throw UsageError(fmt::format("{}: needs an input [N, C, spatial...] of rank 3 or more, got {}", op, typeString(x)));
  }
}

void expectOutput(std::string_view op, const KernelSetup& setup, const Ints& shape) {
  const TensorInfo expected{setup.inputs[0].dtype, shape};
  if (setup.outputs[0] != expected) {
    throw UsageError(
        fmt::format("{}: output is {} but the inputs give {}", op, typeString(setup.outputs[0]), typeString(expected)));
  }
}

// `p`: LpPool's exponent, 0 for MaxPool and AveragePool.
std::unique_ptr<KernelState> preparePool(std::string_view op, const KernelSetup& setup, bool max,
                                         bool channels_last = false, int64_t p = 0) {
  expectF32Input(op, setup, max);
  const bool indices = max && !channels_last && setup.outputs.size() == 2;
  if (setup.outputs.size() != (indices ? 2u : 1u)) {
    throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  }
  const Ints& x = setup.inputs[0].shape;
  const size_t n = x.size() - 2;
  if (n > kMaxSpatial) {
    throw UsageError(fmt::format("{}: no kernel for {} spatial axes (supports 1 to 3); input is {}", op, n,
                                 typeString(setup.inputs[0])));
  }
  if (!setup.params.has("kernel_shape")) throw UsageError(fmt::format("{}: needs the 'kernel_shape' attribute", op));
  const Ints kernel = sizedInts(op, setup.params, "kernel_shape", n, 1, {});
  const Ints strides = sizedInts(op, setup.params, "strides", n, 1, Ints(n, 1));
  const Ints dilations = sizedInts(op, setup.params, "dilations", n, 1, Ints(n, 1));
  Ints pads = sizedInts(op, setup.params, "pads", 2 * n, 0, Ints(2 * n, 0));
  const std::string auto_pad = setup.params.getString("auto_pad", "NOTSET");
  const bool same = auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER";
  if (!same && auto_pad != "NOTSET" && auto_pad != "VALID" && !auto_pad.empty()) {
    throw UsageError(fmt::format("{}: auto_pad is '{}', not NOTSET, VALID, SAME_UPPER or SAME_LOWER", op, auto_pad));
  }
  const bool ceil_mode = setup.params.getInt("ceil_mode", 0) != 0;

  auto state = std::make_unique<PoolState>();
  Window& w = state->window;
  w.max = max;
  w.p = p;
  w.indices = indices;
  w.column_major = setup.params.getInt("storage_order", 0) != 0;
  w.count_include_pad = setup.params.getInt("count_include_pad", 0) != 0;
  w.channels_last = channels_last;
  w.batch = x[0];
  w.channels = x[1];
  w.rows = x[0] * x[1];
  std::array<int64_t, kMaxSpatial> pad_right{0, 0, 0};  // oneDNN's, ceil_mode's extra included
  bool ceil_extra = false;
  Ints out_shape{x[0], x[1]};
  for (size_t i = 0; i < n; ++i) {
    const size_t a = kMaxSpatial - n + i;
    const int64_t in = x[i + 2];
    const int64_t extent = (kernel[i] - 1) * dilations[i] + 1;
    const int64_t stride = strides[i];
    int64_t begin = 0;
    int64_t end = 0;
    int64_t out = 0;
    if (same) {
      out = (in + stride - 1) / stride;
      const int64_t total = std::max<int64_t>(0, (out - 1) * stride + extent - in);
      begin = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      end = total - begin;
    } else {
      if (auto_pad != "VALID") {
        begin = pads[i];
        end = pads[i + n];
      }
      const int64_t room = in + begin + end - extent;
      if (room < 0) {
        throw UsageError(fmt::format(
            "{}: spatial axis {}: the kernel spans {} elements (dilations included) but the padded input has {}", op, i,
            extent, in + begin + end));
      }
      out = room / stride + 1;
      if (ceil_mode && room % stride != 0) {
        ++out;
        if ((out - 1) * stride >= in + begin) --out;
      }
    }
    w.in[a] = in;
    w.out[a] = out;
    w.kernel[a] = kernel[i];
    w.stride[a] = stride;
    w.dilation[a] = dilations[i];
    w.pad_begin[a] = begin;
    w.pad_end[a] = end;
    pad_right[a] = std::max(end, (out - 1) * stride + extent - in - begin);
    ceil_extra = ceil_extra || pad_right[a] != end;
    out_shape.push_back(out);
  }
  expectOutput(op, setup, out_shape);
  if (indices && setup.outputs[1] != TensorInfo{DType::kI64, out_shape}) {
    throw UsageError(fmt::format("{}: the Indices output is {}, expected i64{}", op, typeString(setup.outputs[1]),
                                 TensorInfo{DType::kI64, out_shape}.shapeString()));
  }
  if (w.rows == 0) return state;  // the loop kernel does nothing
  state->dtype = setup.inputs[0].dtype;
  if (rowMaxPoolApplies(w, state->dtype)) {
    state->use_rows = true;
    return state;
  }
  // oneDNN gives no indices and no LpPool; its 8-bit pooling is MaxPool's.
  if (indices || p != 0 || (state->dtype != DType::kF32 && !max)) return state;
  if (!max && w.count_include_pad && ceil_extra) return state;  // see the top of the file
  try {
    prepareDnnl(*state, n, pad_right);
  } catch (const dnnl::error& e) {
    log::debug("{}: oneDNN refused the pooling ({}); using the loop kernel", op, e.what());
    state->use_dnnl = false;
    state->slots.reset();
  }
  return state;
}

std::unique_ptr<KernelState> prepareMaxPool(const KernelSetup& setup) { return preparePool("MaxPool", setup, true); }
std::unique_ptr<KernelState> prepareLpPool(const KernelSetup& setup) {
  const int64_t p = setup.params.getInt("p", 2);
  if (p < 1) throw UsageError(fmt::format("LpPool: p must be 1 or more, got {}", p));
  return preparePool("LpPool", setup, false, false, p);
}
std::unique_ptr<KernelState> prepareAveragePool(const KernelSetup& setup) {
  return preparePool("AveragePool", setup, false);
}
std::unique_ptr<KernelState> prepareNhwcMaxPool(const KernelSetup& setup) {
  const NchwSetup nchw("kiln.NhwcMaxPool", setup);
  return preparePool("kiln.NhwcMaxPool", nchw.get(), true, /*channels_last=*/true);
}
std::unique_ptr<KernelState> prepareNhwcAveragePool(const KernelSetup& setup) {
  const NchwSetup nchw("kiln.NhwcAveragePool", setup);
  return preparePool("kiln.NhwcAveragePool", nchw.get(), false, /*channels_last=*/true);
}

// ------------------------------------------------------------- global pools

struct GlobalState final : KernelState {
  int64_t rows = 0;
  int64_t size = 0;  // elements per row
  // kiln.NhwcGlobal*Pool: `batch` images of `size` rows of `channels`.
  bool channels_last = false;
  int64_t batch = 0;
  int64_t channels = 0;
};

std::unique_ptr<KernelState> prepareGlobal(std::string_view op, const KernelSetup& setup,
                                           bool channels_last = false) {
  expectF32Input(op, setup);
  if (setup.outputs.size() != 1) throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  const Ints& x = setup.inputs[0].shape;
  Ints out{x[0], x[1]};
  out.insert(out.end(), x.size() - 2, 1);
  expectOutput(op, setup, out);
  auto state = std::make_unique<GlobalState>();
  state->rows = x[0] * x[1];
  state->size = 1;
  for (size_t i = 2; i < x.size(); ++i) state->size *= x[i];
  if (state->size == 0) throw UsageError(fmt::format("{}: the input {} has no spatial elements", op, typeString(setup.inputs[0])));
  state->channels_last = channels_last;
  state->batch = x[0];
  state->channels = x[1];
  return state;
}

std::unique_ptr<KernelState> prepareNhwcGlobalAverage(const KernelSetup& setup) {
  const NchwSetup nchw("kiln.NhwcGlobalAveragePool", setup);
  return prepareGlobal("kiln.NhwcGlobalAveragePool", nchw.get(), /*channels_last=*/true);
}
std::unique_ptr<KernelState> prepareNhwcGlobalMax(const KernelSetup& setup) {
  const NchwSetup nchw("kiln.NhwcGlobalMaxPool", setup);
  return prepareGlobal("kiln.NhwcGlobalMaxPool", nchw.get(), /*channels_last=*/true);
}

// A large image (PP-OCR's detector pools 96 channels of a 160x160 map, one
// image) is cut into runs of rows of kGlobalPartBytes, each folded
// (all its channels) into a row of partial results on the calling thread's
// stack, which the calling thread folds last: each run is read front to back
// and, at that size, stays in L2 for the fold's second block of columns.
// All of PP-OCRv6 small det's pools: 2.15 -> 0.85 ms.
constexpr int64_t kGlobalPartBytes = int64_t{128} << 10;
constexpr int64_t kGlobalPartialFloats = 16384;  // the stack's share: 64 KiB

// runNhwcGlobal by runs of rows; false when the partial results would not
// fit on the stack or the images are small.
bool runNhwcGlobalByRows(const GlobalState& state, const float* x, float* y, bool max) {
  const int64_t c_count = state.channels;
  if (c_count == 0) return false;  // nothing to write
  const int64_t row_bytes = c_count * static_cast<int64_t>(sizeof(float));
  const int64_t rows_per_part = std::max<int64_t>(1, kGlobalPartBytes / row_bytes);
  const int64_t parts = (state.size + rows_per_part - 1) / rows_per_part;
  if (parts < 2 || state.batch * parts * c_count > kGlobalPartialFloats) return false;
  alignas(64) float partial[kGlobalPartialFloats];
  const vec::VectorKernels& v = vec::vectorKernels();
  parallelForItems(state.batch * parts, rows_per_part * c_count, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / parts;
      const int64_t first = (item % parts) * rows_per_part;
      const int64_t rows = std::min(rows_per_part, state.size - first);
      v.foldColumns(x + (n * state.size + first) * c_count, rows, c_count, c_count, partial + item * c_count, max);
    }
  });
  for (int64_t n = 0; n < state.batch; ++n) {
    float* out = y + n * c_count;
    v.foldColumns(partial + n * parts * c_count, parts, c_count, c_count, out, max);
    if (!max) v.affine(out, out, c_count, 1.0f / static_cast<float>(state.size), 0.0f);
  }
  return true;
}

// Channels-last global pools: each image is `size` rows of `channels`
// values; the output row is their mean or maximum (NaN propagates): the
// vector kernels' column folds. Work items are (image, block of channels),
// split across the threads; blocks of 16 channels when an image has too few
// blocks of 64 to keep the threads even (PP-OCR's detector pools 96
// channels of a 160x160 map, one image), unless runNhwcGlobalByRows takes it.
void runNhwcGlobal(const KernelCall& call, bool max) {
  const auto& state = static_cast<const GlobalState&>(*call.state);
  const float* x = call.inputs[0].as<const float>();
  float* y = call.outputs[0].as<float>();
  if (runNhwcGlobalByRows(state, x, y, max)) return;
  const int64_t c_count = state.channels;
  const int64_t block = state.batch * ((c_count + 63) / 64) >= 8 ? 64 : 16;
  const int64_t blocks = (c_count + block - 1) / block;
  const vec::VectorKernels& v = vec::vectorKernels();
  parallelForItems(state.batch * blocks, state.size * block, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / blocks;
      const int64_t c0 = (item % blocks) * block;
      const int64_t width = std::min(block, c_count - c0);
      float* out = y + n * c_count + c0;
      v.foldColumns(x + n * state.size * c_count + c0, state.size, c_count, width, out, max);
      if (!max) v.affine(out, out, width, 1.0f / static_cast<float>(state.size), 0.0f);
    }
  });
}

void runNhwcGlobalAverage(const KernelCall& call) { runNhwcGlobal(call, false); }
void runNhwcGlobalMax(const KernelCall& call) { runNhwcGlobal(call, true); }

std::unique_ptr<KernelState> prepareGlobalAverage(const KernelSetup& setup) {
  return prepareGlobal("GlobalAveragePool", setup);
}
std::unique_ptr<KernelState> prepareGlobalMax(const KernelSetup& setup) {
  return prepareGlobal("GlobalMaxPool", setup);
}

void runGlobalAverage(const KernelCall& call) {
  const auto& state = static_cast<const GlobalState&>(*call.state);
  const float* x = call.inputs[0].as<const float>();
  float* y = call.outputs[0].as<float>();
  const int64_t s = state.size;
  for (int64_t r = 0; r < state.rows; ++r) {
    const float* row = x + r * s;
    float acc[kBlock] = {};
    int64_t i = 0;
    for (; i + kBlock <= s; i += kBlock) {
      for (int64_t j = 0; j < kBlock; ++j) acc[j] += row[i + j];
    }
    float sum = 0;
    for (; i < s; ++i) sum += row[i];
    for (int64_t j = 0; j < kBlock; ++j) sum += acc[j];
    y[r] = sum / static_cast<float>(s);
  }
}

void runGlobalMax(const KernelCall& call) {
  const auto& state = static_cast<const GlobalState&>(*call.state);
  const float* x = call.inputs[0].as<const float>();
  float* y = call.outputs[0].as<float>();
  const int64_t s = state.size;
  // The vector kernels' max: NaN when any element is NaN, as ONNX's
  // reference (numpy's max) gives.
  const vec::VectorKernels& v = vec::vectorKernels();
  for (int64_t r = 0; r < state.rows; ++r) y[r] = v.max(x + r * s, s);
}

}  // namespace

void registerPoolKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"MaxPool", &prepareMaxPool, &runPool});
  registry.add(KernelDef{"AveragePool", &prepareAveragePool, &runPool});
  registry.add(KernelDef{"LpPool", &prepareLpPool, &runPool});
  registry.add(KernelDef{"GlobalAveragePool", &prepareGlobalAverage, &runGlobalAverage});
  registry.add(KernelDef{"GlobalMaxPool", &prepareGlobalMax, &runGlobalMax});
  registry.add(KernelDef{"kiln.NhwcMaxPool", &prepareNhwcMaxPool, &runPool});
  registry.add(KernelDef{"kiln.NhwcAveragePool", &prepareNhwcAveragePool, &runPool});
  registry.add(KernelDef{"kiln.NhwcGlobalAveragePool", &prepareNhwcGlobalAverage, &runNhwcGlobalAverage});
  registry.add(KernelDef{"kiln.NhwcGlobalMaxPool", &prepareNhwcGlobalMax, &runNhwcGlobalMax});
}

}  // namespace kiln
