// Shape and data-movement operators: Reshape, Flatten, Squeeze, Unsqueeze,
// Transpose, Concat, Split, Slice, the Gathers and Scatters, Expand, Shape,
// Size, ConstantOfShape, Constant, Tile, Pad, Resize/Upsample, Range,
// DepthToSpace, SpaceToDepth, TopK, Trilu, CumSum, OneHot.
//
// Many of these take their parameters (a target shape, slice bounds, pads)
// as inputs. Only initializers count as constant here; when such an input
// is computed by the graph, the affected dimensions, or the whole shape,
// are left unknown rather than refused: the model may well be valid, we
// just cannot tell its sizes before run time.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

// Split and the other variadic-output ops accept any number of outputs.
constexpr size_t kAnyNumber = 1 << 16;

using Ints = std::vector<int64_t>;

bool isIndexType(DType dtype) { return dtype == DType::kI32 || dtype == DType::kI64; }

// The values of a constant f16, bf16, f32, f64, i32 or i64 input as doubles (Resize's
// scales, OneHot's depth), or nullopt when not constant or of another type.
std::optional<std::vector<double>> constantNumbers(const InferenceContext& context, size_t index) {
  const ConstantPtr constant = context.inputConstant(index);
  if (!constant) return std::nullopt;
  const DType dtype = constant->info.dtype;
  if (dtype == DType::kI32 || dtype == DType::kI64) {
    const Ints ints = *context.constantInts(index);
    return std::vector<double>(ints.begin(), ints.end());
  }
  if (dtype != DType::kF32 && dtype != DType::kF64 && dtype != DType::kF16 && dtype != DType::kBF16) return std::nullopt;
  const uint64_t count = constant->info.numElements();
  const std::byte* data = constant->bytes.data();
  std::vector<double> values(count);
  auto bitsToFloat = [](uint32_t bits) {
    float value;
    std::memcpy(&value, &bits, 4);
    return static_cast<double>(value);
  };
  for (uint64_t i = 0; i < count; ++i) {
    if (dtype == DType::kF32) {
      float value;
      std::memcpy(&value, data + i * 4, 4);
      values[i] = value;
    } else if (dtype == DType::kF64) {
      std::memcpy(&values[i], data + i * 8, 8);
    } else {
      uint16_t half;
      std::memcpy(&half, data + i * 2, 2);
      if (dtype == DType::kBF16) {
        values[i] = bitsToFloat(static_cast<uint32_t>(half) << 16);
        continue;
      }
      const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
      const uint32_t exponent = (half >> 10) & 0x1Fu, mantissa = half & 0x3FFu;
      if (exponent == 0x1F) {
        values[i] = bitsToFloat(sign | 0x7F800000u | (mantissa << 13));
      } else if (exponent != 0) {
        values[i] = bitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
      } else {
        values[i] = (sign != 0 ? -1.0 : 1.0) * static_cast<double>(mantissa) * 5.9604644775390625e-8;  // 2^-24
      }
    }
  }
  return values;
}

// True when `dims` certainly do not hold `count` elements.
bool surelyNotCount(const InferenceContext& context, const std::vector<Dim>& dims, int64_t count) {
  const Dim product = productOf(context, dims);
  return product.isKnown() && product.size != count;
}

// A constant input that is present but has no elements stands for an
// omitted one (Resize's roi/scales before opset 13 had to be passed so).
bool isEmptyConstant(const InferenceContext& context, size_t index) {
  const ConstantPtr constant = context.inputConstant(index);
  return constant && constant->info.numElements() == 0;
}

bool hasNonEmptyInput(const InferenceContext& context, size_t index) {
  return context.hasInput(index) && !isEmptyConstant(context, index);
}

// Fails unless input `index`, when its shape is known, is 1-D: the inputs
// that carry shapes, axes and pads.
void require1D(const InferenceContext& context, size_t index, const char* what) {
  const std::vector<Dim>* shape = knownShape(context, index);
  if (shape && shape->size() != 1) context.fail("{} (input {}) must be 1-D, found {}", what, index, dimsText(*shape));
}

// Squeeze's and Unsqueeze's axes input: 1-D, or a scalar for one axis, as
// onnxruntime accepts (ONNX's own function bodies pass one: AffineGrid's
// expansion). Its number of axes, when known.
std::optional<size_t> axesCount(const InferenceContext& context) {
  const std::vector<Dim>* shape = knownShape(context, 1);
  if (!shape) return std::nullopt;
  if (shape->size() > 1) context.fail("the axes (input 1) must be a scalar or 1-D, found {}", dimsText(*shape));
  if (shape->empty()) return 1;
  if (!(*shape)[0].isKnown()) return std::nullopt;
  return static_cast<size_t>((*shape)[0].size);
}

// The length of 1-D input `index`, when known.
std::optional<size_t> knownLength(const InferenceContext& context, size_t index) {
  const std::vector<Dim>* shape = knownShape(context, index);
  if (!shape || shape->size() != 1 || !(*shape)[0].isKnown()) return std::nullopt;
  return static_cast<size_t>((*shape)[0].size);
}

// The product of `dims`. Unlike productOf, a product with a single unknown
// factor (the others multiplying to 1) is that dimension, symbol kept.
Dim productKeepingSymbol(const InferenceContext& context, std::span<const Dim> dims) {
  int64_t known = 1;
  std::vector<Dim> unknown;
  for (const Dim& dim : dims) {
    if (dim.isKnown()) {
      known = multiplyDims(context, known, dim.size);
    } else {
      unknown.push_back(dim);
    }
  }
  if (unknown.empty()) return Dim::known(known);
  if (unknown.size() == 1 && known == 1) return unknown.front();
  return Dim{};
}

void setUnknownShape(InferenceContext& context, DType dtype, size_t output = 0) {
  context.output(output) = ValueType{dtype, std::nullopt};
}

// ---------------------------------------------------------------- Reshape

// a * b, or the inference fails: a crafted shape's product must not wrap
// (Reshape of [2, 2^62] to [-1] computed INT64_MIN % -1 and trapped).
int64_t productOrFail(InferenceContext& context, int64_t a, int64_t b, const Ints& target) {
  const std::optional<int64_t> product = multiplySizes(a, b);
  if (!product) context.fail("the sizes of the reshape to [{}] overflow 63 bits", fmt::join(target, ", "));
  return *product;
}

// The output shape of reshaping the input to `target`: 0 copies the input's
// dimension (unless allowzero), one -1 takes what is left of the elements.
void reshapeTo(InferenceContext& context, const Ints& target, bool allow_zero) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  std::vector<Dim> out(target.size());
  std::vector<bool> copied(in ? in->size() : 0, false);
  std::optional<size_t> inferred;
  bool has_zero = false;
  int64_t given_product = 1;  // of the sizes written out in `target`
  for (size_t i = 0; i < target.size(); ++i) {
    const int64_t size = target[i];
    if (size == -1) {
      if (inferred) context.fail("the shape [{}] has more than one -1", fmt::join(target, ", "));
      inferred = i;
    } else if (size == 0 && !allow_zero) {
      if (!in) continue;  // copies a dimension we do not know: stays unknown
      if (i >= in->size()) {
        context.fail("the shape [{}] copies dimension {} (a 0) but the input {} has rank {}", fmt::join(target, ", "),
                     i, dimsText(*in), in->size());
      }
      out[i] = (*in)[i];
      copied[i] = true;
    } else if (size < 0) {
      context.fail("the shape [{}] has the invalid size {}", fmt::join(target, ", "), size);
    } else {
      has_zero |= size == 0;
      out[i] = Dim::known(size);
      given_product = productOrFail(context, given_product, size, target);
    }
  }
  if (allow_zero && has_zero && inferred) {
    context.fail("the shape [{}] has both a 0 and a -1, which allowzero=1 forbids", fmt::join(target, ", "));
  }
  if (!in) {
    context.output(0) = ValueType{dtype, out};
    return;
  }
  // Copied dimensions cancel out; the rest of the input's elements must be
  // the product of the given sizes and the -1.
  int64_t rest_known = 1;
  std::vector<Dim> rest_unknown;
  for (size_t i = 0; i < in->size(); ++i) {
    if (copied[i]) continue;
    if ((*in)[i].isKnown()) {
      rest_known = productOrFail(context, rest_known, (*in)[i].size, target);
    } else {
      rest_unknown.push_back((*in)[i]);
    }
  }
  if (inferred) {
    if (rest_unknown.empty() && given_product != 0) {
      if (rest_known % given_product != 0) {
        context.fail("cannot reshape {} into [{}]: the remaining {} elements do not divide by {}", dimsText(*in),
                     fmt::join(target, ", "), rest_known, given_product);
      }
      out[*inferred] = Dim::known(rest_known / given_product);
    } else if (rest_unknown.size() == 1 && rest_known == given_product) {
      out[*inferred] = rest_unknown.front();  // [batch, 12] -> [-1, 3, 4] gives [batch, 3, 4]
    }
  } else if (rest_unknown.empty() && rest_known != given_product) {
    context.fail("cannot reshape {} into [{}]: the element counts differ ({} against {}, copied dimensions aside)",
                 dimsText(*in), fmt::join(target, ", "), rest_known, given_product);
  }
  context.output(0) = ValueType{dtype, out};
}

void reshapeV1(InferenceContext& context) {
  if (!context.node().hasAttribute("shape")) context.fail("needs the 'shape' attribute");
  reshapeTo(context, context.node().intsAttribute("shape", {}), false);
}

void reshape(InferenceContext& context) {
  require1D(context, 1, "the shape");
  if (const auto target = context.constantInts(1)) {
    reshapeTo(context, *target, context.node().intAttribute("allowzero", 0) != 0);
    return;
  }
  // The shape is computed: its length still gives the rank.
  const DType dtype = context.inputType(0).dtype;
  if (const auto rank = knownLength(context, 1)) {
    context.output(0) = ValueType{dtype, std::vector<Dim>(*rank)};
  } else {
    setUnknownShape(context, dtype);
  }
}

void flatten(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) {
    context.output(0) = ValueType{dtype, std::vector<Dim>(2)};
    return;
  }
  const auto rank = static_cast<int64_t>(in->size());
  int64_t axis = context.node().intAttribute("axis", 1);
  if (axis < -rank || axis > rank) {
    context.fail("axis {} is out of range [{}, {}] for {}", axis, -rank, rank, dimsText(*in));
  }
  if (axis < 0) axis += rank;
  const std::span<const Dim> dims(*in);
  const auto split = static_cast<size_t>(axis);
  context.output(0) = ValueType{
      dtype, std::vector<Dim>{productKeepingSymbol(context, dims.first(split)), productKeepingSymbol(context, dims.subspan(split))}};
}

// ------------------------------------------------------ Squeeze/Unsqueeze

// `axes`: nullopt when none are given (squeeze every 1).
void squeezeAxes(InferenceContext& context, const std::optional<Ints>& axes) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) return setUnknownShape(context, dtype);
  std::vector<bool> remove(in->size(), false);
  if (!axes || axes->empty()) {
    for (size_t i = 0; i < in->size(); ++i) {
      if (!(*in)[i].isKnown()) return setUnknownShape(context, dtype);  // might be 1 at run time
      remove[i] = (*in)[i].size == 1;
    }
  } else {
    for (size_t axis : normalizeAxes(context, *axes, in->size())) {
      const Dim& dim = (*in)[axis];
      if (dim.isKnown() && dim.size != 1) {
        context.fail("cannot squeeze axis {} of {}: its size is {}, not 1", axis, dimsText(*in), dim.size);
      }
      remove[axis] = true;
    }
  }
  std::vector<Dim> out;
  for (size_t i = 0; i < in->size(); ++i) {
    if (!remove[i]) out.push_back((*in)[i]);
  }
  context.output(0) = ValueType{dtype, out};
}

void squeezeV1(InferenceContext& context) {
  std::optional<Ints> axes;
  if (context.node().hasAttribute("axes")) axes = context.node().intsAttribute("axes", {});
  squeezeAxes(context, axes);
}

void squeezeV13(InferenceContext& context) {
  if (!context.hasInput(1)) return squeezeAxes(context, std::nullopt);
  const auto count = axesCount(context);
  if (const auto axes = context.constantInts(1)) return squeezeAxes(context, axes);
  // Computed axes: the rank drops by their count, which dims go is unknown.
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in || !count || *count > in->size()) return setUnknownShape(context, dtype);
  context.output(0) = ValueType{dtype, std::vector<Dim>(in->size() - *count)};
}

void unsqueezeAxes(InferenceContext& context, const Ints& axes) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) return setUnknownShape(context, dtype);
  const size_t rank = in->size() + axes.size();
  std::vector<bool> inserted(rank, false);
  for (size_t axis : normalizeAxes(context, axes, rank)) inserted[axis] = true;
  std::vector<Dim> out;
  auto next = in->begin();
  for (size_t i = 0; i < rank; ++i) out.push_back(inserted[i] ? Dim::known(1) : *next++);
  context.output(0) = ValueType{dtype, out};
}

void unsqueezeV1(InferenceContext& context) {
  if (!context.node().hasAttribute("axes")) context.fail("needs the 'axes' attribute");
  unsqueezeAxes(context, context.node().intsAttribute("axes", {}));
}

void unsqueezeV13(InferenceContext& context) {
  const auto count = axesCount(context);
  if (const auto axes = context.constantInts(1)) return unsqueezeAxes(context, *axes);
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in || !count) return setUnknownShape(context, dtype);
  context.output(0) = ValueType{dtype, std::vector<Dim>(in->size() + *count)};
}

// -------------------------------------------------------------- Transpose

void transpose(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  const bool has_perm = context.node().hasAttribute("perm");
  const Ints perm_attribute = context.node().intsAttribute("perm", {});
  if (!in) {
    if (!has_perm) return setUnknownShape(context, dtype);
    context.output(0) = ValueType{dtype, std::vector<Dim>(perm_attribute.size())};
    return;
  }
  Ints perm = perm_attribute;
  if (!has_perm) {
    perm.resize(in->size());
    std::iota(perm.rbegin(), perm.rend(), 0);  // default: reverse the axes
  }
  std::vector<bool> seen(in->size(), false);
  bool valid = perm.size() == in->size();
  for (size_t i = 0; valid && i < perm.size(); ++i) {
    valid = perm[i] >= 0 && static_cast<size_t>(perm[i]) < in->size() && !seen[perm[i]];
    if (valid) seen[perm[i]] = true;
  }
  if (!valid) {
    context.fail("perm [{}] is not a permutation of the {} axes of {}", fmt::join(perm, ", "), in->size(),
                 dimsText(*in));
  }
  std::vector<Dim> out;
  for (int64_t axis : perm) out.push_back((*in)[axis]);
  context.output(0) = ValueType{dtype, out};
}

// ----------------------------------------------------------------- Concat

void concat(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  if (context.opset() >= 4 && !context.node().hasAttribute("axis")) context.fail("needs the 'axis' attribute");
  const int64_t axis_attribute = context.node().intAttribute("axis", 1);  // 1 by default before opset 4
  std::optional<std::vector<Dim>> out;
  size_t first = 0;  // the input `out` started from
  bool axis_unknown = false;
  size_t axis = 0;
  for (size_t i = 0; i < context.inputCount(); ++i) {
    if (context.inputType(i).dtype != dtype) {
      context.fail("input {} is {} but input 0 is {}: they must match", i, dtypeName(context.inputType(i).dtype),
                   dtypeName(dtype));
    }
    const std::vector<Dim>* shape = knownShape(context, i);
    if (!shape) {
      axis_unknown = true;
      continue;
    }
    if (!out) {
      axis = normalizeAxis(context, axis_attribute, shape->size());
      out = *shape;
      first = i;
      continue;
    }
    if (shape->size() != out->size()) {
      context.fail("input {} has rank {} ({}) but input {} has rank {}", i, shape->size(), dimsText(*shape), first,
                   out->size());
    }
    for (size_t d = 0; d < shape->size(); ++d) {
      Dim& into = (*out)[d];
      const Dim& dim = (*shape)[d];
      if (d == axis) {
        into = into.isKnown() && dim.isKnown() ? Dim::known(addDims(context, into.size, dim.size)) : Dim{};
      } else if (into.isKnown() && dim.isKnown() && into.size != dim.size) {
        context.fail("input {} is {} and input {} is {}: they may differ only along axis {}", first, dimsText(*out), i,
                     dimsText(*shape), axis);
      } else if (!into.isKnown() && dim.isKnown()) {
        into = dim;
      }
    }
  }
  if (!out) return setUnknownShape(context, dtype);
  if (axis_unknown) (*out)[axis] = Dim{};
  context.output(0) = ValueType{dtype, *out};
}

// ------------------------------------------------------------------ Split

// `split`: the sizes when given and constant; `split_given`: whether sizes
// were given at all; `num_outputs`: opset 18's attribute, 0 when absent.
void splitInto(InferenceContext& context, const std::optional<Ints>& split, bool split_given, int64_t num_outputs) {
  const DType dtype = context.inputType(0).dtype;
  const size_t n = context.outputCount();
  const std::vector<Dim>* in = knownShape(context, 0);
  if (split_given && num_outputs != 0) context.fail("takes either 'split' or 'num_outputs', not both");
  if (num_outputs != 0 && static_cast<size_t>(num_outputs) != n) {
    context.fail("num_outputs is {} but the node has {} outputs", num_outputs, n);
  }
  if (split && split->size() != n) context.fail("split has {} sizes for {} outputs", split->size(), n);
  if (!in) {
    for (size_t i = 0; i < n; ++i) setUnknownShape(context, dtype, i);
    return;
  }
  const size_t axis = normalizeAxis(context, context.node().intAttribute("axis", 0), in->size());
  const Dim& dim = (*in)[axis];
  std::vector<Dim> sizes(n);
  if (split) {
    int64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      if ((*split)[i] < 0) context.fail("split [{}] has a negative size", fmt::join(*split, ", "));
      sizes[i] = Dim::known((*split)[i]);
      total = addDims(context, total, (*split)[i]);
    }
    if (dim.isKnown() && total != dim.size) {
      context.fail("split [{}] adds up to {} but axis {} of {} has size {}", fmt::join(*split, ", "), total, axis,
                   dimsText(*in), dim.size);
    }
  } else if (!split_given && n == 1) {
    sizes[0] = dim;
  } else if (!split_given && dim.isKnown()) {
    const auto parts = static_cast<int64_t>(n);
    if (num_outputs != 0) {
      // Opset 18: chunks of ceil(size / n), the last one smaller.
      const int64_t chunk = addDims(context, dim.size, parts - 1) / parts;
      const int64_t last = dim.size - chunk * (parts - 1);
      if (last < 0) context.fail("axis {} of size {} cannot be split into {} chunks of {}", axis, dim.size, n, chunk);
      for (size_t i = 0; i < n; ++i) sizes[i] = Dim::known(i + 1 == n ? last : chunk);
    } else {
      if (dim.size % parts != 0) {
        context.fail("axis {} of {} has size {}, which does not split evenly into {} outputs", axis, dimsText(*in),
                     dim.size, n);
      }
      for (size_t i = 0; i < n; ++i) sizes[i] = Dim::known(dim.size / parts);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    std::vector<Dim> out = *in;
    out[axis] = sizes[i];
    context.output(i) = ValueType{dtype, out};
  }
}

void splitV1(InferenceContext& context) {
  const bool given = context.node().hasAttribute("split");
  std::optional<Ints> split;
  if (given) split = context.node().intsAttribute("split", {});
  splitInto(context, split, given, 0);
}

void splitV13(InferenceContext& context) {
  const bool given = hasNonEmptyInput(context, 1);
  if (given) require1D(context, 1, "split");
  const int64_t num_outputs = context.opset() >= 18 ? context.node().intAttribute("num_outputs", 0) : 0;
  if (context.opset() >= 18 && context.node().hasAttribute("num_outputs") && num_outputs < 1) {
    context.fail("num_outputs must be positive, found {}", num_outputs);
  }
  splitInto(context, given ? context.constantInts(1) : std::nullopt, given, num_outputs);
}

// ------------------------------------------------------------------ Slice

// The length of dim[start:end:step] for a known size, by numpy's clamping.
int64_t sliceLength(int64_t size, int64_t start, int64_t end, int64_t step) {
  if (size == 0) return 0;
  if (start < 0) start += size;
  if (end < 0) end += size;
  if (step > 0) {
    start = std::clamp<int64_t>(start, 0, size);
    end = std::clamp<int64_t>(end, 0, size);
    return end > start ? (end - start - 1) / step + 1 : 0;  // ceil((end - start) / step), never overflowing
  }
  start = std::clamp<int64_t>(start, 0, size - 1);
  end = std::clamp<int64_t>(end, -1, size - 1);
  return start > end ? 1 - (start - end - 1) / step : 0;  // step < 0, INT64_MIN included
}

// True for x[0:INT_MAX] and x[::-1] (x[-1:INT_MIN:-1]): slices that keep an
// axis of unknown size whole, its symbol too.
bool isWholeAxis(int64_t start, int64_t end, int64_t step) {
  constexpr int64_t kLarge = std::numeric_limits<int32_t>::max();
  if (step == 1) return start == 0 && end >= kLarge;
  if (step == -1) return (start == -1 || start >= kLarge) && end <= -kLarge;
  return false;
}

// Each argument is nullopt when given but not constant; `axes` and `steps`
// hold their defaults when not given.
struct SliceArgs {
  std::optional<Ints> starts, ends, axes, steps;
  bool axes_given = false;
  bool steps_given = false;
};

void sliceWith(InferenceContext& context, SliceArgs args) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) return setUnknownShape(context, dtype);
  std::vector<Dim> out = *in;
  const bool bounds_known = args.starts && args.ends && (!args.steps_given || args.steps);
  if (!args.axes_given && args.starts) {
    args.axes = Ints(args.starts->size());
    std::iota(args.axes->begin(), args.axes->end(), 0);
  }
  if (!bounds_known || !args.axes) {
    // Which axes are sliced, or by how much, is unknown: those sizes are too.
    if (!args.axes) {
      context.output(0) = ValueType{dtype, std::vector<Dim>(in->size())};
      return;
    }
    for (size_t axis : normalizeAxes(context, *args.axes, in->size())) out[axis] = Dim{};
    context.output(0) = ValueType{dtype, out};
    return;
  }
  const size_t count = args.starts->size();
  if (!args.steps_given) args.steps = Ints(count, 1);
  if (args.ends->size() != count || args.axes->size() != count || args.steps->size() != count) {
    context.fail("starts, ends, axes and steps must have one value each per sliced axis, found {}, {}, {} and {}",
                 count, args.ends->size(), args.axes->size(), args.steps->size());
  }
  const std::vector<size_t> axes = normalizeAxes(context, *args.axes, in->size());
  for (size_t i = 0; i < count; ++i) {
    const int64_t start = (*args.starts)[i], end = (*args.ends)[i], step = (*args.steps)[i];
    if (step == 0) context.fail("steps[{}] (for axis {}) is 0", i, axes[i]);
    const Dim& dim = (*in)[axes[i]];
    if (dim.isKnown()) {
      out[axes[i]] = Dim::known(sliceLength(dim.size, start, end, step));
    } else if (!isWholeAxis(start, end, step)) {
      out[axes[i]] = Dim{};
    }
  }
  context.output(0) = ValueType{dtype, out};
}

void sliceV1(InferenceContext& context) {
  const Node& node = context.node();
  if (!node.hasAttribute("starts") || !node.hasAttribute("ends")) {
    context.fail("needs the 'starts' and 'ends' attributes");
  }
  SliceArgs args;
  args.starts = node.intsAttribute("starts", {});
  args.ends = node.intsAttribute("ends", {});
  args.axes_given = node.hasAttribute("axes");
  if (args.axes_given) args.axes = node.intsAttribute("axes", {});
  sliceWith(context, args);
}

void sliceV10(InferenceContext& context) {
  for (size_t i = 1; i < 5; ++i) {
    if (context.hasInput(i)) require1D(context, i, i == 1 ? "starts" : i == 2 ? "ends" : i == 3 ? "axes" : "steps");
  }
  SliceArgs args;
  args.starts = context.constantInts(1);
  args.ends = context.constantInts(2);
  args.axes_given = context.hasInput(3);
  if (args.axes_given) args.axes = context.constantInts(3);
  args.steps_given = context.hasInput(4);
  if (args.steps_given) args.steps = context.constantInts(4);
  sliceWith(context, args);
}

// ---------------------------------------------------------------- Gathers

void requireIndices(const InferenceContext& context, size_t index) {
  const DType dtype = context.inputType(index).dtype;
  if (!isIndexType(dtype)) {
    context.fail("the indices (input {}) must be int32 or int64, found {}", index, dtypeName(dtype));
  }
}

void gather(InferenceContext& context) {
  requireIndices(context, 1);
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* data = knownShape(context, 0);
  const std::vector<Dim>* indices = knownShape(context, 1);
  if (!data) return setUnknownShape(context, dtype);
  const size_t axis = normalizeAxis(context, context.node().intAttribute("axis", 0), data->size());
  if (!indices) return setUnknownShape(context, dtype);
  std::vector<Dim> out(data->begin(), data->begin() + axis);
  out.insert(out.end(), indices->begin(), indices->end());
  out.insert(out.end(), data->begin() + axis + 1, data->end());
  context.output(0) = ValueType{dtype, out};
}

void gatherElements(InferenceContext& context) {
  requireIndices(context, 1);
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* data = knownShape(context, 0);
  const std::vector<Dim>* indices = knownShape(context, 1);
  if (data) normalizeAxis(context, context.node().intAttribute("axis", 0), data->size());
  if (data && indices && data->size() != indices->size()) {
    context.fail("the data {} and the indices {} must have the same rank", dimsText(*data), dimsText(*indices));
  }
  context.output(0) = ValueType{dtype, context.inputType(1).shape};
}

void gatherNd(InferenceContext& context) {
  requireIndices(context, 1);
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* data = knownShape(context, 0);
  const std::vector<Dim>* indices = knownShape(context, 1);
  const int64_t batch_dims = context.node().intAttribute("batch_dims", 0);
  if (batch_dims < 0) context.fail("batch_dims must not be negative, found {}", batch_dims);
  const auto batch = static_cast<size_t>(batch_dims);
  if (data && batch >= data->size()) {
    context.fail("batch_dims {} must be less than the data's rank {}", batch, data->size());
  }
  if (indices && (indices->empty() || batch >= indices->size())) {
    context.fail("batch_dims {} must be less than the rank of the indices {}", batch, dimsText(*indices));
  }
  if (!data || !indices || !indices->back().isKnown()) return setUnknownShape(context, dtype);
  const auto depth = static_cast<size_t>(indices->back().size);  // index tuple length
  if (depth < 1 || batch + depth > data->size()) {
    context.fail("the indices {} address {} dimensions, but the data {} has {} after the {} batch dimensions",
                 dimsText(*indices), depth, dimsText(*data), data->size() - batch, batch);
  }
  std::vector<Dim> out(indices->begin(), indices->end() - 1);
  out.insert(out.end(), data->begin() + batch + depth, data->end());
  context.output(0) = ValueType{dtype, out};
}

void scatterElements(InferenceContext& context) {
  requireIndices(context, 1);
  const std::vector<Dim>* data = knownShape(context, 0);
  if (data) normalizeAxis(context, context.node().intAttribute("axis", 0), data->size());
  for (size_t i : {1u, 2u}) {
    const std::vector<Dim>* shape = knownShape(context, i);
    if (data && shape && shape->size() != data->size()) {
      context.fail("input {} {} must have the rank of the data {}", i, dimsText(*shape), dimsText(*data));
    }
  }
  copyInputType(context);
}

void scatterNd(InferenceContext& context) {
  if (context.inputType(1).dtype != DType::kI64) {
    context.fail("the indices must be int64, found {}", dtypeName(context.inputType(1).dtype));
  }
  const std::vector<Dim>* data = knownShape(context, 0);
  const std::vector<Dim>* indices = knownShape(context, 1);
  if (data && indices && !indices->empty() && indices->back().isKnown() &&
      static_cast<size_t>(indices->back().size) > data->size()) {
    context.fail("the indices {} address {} dimensions but the data {} has rank {}", dimsText(*indices),
                 indices->back().size, dimsText(*data), data->size());
  }
  copyInputType(context);
}

// ------------------------------------------------ Expand, Tile, Pad, shape

void expand(InferenceContext& context) {
  require1D(context, 1, "the shape");
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  std::optional<std::vector<Dim>> target;
  if (const auto values = context.constantInts(1)) {
    target.emplace();
    for (int64_t size : *values) {
      if (size < 0) context.fail("the shape [{}] has the negative size {}", fmt::join(*values, ", "), size);
      target->push_back(Dim::known(size));
    }
  } else if (const auto rank = knownLength(context, 1)) {
    target = std::vector<Dim>(*rank);  // unknown sizes still broadcast against the input's
  }
  if (!in || !target) return setUnknownShape(context, dtype);
  context.output(0) = ValueType{dtype, broadcastShapes(context, *in, *target)};
}

void tile(InferenceContext& context) {
  require1D(context, 1, "repeats");
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) return setUnknownShape(context, dtype);
  const auto repeats = context.constantInts(1);
  if (!repeats) {
    context.output(0) = ValueType{dtype, std::vector<Dim>(in->size())};
    return;
  }
  if (repeats->size() != in->size()) {
    context.fail("repeats has {} values but the input {} has rank {}", repeats->size(), dimsText(*in), in->size());
  }
  std::vector<Dim> out = *in;
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t times = (*repeats)[i];
    if (times < 0) context.fail("repeats [{}] has the negative value {}", fmt::join(*repeats, ", "), times);
    if (out[i].isKnown() || times == 0) {
      out[i] = Dim::known(out[i].isKnown() ? multiplyDims(context, out[i].size, times) : 0);
    } else if (times != 1) {
      out[i] = Dim{};
    }
  }
  context.output(0) = ValueType{dtype, out};
}

// `pads`: nullopt when not constant; `axes`: the padded axes, nullopt when
// they are given but not constant.
void padWith(InferenceContext& context, const std::optional<Ints>& pads, std::optional<Ints> axes) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) return setUnknownShape(context, dtype);
  if (!axes) {
    context.output(0) = ValueType{dtype, std::vector<Dim>(in->size())};
    return;
  }
  const std::vector<size_t> padded = normalizeAxes(context, *axes, in->size());
  std::vector<Dim> out = *in;
  if (!pads) {
    for (size_t axis : padded) out[axis] = Dim{};
    context.output(0) = ValueType{dtype, out};
    return;
  }
  if (pads->size() != 2 * padded.size()) {
    context.fail("pads has {} values; {} expected (a begin and an end for each of {} axes)", pads->size(),
                 2 * padded.size(), padded.size());
  }
  for (size_t i = 0; i < padded.size(); ++i) {
    const int64_t extra = addDims(context, (*pads)[i], (*pads)[i + padded.size()]);
    Dim& dim = out[padded[i]];
    if (dim.isKnown()) {
      if (addDims(context, dim.size, extra) < 0) {
        context.fail("pads [{}] remove more than the {} elements of axis {}", fmt::join(*pads, ", "), dim.size,
                     padded[i]);
      }
      dim.size += extra;
    } else if (extra != 0) {
      dim = Dim{};
    }
  }
  context.output(0) = ValueType{dtype, out};
}

Ints allAxes(const InferenceContext& context) {
  const std::vector<Dim>* in = knownShape(context, 0);
  Ints axes(in ? in->size() : 0);
  std::iota(axes.begin(), axes.end(), 0);
  return axes;
}

void padV2(InferenceContext& context) {
  if (!context.node().hasAttribute("pads")) context.fail("needs the 'pads' attribute");
  padWith(context, context.node().intsAttribute("pads", {}), allAxes(context));
}

void padV11(InferenceContext& context) {
  require1D(context, 1, "pads");
  std::optional<Ints> axes = allAxes(context);
  if (context.opset() >= 18 && context.hasInput(3)) {
    require1D(context, 3, "axes");
    axes = context.constantInts(3);
  }
  padWith(context, context.constantInts(1), axes);
}

void shape(InferenceContext& context) {
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) {
    context.output(0) = ValueType{DType::kI64, std::vector<Dim>(1)};
    return;
  }
  const auto rank = static_cast<int64_t>(in->size());
  // Opset 15: start and end select a range of the dims, clamped like Slice.
  auto clampToRank = [rank](int64_t index) { return std::clamp<int64_t>(index < 0 ? index + rank : index, 0, rank); };
  const int64_t start = clampToRank(context.node().intAttribute("start", 0));
  const int64_t end = clampToRank(context.node().intAttribute("end", rank));
  context.output(0) = ValueType{DType::kI64, std::vector<Dim>{Dim::known(std::max<int64_t>(end - start, 0))}};
}

void size(InferenceContext& context) { context.output(0) = ValueType{DType::kI64, std::vector<Dim>{}}; }

void constantOfShape(InferenceContext& context) {
  require1D(context, 0, "the shape");
  DType dtype = DType::kF32;
  if (context.node().hasAttribute("value")) {
    const auto* value = std::get_if<ConstantPtr>(&context.node().attributes.at("value"));
    if (!value || !*value) context.fail("attribute 'value' must be a tensor");
    if ((*value)->info.numElements() != 1) {
      context.fail("attribute 'value' must hold one element, found {}", (*value)->info.shapeString());
    }
    dtype = (*value)->info.dtype;
  }
  if (const auto values = context.constantInts(0)) {
    std::vector<Dim> out;
    for (int64_t size : *values) {
      if (size < 0) context.fail("the shape [{}] has the negative size {}", fmt::join(*values, ", "), size);
      out.push_back(Dim::known(size));
    }
    context.output(0) = ValueType{dtype, out};
  } else if (const auto rank = knownLength(context, 0)) {
    context.output(0) = ValueType{dtype, std::vector<Dim>(*rank)};
  } else {
    setUnknownShape(context, dtype);
  }
}

void constant(InferenceContext& context) {
  const Attributes& attributes = context.node().attributes;
  if (attributes.size() != 1) {
    context.fail("needs exactly one of value, value_float, value_floats, value_int, value_ints; found {} attributes",
                 attributes.size());
  }
  const auto& [name, attribute] = *attributes.begin();
  auto vector = [](DType dtype, size_t length) {
    return ValueType{dtype, std::vector<Dim>{Dim::known(static_cast<int64_t>(length))}};
  };
  if (const auto* tensor = std::get_if<ConstantPtr>(&attribute); tensor && *tensor && name == "value") {
    context.output(0) = ValueType::tensor((*tensor)->info.dtype, (*tensor)->info.shape);
  } else if (std::holds_alternative<float>(attribute) && name == "value_float") {
    context.output(0) = ValueType{DType::kF32, std::vector<Dim>{}};
  } else if (std::holds_alternative<int64_t>(attribute) && name == "value_int") {
    context.output(0) = ValueType{DType::kI64, std::vector<Dim>{}};
  } else if (const auto* floats = std::get_if<std::vector<float>>(&attribute); floats && name == "value_floats") {
    context.output(0) = vector(DType::kF32, floats->size());
  } else if (const auto* ints = std::get_if<Ints>(&attribute); ints && name == "value_ints") {
    context.output(0) = vector(DType::kI64, ints->size());
  } else {
    context.fail("attribute '{}' is not a constant kiln supports (value, value_float(s), value_int(s))", name);
  }
}

// ---------------------------------------------------------- Resize, Upsample

// Each of `scales` and `sizes` is nullopt when not given or not constant.
struct ResizeArgs {
  std::optional<std::vector<double>> scales;
  std::optional<Ints> sizes;
  bool scales_given = false;
  bool sizes_given = false;
};

void resizeSizes(InferenceContext& context, const std::vector<size_t>& axes, const Ints& sizes, std::vector<Dim>& out) {
  for (int64_t size : sizes) {
    if (size < 0) context.fail("sizes [{}] has the negative size {}", fmt::join(sizes, ", "), size);
  }
  const std::string policy = context.node().stringAttribute("keep_aspect_ratio_policy", "stretch");
  if (policy == "stretch") {
    for (size_t i = 0; i < axes.size(); ++i) out[axes[i]] = Dim::known(sizes[i]);
    return;
  }
  if (policy != "not_larger" && policy != "not_smaller") {
    context.fail("keep_aspect_ratio_policy is '{}', not stretch, not_larger or not_smaller", policy);
  }
  // One scale for all the axes: the largest that fits in `sizes`
  // (not_larger) or the smallest that covers them (not_smaller).
  std::optional<double> scale;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (!out[axes[i]].isKnown()) {
      for (size_t axis : axes) out[axis] = Dim{};
      return;
    }
    const double ratio = static_cast<double>(sizes[i]) / static_cast<double>(out[axes[i]].size);
    scale = !scale ? ratio : policy == "not_larger" ? std::min(*scale, ratio) : std::max(*scale, ratio);
  }
  for (size_t axis : axes) {
    out[axis] = Dim::known(dimFromFloat(context, std::floor(*scale * static_cast<double>(out[axis].size) + 0.5)));
  }
}

void resizeScales(InferenceContext& context, const std::vector<size_t>& axes, const std::vector<double>& scales,
                  std::vector<Dim>& out) {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (!(scales[i] > 0)) context.fail("scales [{}] has the non-positive scale {}", fmt::join(scales, ", "), scales[i]);
    Dim& dim = out[axes[i]];
    if (dim.isKnown()) {
      // As ONNX does: the float product, rounded down.
      dim = Dim::known(dimFromFloat(context, std::floor(static_cast<float>(dim.size) * static_cast<float>(scales[i]))));
    } else if (scales[i] != 1.0) {
      dim = Dim{};
    }
  }
}

void resizeWith(InferenceContext& context, const ResizeArgs& args) {
  const DType dtype = context.inputType(0).dtype;
  if (!args.scales_given && !args.sizes_given) context.fail("needs either scales or sizes");
  if (args.scales && args.sizes) context.fail("takes either scales or sizes, not both");
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) return setUnknownShape(context, dtype);
  Ints axes_attribute = allAxes(context);
  if (context.opset() >= 18 && context.node().hasAttribute("axes")) {
    axes_attribute = context.node().intsAttribute("axes", {});
  }
  const std::vector<size_t> axes = normalizeAxes(context, axes_attribute, in->size());
  const size_t count = args.sizes ? args.sizes->size() : args.scales ? args.scales->size() : axes.size();
  if (count != axes.size()) {
    context.fail("{} has {} values for the {} resized axes of {}", args.sizes ? "sizes" : "scales", count, axes.size(),
                 dimsText(*in));
  }
  std::vector<Dim> out = *in;
  if (args.sizes) {
    resizeSizes(context, axes, *args.sizes, out);
  } else if (args.scales) {
    resizeScales(context, axes, *args.scales, out);
  } else {
    for (size_t axis : axes) out[axis] = Dim{};  // computed scales or sizes
  }
  context.output(0) = ValueType{dtype, out};
}

// The float values of constant input `index`; ints are refused.
std::optional<std::vector<double>> constantScales(const InferenceContext& context, size_t index) {
  const ConstantPtr constant = context.inputConstant(index);
  if (constant && constant->info.dtype != DType::kF32 && constant->info.dtype != DType::kF64) {
    context.fail("scales (input {}) must be float, found {}", index, dtypeName(constant->info.dtype));
  }
  return constantNumbers(context, index);
}

void upsampleV7(InferenceContext& context) {
  if (!context.node().hasAttribute("scales")) context.fail("needs the 'scales' attribute");
  const auto* scales = std::get_if<std::vector<float>>(&context.node().attributes.at("scales"));
  if (!scales) context.fail("attribute 'scales' must be a list of floats");
  ResizeArgs args;
  args.scales_given = true;
  args.scales = std::vector<double>(scales->begin(), scales->end());
  resizeWith(context, args);
}

// Resize 10 and Upsample 9: (X, scales).
void resizeV10(InferenceContext& context) {
  ResizeArgs args;
  args.scales_given = true;
  args.scales = constantScales(context, 1);
  resizeWith(context, args);
}

// Resize 11: (X, roi, scales, sizes), the empty tensor standing for "none".
void resizeV11(InferenceContext& context) {
  ResizeArgs args;
  args.scales_given = hasNonEmptyInput(context, 2);
  args.sizes_given = hasNonEmptyInput(context, 3);
  if (args.scales_given) args.scales = constantScales(context, 2);
  if (args.sizes_given) args.sizes = context.constantInts(3);
  // A computed scales input next to sizes is the empty one of opsets 11-12.
  if (args.sizes_given && args.scales_given && !args.scales) args.scales_given = false;
  resizeWith(context, args);
}

// ------------------------------------------------------------ Range, misc

void range(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  for (size_t i = 0; i < 3; ++i) {
    if (context.inputType(i).dtype != dtype) {
      context.fail("start, limit and delta must have one type; input {} is {} but start is {}", i,
                   dtypeName(context.inputType(i).dtype), dtypeName(dtype));
    }
    const std::vector<Dim>* shape = knownShape(context, i);
    if (shape && surelyNotCount(context, *shape, 1)) {
      context.fail("input {} must be a scalar, found {}", i, dimsText(*shape));
    }
  }
  Dim length;
  if (isIndexType(dtype)) {
    const auto start = context.constantInts(0), limit = context.constantInts(1), delta = context.constantInts(2);
    if (delta && delta->front() == 0) context.fail("delta is 0");
    if (start && limit && delta) {
      // ceil((limit - start) / delta), at least 0; the operands are any
      // int64 values (a wrapped span, or INT64_MIN / -1, trapped).
      const std::optional<int64_t> span = checkedSubtract(limit->front(), start->front());
      const int64_t step = delta->front();
      if (!span || (*span == INT64_MIN && step == -1)) {
        context.fail("the range from {} to {} by {} is too long", start->front(), limit->front(), step);
      }
      const int64_t count = *span / step + (*span % step != 0 && (*span < 0) == (step < 0) ? 1 : 0);
      length = Dim::known(std::max<int64_t>(count, 0));
    }
  } else if (dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kF16 || dtype == DType::kBF16) {
    const auto start = constantNumbers(context, 0), limit = constantNumbers(context, 1),
               delta = constantNumbers(context, 2);
    if (delta && delta->front() == 0) context.fail("delta is 0");
    if (start && limit && delta) {
      const double count = std::ceil((limit->front() - start->front()) / delta->front());
      length = Dim::known(std::max<int64_t>(dimFromFloat(context, std::max(count, -1.0)), 0));
    }
  }
  context.output(0) = ValueType{dtype, std::vector<Dim>{length}};
}

int64_t blockSize(const InferenceContext& context) {
  const int64_t block = context.node().intAttribute("blocksize", 0);
  if (block <= 0) context.fail("needs a positive 'blocksize' attribute, found {}", block);
  return block;
}

// Rearranges channels into space (DepthToSpace) or back (SpaceToDepth).
void depthSpace(InferenceContext& context, bool to_space) {
  const DType dtype = context.inputType(0).dtype;
  const int64_t block = blockSize(context);
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) {
    context.output(0) = ValueType{dtype, std::vector<Dim>(4)};
    return;
  }
  if (in->size() != 4) context.fail("needs a 4-D input [N, C, H, W], found {}", dimsText(*in));
  std::vector<Dim> out = *in;
  // The shrinking dims must divide by the block: C by block^2, or H and W.
  auto shrink = [&](size_t axis, int64_t factor) {
    Dim& dim = out[axis];
    if (!dim.isKnown()) return;
    if (dim.size % factor != 0) {
      context.fail("dimension {} of {} ({}) does not divide by {}", axis, dimsText(*in), dim.size, factor);
    }
    dim.size /= factor;
  };
  auto grow = [&](size_t axis, int64_t factor) {
    Dim& dim = out[axis];
    dim = dim.isKnown() ? Dim::known(multiplyDims(context, dim.size, factor)) : Dim{};
  };
  if (to_space) {
    shrink(1, multiplyDims(context, block, block));
    grow(2, block);
    grow(3, block);
  } else {
    shrink(2, block);
    shrink(3, block);
    grow(1, multiplyDims(context, block, block));
  }
  context.output(0) = ValueType{dtype, out};
}

// `k`: nullopt when not constant.
void topKWith(InferenceContext& context, std::optional<int64_t> k) {
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (k && *k < 0) context.fail("k must not be negative, found {}", *k);
  if (!in) {
    setUnknownShape(context, dtype, 0);
    setUnknownShape(context, DType::kI64, 1);
    return;
  }
  const size_t axis = normalizeAxis(context, context.node().intAttribute("axis", -1), in->size());
  const Dim& dim = (*in)[axis];
  if (k && dim.isKnown() && *k > dim.size) {
    context.fail("k {} is larger than axis {} of {} (size {})", *k, axis, dimsText(*in), dim.size);
  }
  std::vector<Dim> out = *in;
  out[axis] = k ? Dim::known(*k) : Dim{};
  context.output(0) = ValueType{dtype, out};
  context.output(1) = ValueType{DType::kI64, out};
}

void topKV1(InferenceContext& context) {
  if (!context.node().hasAttribute("k")) context.fail("needs the 'k' attribute");
  topKWith(context, context.node().intAttribute("k", 0));
}

void topKV10(InferenceContext& context) {
  const std::vector<Dim>* k_shape = knownShape(context, 1);
  if (k_shape && (k_shape->size() != 1 || surelyNotCount(context, *k_shape, 1))) {
    context.fail("k must be a 1-D tensor of one element, found {}", dimsText(*k_shape));
  }
  const auto k = context.constantInts(1);
  topKWith(context, k ? std::optional<int64_t>(k->front()) : std::nullopt);
}

void trilu(InferenceContext& context) {
  const std::vector<Dim>* in = knownShape(context, 0);
  if (in && in->size() < 2) context.fail("needs an input of rank 2 or more, found {}", dimsText(*in));
  copyInputType(context);
}

void cumSum(InferenceContext& context) {
  const std::vector<Dim>* in = knownShape(context, 0);
  const auto axis = context.constantInts(1);
  if (axis && axis->size() != 1) context.fail("axis must hold one value, found {}", axis->size());
  if (in && axis) normalizeAxis(context, axis->front(), in->size());
  copyInputType(context);
}

void oneHot(InferenceContext& context) {
  const DType dtype = context.inputType(2).dtype;
  const std::vector<Dim>* values = knownShape(context, 2);
  if (values && (values->size() != 1 || surelyNotCount(context, *values, 2))) {
    context.fail("values must be [off, on], a 1-D tensor of 2 elements, found {}", dimsText(*values));
  }
  const std::vector<Dim>* indices = knownShape(context, 0);
  if (!indices) return setUnknownShape(context, dtype);
  const size_t axis = normalizeAxis(context, context.node().intAttribute("axis", -1), indices->size() + 1);
  Dim depth;  // any numeric type; a float depth is truncated
  if (const auto numbers = constantNumbers(context, 1); numbers && numbers->size() == 1) {
    if (!(numbers->front() >= 1)) context.fail("depth must be positive, found {}", numbers->front());
    const int64_t value = dimFromFloat(context, numbers->front());
    depth = Dim::known(value);
  }
  std::vector<Dim> out = *indices;
  out.insert(out.begin() + static_cast<std::ptrdiff_t>(axis), depth);
  context.output(0) = ValueType{dtype, out};
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer, size_t min_outputs = 1, size_t max_outputs = 1) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, min_outputs, max_outputs, std::move(infer)});
}

}  // namespace

void registerShapeOps(OpRegistry& registry) {
  add(registry, "Reshape", 1, 1, 1, reshapeV1);
  add(registry, "Reshape", 5, 2, 2, reshape);  // the shape becomes an input; allowzero from 14
  add(registry, "Flatten", 1, 1, 1, flatten);
  add(registry, "Squeeze", 1, 1, 1, squeezeV1);
  add(registry, "Squeeze", 13, 1, 2, squeezeV13);  // axes become an input
  add(registry, "Unsqueeze", 1, 1, 1, unsqueezeV1);
  add(registry, "Unsqueeze", 13, 2, 2, unsqueezeV13);
  add(registry, "Transpose", 1, 1, 1, transpose);
  add(registry, "Concat", 1, 1, kAnyNumber, concat);
  add(registry, "Split", 1, 1, 1, splitV1, 1, kAnyNumber);
  add(registry, "Split", 13, 1, 2, splitV13, 1, kAnyNumber);  // split becomes an input; num_outputs from 18
  add(registry, "Slice", 1, 1, 1, sliceV1);
  add(registry, "Slice", 10, 3, 5, sliceV10);  // starts, ends, axes, steps become inputs
  add(registry, "Gather", 1, 2, 2, gather);
  add(registry, "GatherElements", 11, 2, 2, gatherElements);
  add(registry, "GatherND", 11, 2, 2, gatherNd);  // batch_dims from 12
  add(registry, "Scatter", 9, 3, 3, scatterElements);
  add(registry, "ScatterElements", 11, 3, 3, scatterElements);
  add(registry, "ScatterND", 11, 3, 3, scatterNd);
  add(registry, "Expand", 8, 2, 2, expand);
  add(registry, "Tile", 6, 2, 2, tile);
  add(registry, "Pad", 2, 1, 1, padV2);
  add(registry, "Pad", 11, 2, 3, padV11);  // pads and constant_value become inputs
  add(registry, "Pad", 18, 2, 4, padV11);  // axes
  add(registry, "Shape", 1, 1, 1, shape);  // start and end from 15
  add(registry, "Size", 1, 1, 1, size);
  add(registry, "ConstantOfShape", 9, 1, 1, constantOfShape);
  add(registry, "Constant", 1, 0, 0, constant);
  add(registry, "Upsample", 7, 1, 1, upsampleV7);
  add(registry, "Upsample", 9, 2, 2, resizeV10);  // scales become an input
  add(registry, "Resize", 10, 2, 2, resizeV10);
  add(registry, "Resize", 11, 1, 4, resizeV11);  // roi, scales, sizes; axes and aspect-ratio policy from 18
  add(registry, "Range", 11, 3, 3, range);
  add(registry, "DepthToSpace", 1, 1, 1, [](InferenceContext& c) { depthSpace(c, true); });
  add(registry, "SpaceToDepth", 1, 1, 1, [](InferenceContext& c) { depthSpace(c, false); });
  add(registry, "TopK", 1, 1, 1, topKV1, 2, 2);
  add(registry, "TopK", 10, 2, 2, topKV10, 2, 2);  // k becomes an input
  add(registry, "Trilu", 14, 1, 2, trilu);
  add(registry, "CumSum", 11, 2, 2, cumSum);
  add(registry, "OneHot", 9, 3, 3, oneHot);
}

}  // namespace kiln
