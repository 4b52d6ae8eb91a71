// Neural-network operators: convolution and pooling (sliding windows),
// MatMul and Gemm and their fused forms (kiln domain), the normalisations,
// Softmax and its kin, LRN.
//
// Sliding-window output sizes follow the ONNX formulas. An output size that
// depends on an unknown input size is unknown, except where it is the input
// size itself (stride 1 with "same" padding), which keeps the symbol.
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>
#include <string>

#include "core/fused_activation.h"
#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;

constexpr int64_t kUnknownKernel = -1;

enum class AutoPad { kNotSet, kValid, kSameUpper, kSameLower };

void setUnknownShape(InferenceContext& context, DType dtype) { context.output(0) = ValueType{dtype, std::nullopt}; }

// The attributes of a sliding window over `spatial` axes, validated.
struct Window {
  Ints kernel;  // kUnknownKernel where unknown (from weights of unknown shape)
  Ints strides;
  Ints dilations;
  Ints pads;  // begin values, then end values
  AutoPad auto_pad = AutoPad::kNotSet;
  bool ceil_mode = false;
};

// The int list attribute `name`, which must have `size` values, each at
// least `minimum`; `fallback` when absent.
Ints sizedInts(const InferenceContext& context, const std::string& name, size_t size, int64_t minimum,
               const Ints& fallback) {
  const Ints values = context.node().intsAttribute(name, fallback);
  if (values.size() != size) {
    context.fail("attribute '{}' has {} values, but the input has {} spatial axes, so {} are expected", name,
                 values.size(), size / (name == "pads" ? 2 : 1), size);
  }
  for (int64_t value : values) {
    if (value < minimum) {
      context.fail("attribute '{}' [{}] has the value {}; at least {} expected", name, fmt::join(values, ", "), value,
                   minimum);
    }
  }
  return values;
}

AutoPad autoPad(const InferenceContext& context) {
  const std::string text = context.node().stringAttribute("auto_pad", "NOTSET");
  if (text == "NOTSET") return AutoPad::kNotSet;
  if (text == "VALID") return AutoPad::kValid;
  if (text == "SAME_UPPER") return AutoPad::kSameUpper;
  if (text == "SAME_LOWER") return AutoPad::kSameLower;
  context.fail("auto_pad is '{}', not NOTSET, VALID, SAME_UPPER or SAME_LOWER", text);
}

// `kernel`: the kernel's spatial sizes when they come from elsewhere (the
// weights of Conv); nullopt means the kernel_shape attribute is required.
Window readWindow(const InferenceContext& context, size_t spatial, const std::optional<Ints>& kernel) {
  Window window;
  if (context.node().hasAttribute("kernel_shape")) {
    window.kernel = sizedInts(context, "kernel_shape", spatial, 1, {});
    if (kernel) {
      for (size_t i = 0; i < spatial; ++i) {
        if ((*kernel)[i] != kUnknownKernel && (*kernel)[i] != window.kernel[i]) {
          context.fail("kernel_shape [{}] differs from the weights' spatial sizes [{}]", fmt::join(window.kernel, ", "),
                       fmt::join(*kernel, ", "));
        }
      }
    }
  } else if (kernel) {
    window.kernel = *kernel;
  } else {
    context.fail("needs the 'kernel_shape' attribute");
  }
  window.strides = sizedInts(context, "strides", spatial, 1, Ints(spatial, 1));
  window.dilations = sizedInts(context, "dilations", spatial, 1, Ints(spatial, 1));
  window.pads = sizedInts(context, "pads", 2 * spatial, 0, Ints(2 * spatial, 0));
  window.auto_pad = autoPad(context);
  window.ceil_mode = context.node().intAttribute("ceil_mode", 0) != 0;
  if (window.auto_pad == AutoPad::kValid) window.pads.assign(2 * spatial, 0);
  return window;
}

// The output size of spatial axis `axis` of a convolution or pooling.
Dim windowOutput(const InferenceContext& context, const Window& window, size_t axis, const Dim& in) {
  const size_t spatial = window.strides.size();
  const int64_t stride = window.strides[axis];
  if (window.auto_pad == AutoPad::kSameUpper || window.auto_pad == AutoPad::kSameLower) {
    if (!in.isKnown()) return stride == 1 ? in : Dim{};
    return Dim::known(addDims(context, in.size, subtractDims(context, stride, 1)) / stride);
  }
  const int64_t kernel = window.kernel[axis];
  if (kernel == kUnknownKernel) return Dim{};
  // The dilated kernel's extent, (kernel - 1) * dilation + 1, and the rest
  // checked: attributes come from the model.
  const int64_t extent = addDims(context, multiplyDims(context, subtractDims(context, kernel, 1), window.dilations[axis]), 1);
  const int64_t pad_begin = window.pads[axis];
  const int64_t pads = addDims(context, pad_begin, window.pads[axis + spatial]);
  if (!in.isKnown()) return stride == 1 && pads == extent - 1 ? in : Dim{};
  const int64_t room = subtractDims(context, addDims(context, in.size, pads), extent);
  if (room < 0) {
    context.fail("spatial axis {}: the kernel spans {} elements (dilations included) but the padded input has {}", axis,
                 extent, in.size + pads);
  }
  int64_t out = room / stride + 1;
  if (window.ceil_mode && room % stride != 0) {
    ++out;
    // The last window must start inside the input or the left padding
    // (ONNX since 1.16, PyTorch, onnxruntime).
    if (multiplyDims(context, out - 1, stride) >= addDims(context, in.size, pad_begin)) --out;
  }
  return Dim::known(out);
}

// The input's spatial rank, failing unless it is [N, C, spatial...].
size_t spatialRank(const InferenceContext& context, const std::vector<Dim>& x) {
  if (x.size() < 3) context.fail("needs an input [N, C, spatial...] of rank 3 or more, found {}", dimsText(x));
  return x.size() - 2;
}

// The kernel's spatial sizes from weights [M, C/group, k...].
Ints kernelFromWeights(const std::vector<Dim>* weights, size_t spatial) {
  Ints kernel(spatial, kUnknownKernel);
  for (size_t i = 0; weights && i < spatial; ++i) {
    if ((*weights)[i + 2].isKnown()) kernel[i] = (*weights)[i + 2].size;
  }
  return kernel;
}

// Fails unless the weights have the input's rank.
void checkWeightsRank(const InferenceContext& context, const std::vector<Dim>& x, const std::vector<Dim>* w) {
  if (w && w->size() != x.size()) {
    context.fail("the weights {} must have the rank of the input {}", dimsText(*w), dimsText(x));
  }
}

int64_t groups(const InferenceContext& context) {
  const int64_t group = context.node().intAttribute("group", 1);
  if (group < 1) context.fail("group must be positive, found {}", group);
  return group;
}

// Fails unless the optional bias (input 2) is [channels].
void checkBias(const InferenceContext& context, const Dim& channels) {
  const std::vector<Dim>* bias = knownShape(context, 2);
  if (!bias) return;
  if (bias->size() != 1 || (channels.isKnown() && (*bias)[0].isKnown() && (*bias)[0].size != channels.size)) {
    context.fail("the bias {} must be [{}], one value per output channel", dimsText(*bias),
                 channels.isKnown() ? std::to_string(channels.size) : "M");
  }
}

// ------------------------------------------------------------------- Conv

void conv(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* x = knownShape(context, 0);
  const std::vector<Dim>* w = knownShape(context, 1);
  if (!x) {
    // The weights still give the rank and the output channels.
    if (!w) return setUnknownShape(context, dtype);
    std::vector<Dim> out(w->size());
    if (out.size() >= 2) out[1] = (*w)[0];
    context.output(0) = ValueType{dtype, out};
    return;
  }
  const size_t spatial = spatialRank(context, *x);
  checkWeightsRank(context, *x, w);
  const int64_t group = groups(context);
  const Dim channels = (*x)[1];
  const Dim out_channels = w ? (*w)[0] : Dim{};
  if (w && channels.isKnown() && (*w)[1].isKnown() && channels.size != (*w)[1].size * group) {
    context.fail("the input {} has {} channels but the weights {} take {} ({} per group x {} groups)", dimsText(*x),
                 channels.size, dimsText(*w), (*w)[1].size * group, (*w)[1].size, group);
  }
  if (out_channels.isKnown() && out_channels.size % group != 0) {
    context.fail("the {} output channels of the weights {} do not divide into {} groups", out_channels.size,
                 dimsText(*w), group);
  }
  checkBias(context, out_channels);
  const Window window = readWindow(context, spatial, kernelFromWeights(w, spatial));
  std::vector<Dim> out{(*x)[0], out_channels};
  for (size_t i = 0; i < spatial; ++i) out.push_back(windowOutput(context, window, i, (*x)[i + 2]));
  context.output(0) = ValueType{dtype, out};
}

// The output size of spatial axis `axis` of a transposed convolution.
Dim transposedOutput(const InferenceContext& context, const Window& window, const Ints& output_padding, size_t axis,
                     const Dim& in) {
  const int64_t stride = window.strides[axis];
  if (window.auto_pad == AutoPad::kSameUpper || window.auto_pad == AutoPad::kSameLower) {
    if (!in.isKnown()) return stride == 1 ? in : Dim{};
    return Dim::known(multiplyDims(context, in.size, stride));
  }
  const int64_t kernel = window.kernel[axis];
  if (kernel == kUnknownKernel) return Dim{};
  const int64_t extent = addDims(context, multiplyDims(context, subtractDims(context, kernel, 1), window.dilations[axis]), 1);
  const int64_t pads = addDims(context, window.pads[axis], window.pads[axis + window.strides.size()]);
  // beyond stride * (in - 1) + 1
  const int64_t growth = subtractDims(context, addDims(context, output_padding[axis], subtractDims(context, extent, 1)), pads);
  if (!in.isKnown()) return stride == 1 && growth == 0 ? in : Dim{};
  const int64_t out = addDims(context, addDims(context, multiplyDims(context, stride, subtractDims(context, in.size, 1)), 1), growth);
  if (out < 1) context.fail("spatial axis {}: the output size {} is not positive (pads too large?)", axis, out);
  return Dim::known(out);
}

void convTranspose(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* x = knownShape(context, 0);
  const std::vector<Dim>* w = knownShape(context, 1);
  const int64_t group = groups(context);
  const Dim out_channels = w && w->size() >= 2 && (*w)[1].isKnown() ? Dim::known(multiplyDims(context, (*w)[1].size, group)) : Dim{};
  if (!x) {
    if (!w) return setUnknownShape(context, dtype);
    std::vector<Dim> out(w->size());
    if (out.size() >= 2) out[1] = out_channels;
    context.output(0) = ValueType{dtype, out};
    return;
  }
  const size_t spatial = spatialRank(context, *x);
  checkWeightsRank(context, *x, w);
  const Dim channels = (*x)[1];
  if (w && channels.isKnown() && (*w)[0].isKnown() && channels.size != (*w)[0].size) {
    context.fail("the input {} has {} channels but the weights {} take {}", dimsText(*x), channels.size, dimsText(*w),
                 (*w)[0].size);
  }
  if (channels.isKnown() && channels.size % group != 0) {
    context.fail("the {} input channels do not divide into {} groups", channels.size, group);
  }
  checkBias(context, out_channels);
  const Window window = readWindow(context, spatial, kernelFromWeights(w, spatial));
  const Ints output_padding = sizedInts(context, "output_padding", spatial, 0, Ints(spatial, 0));
  std::vector<Dim> out{(*x)[0], out_channels};
  if (context.node().hasAttribute("output_shape")) {
    // The spatial sizes outright; some exporters write [N, C, spatial...].
    Ints shape = context.node().intsAttribute("output_shape", {});
    if (shape.size() == spatial + 2) shape.erase(shape.begin(), shape.begin() + 2);
    if (shape.size() != spatial) {
      context.fail("output_shape [{}] must have one size per spatial axis ({})", fmt::join(shape, ", "), spatial);
    }
    for (int64_t size : shape) out.push_back(Dim::known(size));
  } else {
    for (size_t i = 0; i < spatial; ++i) {
      out.push_back(transposedOutput(context, window, output_padding, i, (*x)[i + 2]));
    }
  }
  context.output(0) = ValueType{dtype, out};
}

// ---------------------------------------------------------------- Pooling

// MaxPool, AveragePool, LpPool: output 1 (MaxPool's Indices) is i64.
void pool(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* x = knownShape(context, 0);
  std::optional<std::vector<Dim>> out;
  if (x) {
    const size_t spatial = spatialRank(context, *x);
    const Window window = readWindow(context, spatial, std::nullopt);
    out = std::vector<Dim>{(*x)[0], (*x)[1]};
    for (size_t i = 0; i < spatial; ++i) out->push_back(windowOutput(context, window, i, (*x)[i + 2]));
  } else if (!context.node().hasAttribute("kernel_shape")) {
    context.fail("needs the 'kernel_shape' attribute");
  }
  context.output(0) = ValueType{dtype, out};
  if (context.outputCount() > 1) context.output(1) = ValueType{DType::kI64, out};
}

void globalPool(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* x = knownShape(context, 0);
  if (!x) return setUnknownShape(context, dtype);
  const size_t spatial = spatialRank(context, *x);
  std::vector<Dim> out{(*x)[0], (*x)[1]};
  out.insert(out.end(), spatial, Dim::known(1));
  context.output(0) = ValueType{dtype, out};
}

// ------------------------------------------------------------ MatMul, Gemm

void sameDType(const InferenceContext& context, size_t a, size_t b) {
  if (context.inputType(a).dtype != context.inputType(b).dtype) {
    context.fail("input {} is {} but input {} is {}: they must match", a, dtypeName(context.inputType(a).dtype), b,
                 dtypeName(context.inputType(b).dtype));
  }
}

// numpy.matmul: a 1-D A is a row [1, K] and a 1-D B a column [K, 1], the
// added axis removed again; the batch dimensions broadcast.
void matMul(InferenceContext& context) {
  sameDType(context, 0, 1);
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* a_shape = knownShape(context, 0);
  const std::vector<Dim>* b_shape = knownShape(context, 1);
  for (const std::vector<Dim>* shape : {a_shape, b_shape}) {
    if (shape && shape->empty()) context.fail("needs inputs of rank 1 or more, found a scalar");
  }
  if (!a_shape || !b_shape) return setUnknownShape(context, dtype);
  std::vector<Dim> a = *a_shape, b = *b_shape;
  if (a.size() == 1) a.insert(a.begin(), Dim::known(1));
  if (b.size() == 1) b.push_back(Dim::known(1));
  const Dim& k_a = a.back();
  const Dim& k_b = b[b.size() - 2];
  if (k_a.isKnown() && k_b.isKnown() && k_a.size != k_b.size) {
    context.fail("cannot multiply {} by {}: the inner dimensions {} and {} differ", dimsText(*a_shape),
                 dimsText(*b_shape), k_a.size, k_b.size);
  }
  std::vector<Dim> out =
      broadcastShapes(context, std::vector<Dim>(a.begin(), a.end() - 2), std::vector<Dim>(b.begin(), b.end() - 2));
  if (a_shape->size() > 1) out.push_back(a[a.size() - 2]);
  if (b_shape->size() > 1) out.push_back(b.back());
  context.output(0) = ValueType{dtype, out};
}

// Y = alpha * A' B' + beta * C with A' = A or its transpose; C broadcasts
// (one way) to [M, N].
void gemm(InferenceContext& context) {
  sameDType(context, 0, 1);
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* a = knownShape(context, 0);
  const std::vector<Dim>* b = knownShape(context, 1);
  for (size_t i : {0u, 1u}) {
    const std::vector<Dim>* shape = knownShape(context, i);
    if (shape && shape->size() != 2) context.fail("input {} must be 2-D, found {}", i, dimsText(*shape));
  }
  const bool trans_a = context.node().intAttribute("transA", 0) != 0;
  const bool trans_b = context.node().intAttribute("transB", 0) != 0;
  const Dim m = a ? (*a)[trans_a ? 1 : 0] : Dim{};
  const Dim n = b ? (*b)[trans_b ? 0 : 1] : Dim{};
  if (a && b) {
    const Dim& k_a = (*a)[trans_a ? 0 : 1];
    const Dim& k_b = (*b)[trans_b ? 1 : 0];
    if (k_a.isKnown() && k_b.isKnown() && k_a.size != k_b.size) {
      context.fail("A {} (transA={}) and B {} (transB={}) have different inner dimensions, {} and {}", dimsText(*a),
                   trans_a ? 1 : 0, dimsText(*b), trans_b ? 1 : 0, k_a.size, k_b.size);
    }
  }
  const std::vector<Dim> out{m, n};
  if (const std::vector<Dim>* c = knownShape(context, 2)) {
    if (c->size() > 2) context.fail("C {} must have rank 2 or less", dimsText(*c));
    for (size_t i = 0; i < c->size(); ++i) {
      const Dim& dim = (*c)[i];
      const Dim& target = out[2 - c->size() + i];
      if (dim.isKnown() && dim.size != 1 && target.isKnown() && dim.size != target.size) {
        context.fail("C {} does not broadcast to the output {}", dimsText(*c), dimsText(out));
      }
    }
  }
  context.output(0) = ValueType{dtype, out};
}

// ------------------------------------------- kiln.FusedMatMul, kiln.FusedGemm

// What passes/matmul_fusion.cc makes of a MatMul or Gemm and the nodes after
// it (kernels in kernels/cpu/matmul.cc):
//   FusedMatMul(A, B, bias?, residual?) = act(MatMul(A, B) + bias + residual)
//   FusedGemm(A, B, C?)                 = act(Gemm(A, B, C))
// FusedMatMul needs A and B of rank 2 or more; its bias is [N] or [1, ..., N]
// (N = B's last dimension, no more dimensions than the output) and its
// residual has the output's shape. act is core/fused_activation.h's.
void checkActivation(const InferenceContext& context) {
  const std::string name = context.node().stringAttribute(std::string(kActivationAttribute), "");
  if (!parseFusedActivation(name)) context.fail("activation '{}' is not one kiln fuses", name);
}

void fusedMatMul(InferenceContext& context) {
  for (size_t i : {0u, 1u}) {
    const std::vector<Dim>* shape = knownShape(context, i);
    if (shape && shape->size() < 2) context.fail("input {} must have rank 2 or more, found {}", i, dimsText(*shape));
  }
  matMul(context);
  checkActivation(context);
  const std::optional<std::vector<Dim>>& out = context.output(0).shape;
  if (context.hasInput(2)) {
    sameDType(context, 0, 2);
    const std::vector<Dim>* bias = knownShape(context, 2);
    const Dim n = out && !out->empty() ? out->back() : Dim{};
    bool fits = !bias || (!bias->empty() && (!out || bias->size() <= out->size()));
    for (size_t i = 0; bias && fits && i < bias->size(); ++i) {
      const Dim& dim = (*bias)[i];
      const Dim want = i + 1 == bias->size() ? n : Dim::known(1);
      fits = !dim.isKnown() || !want.isKnown() || dim.size == want.size;
    }
    if (!fits) context.fail("the bias {} must be [N] or [1, ..., N] for the output {}", dimsText(*bias), dimsText(*out));
  }
  if (context.hasInput(3)) {
    sameDType(context, 0, 3);
    const std::vector<Dim>* residual = knownShape(context, 3);
    bool fits = !residual || !out || residual->size() == out->size();
    for (size_t i = 0; residual && out && fits && i < out->size(); ++i) {
      const Dim &a = (*residual)[i], &b = (*out)[i];
      fits = !a.isKnown() || !b.isKnown() || a.size == b.size;
    }
    if (!fits) {
      context.fail("the residual {} must have the output's shape {}", dimsText(*residual), dimsText(*out));
    }
  }
}

void fusedGemm(InferenceContext& context) {
  gemm(context);
  checkActivation(context);
}

// ---------------------------------------------------------- Normalisation

// Fails unless input `index`, when present and known, is [size].
void checkPerChannel(const InferenceContext& context, size_t index, const Dim& size, const char* what) {
  const std::vector<Dim>* shape = knownShape(context, index);
  if (!shape) return;
  if (shape->size() != 1 || (size.isKnown() && (*shape)[0].isKnown() && (*shape)[0].size != size.size)) {
    context.fail("{} (input {}) is {} but must be [{}]", what, index, dimsText(*shape),
                 size.isKnown() ? std::to_string(size.size) : "C");
  }
}

// The channel count of input 0 ([N, C, ...]), failing on a rank below
// `min_rank`; unknown when the shape is.
Dim channelsOf(const InferenceContext& context, size_t min_rank) {
  const std::vector<Dim>* x = knownShape(context, 0);
  if (!x) return Dim{};
  if (x->size() < min_rank) {
    context.fail("needs an input [N, C, ...] of rank {} or more, found {}", min_rank, dimsText(*x));
  }
  return (*x)[1];
}

// Outputs beyond the first (training mode) are per-channel statistics.
void batchNormalization(InferenceContext& context) {
  const Dim channels = channelsOf(context, 2);
  // Before opset 9, spatial=0 meant one parameter per element of [C, D...].
  if (context.node().intAttribute("spatial", 1) != 0) {
    const char* names[] = {"", "scale", "B", "mean", "var"};
    for (size_t i = 1; i < 5; ++i) checkPerChannel(context, i, channels, names[i]);
  }
  copyInputType(context);
  for (size_t i = 1; i < context.outputCount(); ++i) {
    context.output(i) = ValueType{context.inputType(3).dtype, std::vector<Dim>{channels}};
  }
}

void instanceNormalization(InferenceContext& context) {
  const Dim channels = channelsOf(context, 3);
  checkPerChannel(context, 1, channels, "scale");
  checkPerChannel(context, 2, channels, "B");
  copyInputType(context);
}

// Normalises over the axes from `axis` on; Mean and InvStdDev keep the
// leading dims and have 1s for the normalised ones, in the stash type.
void layerNormalization(InferenceContext& context) {
  copyInputType(context);
  const int64_t stash = context.node().intAttribute("stash_type", 1);
  if (stash <= 0 || stash > 255 || !isValidDType(static_cast<uint8_t>(stash))) {
    context.fail("stash_type {} is not a data type kiln supports", stash);
  }
  const std::vector<Dim>* x = knownShape(context, 0);
  std::optional<std::vector<Dim>> stats;
  if (x) {
    const size_t axis = normalizeAxis(context, context.node().intAttribute("axis", -1), x->size());
    stats = std::vector<Dim>(x->begin(), x->begin() + static_cast<std::ptrdiff_t>(axis));
    stats->insert(stats->end(), x->size() - axis, Dim::known(1));
    for (size_t i : {1u, 2u}) {
      const std::vector<Dim>* param = knownShape(context, i);
      if (param && param->size() > x->size() - axis) {
        context.fail("input {} {} has more dimensions than the {} normalised ones of {}", i, dimsText(*param),
                     x->size() - axis, dimsText(*x));
      }
    }
  }
  for (size_t i = 1; i < context.outputCount(); ++i) context.output(i) = ValueType{static_cast<DType>(stash), stats};
}

// Opset 18 has scale and bias of [num_groups], opset 21 of [C].
void groupNormalization(InferenceContext& context, bool per_channel) {
  const int64_t num_groups = context.node().intAttribute("num_groups", 0);
  if (num_groups < 1) context.fail("needs a positive 'num_groups' attribute, found {}", num_groups);
  const Dim channels = channelsOf(context, 2);
  if (channels.isKnown() && channels.size % num_groups != 0) {
    context.fail("the {} channels do not divide into {} groups", channels.size, num_groups);
  }
  const Dim size = per_channel ? channels : Dim::known(num_groups);
  checkPerChannel(context, 1, size, "scale");
  checkPerChannel(context, 2, size, "bias");
  copyInputType(context);
}

// Softmax, LogSoftmax, Hardmax: the axis defaults to 1 before opset 13 and
// to -1 from 13; either way it must exist in the input.
void softmaxLike(InferenceContext& context, int64_t default_axis) {
  if (const std::vector<Dim>* x = knownShape(context, 0)) {
    normalizeAxis(context, context.node().intAttribute("axis", default_axis), x->size());
  }
  copyInputType(context);
}

void lrn(InferenceContext& context) {
  const int64_t size = context.node().intAttribute("size", 0);
  if (size < 1) context.fail("needs a positive 'size' attribute, found {}", size);
  channelsOf(context, 3);
  copyInputType(context);
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer, size_t max_outputs = 1) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, 1, max_outputs, std::move(infer)});
}

// ------------------------------------------------------------ channels-last

// kiln.NhwcConv, kiln.NhwcMaxPool, ...: the ONNX operator without the "Nhwc"
// prefix, with attributes and inputs of the same meaning, except that the
// first input and the output hold [N, H, W, C] where ONNX has [N, C, H, W]
// (written by the channels-last pass, src/passes/channels_last.h).
// Inference runs the newest schema of the ONNX operator on a scratch node
// that sees the first input in NCHW, then converts the output back.
std::vector<Dim> permuted(const std::vector<Dim>& dims, const std::array<size_t, 4>& order) {
  std::vector<Dim> out;
  for (size_t axis : order) out.push_back(dims[axis]);
  return out;
}

// kiln.Blocked16Conv: Conv whose first input and output hold oneDNN's
// nChw16c layout as 5-D tensors [N, C/16, H, W, 16] (written by the
// blocked-convolution pass, src/passes/blocked_conv.h).
enum class Layout { kNhwc, kBlocked16 };

constexpr int64_t kBlock = 16;

std::vector<Dim> toNchw(const std::vector<Dim>& dims, Layout layout) {
  if (layout == Layout::kNhwc) return permuted(dims, {0, 3, 1, 2});
  const Dim channels = dims[1].isKnown() ? Dim::known(dims[1].size * kBlock) : Dim{};
  return {dims[0], channels, dims[2], dims[3]};
}

std::vector<Dim> fromNchw(const std::vector<Dim>& dims, Layout layout) {
  if (layout == Layout::kNhwc) return permuted(dims, {0, 2, 3, 1});
  const Dim blocks = dims[1].isKnown() ? Dim::known((dims[1].size + kBlock - 1) / kBlock) : Dim{};
  return {dims[0], blocks, dims[2], dims[3], Dim::known(kBlock)};
}

// `inputs`: how many of the node's inputs the ONNX operator takes (the rest
// are kiln's: kiln.NhwcQLinearConv's fused residual).
void inferInLayout(InferenceContext& context, const std::string& op, Layout layout, size_t inputs_of_op = SIZE_MAX) {
  const std::vector<Dim>* x = knownShape(context, 0);
  if (!x) return setUnknownShape(context, context.inputType(0).dtype);
  if (layout == Layout::kNhwc && x->size() != 4) context.fail("needs a 4-D input [N, H, W, C], got {}", dimsText(*x));
  if (layout == Layout::kBlocked16 && (x->size() != 5 || (*x)[4] != Dim::known(kBlock))) {
    context.fail("needs a 5-D input [N, C/16, H, W, 16], got {}", dimsText(*x));
  }
  constexpr int64_t kNewest = std::numeric_limits<int64_t>::max();
  const OpSchema* schema = OpRegistry::global().find("", op, kNewest);
  Graph scratch("layout");
  std::vector<ValueId> inputs;
  for (size_t i = 0; i < std::min(context.inputCount(), inputs_of_op); ++i) {
    if (!context.hasInput(i)) {
      inputs.push_back(kNoValue);
      continue;
    }
    const std::string name = "input" + std::to_string(i);
    if (ConstantPtr constant = context.inputConstant(i)) {
      inputs.push_back(scratch.addInitializer(name, constant));
      continue;
    }
    ValueType type = context.inputType(i);
    if (i == 0) type.shape = toNchw(*x, layout);
    inputs.push_back(scratch.addInput(name, type));
  }
  const NodeId id =
      scratch.addNode(op, inputs, std::vector<std::string>(context.outputCount(), ""), context.node().attributes);
  InferenceContext inner(scratch, scratch.node(id), schema->since_version);
  schema->infer(inner);
  for (size_t i = 0; i < context.outputCount(); ++i) {
    ValueType type = inner.output(i);
    if (type.shape && type.shape->size() == 4) type.shape = fromNchw(*type.shape, layout);
    context.output(i) = type;
  }
}

}  // namespace

void registerNnOps(OpRegistry& registry) {
  auto nhwc = [&](const std::string& op, size_t min_inputs, size_t max_inputs) {
    registry.add(OpSchema{"kiln", "Nhwc" + op, 1, min_inputs, max_inputs, 1, 1,
                          [op](InferenceContext& context) { inferInLayout(context, op, Layout::kNhwc); }});
  };
  nhwc("Conv", 2, 4);  // input 3: a fused residual Add (src/passes/conv_fusion.h)
  // Inputs 9 to 11: a fused residual QLinearAdd's other operand, scale and
  // zero point (src/passes/conv_fusion.h), which ONNX's QLinearConv has not.
  registry.add(OpSchema{"kiln", "NhwcQLinearConv", 1, 8, 12, 1, 1, [](InferenceContext& context) {
                          inferInLayout(context, "QLinearConv", Layout::kNhwc, 9);
                        }});
  nhwc("ConvTranspose", 2, 4);  // input 3: the same, when its patches do not overlap
  nhwc("MaxPool", 1, 1);
  nhwc("AveragePool", 1, 1);
  nhwc("GlobalAveragePool", 1, 1);
  nhwc("GlobalMaxPool", 1, 1);
  nhwc("Resize", 3, 4);  // the opset-11 inputs: X, roi, scales, sizes
  registry.add(OpSchema{"kiln", "Blocked16Conv", 1, 2, 4, 1, 1,
                        [](InferenceContext& context) { inferInLayout(context, "Conv", Layout::kBlocked16); }});
  add(registry, "Conv", 1, 2, 3, conv);
  // kiln.FusedConv: an NCHW Conv with fused post-ops (src/passes/conv_fusion.h)
  // and their residual as input 3; made for the cuda target.
  registry.add(OpSchema{"kiln", "FusedConv", 1, 2, 4, 1, 1, conv});
  add(registry, "ConvTranspose", 1, 2, 3, convTranspose);
  add(registry, "MaxPool", 1, 1, 1, pool);
  add(registry, "MaxPool", 8, 1, 1, pool, 2);   // the Indices output; ceil_mode and dilations from 10
  add(registry, "AveragePool", 1, 1, 1, pool);  // ceil_mode from 10, dilations from 19
  add(registry, "LpPool", 1, 1, 1, pool);       // ceil_mode and dilations from 18
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}) add(registry, op, 1, 1, 1, globalPool);
  add(registry, "MatMul", 1, 2, 2, matMul);
  add(registry, "Gemm", 1, 3, 3, gemm);
  add(registry, "Gemm", 11, 2, 3, gemm);  // C becomes optional
  registry.add(OpSchema{"kiln", "FusedMatMul", 1, 2, 4, 1, 1, fusedMatMul});
  registry.add(OpSchema{"kiln", "FusedGemm", 1, 2, 3, 1, 1, fusedGemm});
  add(registry, "BatchNormalization", 1, 5, 5, batchNormalization, 5);
  add(registry, "BatchNormalization", 14, 5, 5, batchNormalization, 3);  // training_mode: running mean and var
  add(registry, "InstanceNormalization", 1, 3, 3, instanceNormalization);
  add(registry, "LayerNormalization", 17, 2, 3, layerNormalization, 3);
  // onnxruntime defines LayerNormalization in the default domain from version
  // 1 (its transformer optimizer writes it into models of any opset); ONNX's
  // of opset 17 is the same operator, and runs on the same kernel.
  add(registry, "LayerNormalization", 1, 2, 3, layerNormalization, 3);
  add(registry, "GroupNormalization", 18, 3, 3, [](InferenceContext& c) { groupNormalization(c, false); });
  add(registry, "GroupNormalization", 21, 3, 3, [](InferenceContext& c) { groupNormalization(c, true); });
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax"}) {
    add(registry, op, 1, 1, 1, [](InferenceContext& c) { softmaxLike(c, 1); });
    add(registry, op, 13, 1, 1, [](InferenceContext& c) { softmaxLike(c, -1); });
  }
  add(registry, "LRN", 1, 1, 1, lrn);
}

}  // namespace kiln
