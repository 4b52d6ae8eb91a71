// Indexing, scatter and linear-algebra operators that shape_ops.cc does not
// hold: TensorScatter, EyeLike, ReverseSequence, CumProd, CenterCropPad,
// Col2Im, MaxUnpool, BitCast, Einsum and Det.
//
// As in shape_ops.cc, an input that gives sizes (CenterCropPad's shape,
// Col2Im's image and block shapes, MaxUnpool's output_shape) counts only
// when it is an initializer; otherwise the sizes it decides stay unknown.
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include "ops/op_families.h"
#include "ops/shape_helpers.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;

void setUnknownShape(InferenceContext& context, DType dtype, size_t output = 0) {
  context.output(output) = ValueType{dtype, std::nullopt};
}

void requireIndexType(const InferenceContext& context, size_t index, const char* what) {
  const DType dtype = context.inputType(index).dtype;
  if (dtype != DType::kI32 && dtype != DType::kI64) {
    context.fail("{} (input {}) must be int32 or int64, found {}", what, index, dtypeName(dtype));
  }
}

// ------------------------------------------------------------ TensorScatter

void tensorScatter(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  if (context.inputType(1).dtype != dtype) {
    context.fail("the update is {} but the cache is {}: they must match", dtypeName(context.inputType(1).dtype),
                 dtypeName(dtype));
  }
  if (context.hasInput(2) && context.inputType(2).dtype != DType::kI64) {
    context.fail("write_indices must be int64, found {}", dtypeName(context.inputType(2).dtype));
  }
  const std::string mode = context.node().stringAttribute("mode", "linear");
  if (mode != "linear" && mode != "circular") context.fail("mode is '{}', not linear or circular", mode);
  const std::vector<Dim>* cache = knownShape(context, 0);
  const std::vector<Dim>* update = knownShape(context, 1);
  if (cache && update) {
    if (cache->size() != update->size() || cache->size() < 2) {
      context.fail("the cache {} and the update {} must have one rank, 2 or more", dimsText(*cache),
                   dimsText(*update));
    }
    const size_t axis = normalizeAxis(context, context.node().intAttribute("axis", -2), cache->size());
    if (axis == 0) context.fail("axis must not be the batch axis 0");
    for (size_t d = 0; d < cache->size(); ++d) {
      const Dim &c = (*cache)[d], &u = (*update)[d];
      if (!c.isKnown() || !u.isKnown()) continue;
      if (d == axis ? u.size > c.size : u.size != c.size) {
        context.fail("the update {} does not fit the cache {} (they may differ only along axis {}, where the "
                     "update may be shorter)",
                     dimsText(*update), dimsText(*cache), axis);
      }
    }
  }
  copyInputType(context);
}

// ----------------------------------------------------------------- EyeLike

void eyeLike(InferenceContext& context) {
  const std::vector<Dim>* in = knownShape(context, 0);
  if (in && in->size() != 2) context.fail("needs a 2-D input, found {}", dimsText(*in));
  DType dtype = context.inputType(0).dtype;
  if (context.node().hasAttribute("dtype")) {
    const int64_t code = context.node().intAttribute("dtype", 0);
    if (code < 0 || code > 255 || !isValidDType(static_cast<uint8_t>(code))) {
      context.fail("dtype {} is not an element type kiln knows", code);
    }
    dtype = static_cast<DType>(code);
  }
  context.output(0) = ValueType{dtype, context.inputType(0).shape};
}

// --------------------------------------------------------- ReverseSequence

void reverseSequence(InferenceContext& context) {
  requireIndexType(context, 1, "sequence_lens");
  const std::vector<Dim>* in = knownShape(context, 0);
  if (in) {
    if (in->size() < 2) context.fail("needs an input of rank 2 or more, found {}", dimsText(*in));
    const int64_t batch_axis = context.node().intAttribute("batch_axis", 1);
    const int64_t time_axis = context.node().intAttribute("time_axis", 0);
    if ((batch_axis != 0 && batch_axis != 1) || (time_axis != 0 && time_axis != 1) || batch_axis == time_axis) {
      context.fail("batch_axis {} and time_axis {} must be 0 and 1, one each", batch_axis, time_axis);
    }
    const std::vector<Dim>* lens = knownShape(context, 1);
    const Dim& batch = (*in)[static_cast<size_t>(batch_axis)];
    if (lens && (lens->size() != 1 || ((*lens)[0].isKnown() && batch.isKnown() && (*lens)[0].size != batch.size))) {
      context.fail("sequence_lens {} must be 1-D with one length per batch entry ({})", dimsText(*lens),
                   dimsText(*in));
    }
  }
  copyInputType(context);
}

// ------------------------------------------------------------------ CumProd

void cumulative(InferenceContext& context) {
  const std::vector<Dim>* in = knownShape(context, 0);
  const auto axis = context.constantInts(1);
  if (axis && axis->size() != 1) context.fail("axis must hold one value, found {}", axis->size());
  if (in && axis) normalizeAxis(context, axis->front(), in->size());
  copyInputType(context);
}

// ------------------------------------------------------------ CenterCropPad

void centerCropPad(InferenceContext& context) {
  requireIndexType(context, 1, "the shape");
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) return setUnknownShape(context, dtype);
  Ints axes_attribute = context.node().intsAttribute("axes", {});
  if (!context.node().hasAttribute("axes")) {
    axes_attribute.resize(in->size());
    for (size_t i = 0; i < in->size(); ++i) axes_attribute[i] = static_cast<int64_t>(i);
  }
  const std::vector<size_t> axes = normalizeAxes(context, axes_attribute, in->size());
  std::vector<Dim> out = *in;
  const auto sizes = context.constantInts(1);
  if (sizes && sizes->size() != axes.size()) {
    context.fail("the shape [{}] has {} sizes for {} axes", fmt::join(*sizes, ", "), sizes->size(), axes.size());
  }
  for (size_t i = 0; i < axes.size(); ++i) {
    if (!sizes) {
      out[axes[i]] = Dim{};
      continue;
    }
    if ((*sizes)[i] < 0) context.fail("the shape [{}] has a negative size", fmt::join(*sizes, ", "));
    out[axes[i]] = Dim::known((*sizes)[i]);
  }
  context.output(0) = ValueType{dtype, out};
}

// ------------------------------------------------------------------- Col2Im

void col2Im(InferenceContext& context) {
  requireIndexType(context, 1, "image_shape");
  requireIndexType(context, 2, "block_shape");
  const DType dtype = context.inputType(0).dtype;
  const std::vector<Dim>* in = knownShape(context, 0);
  if (in && in->size() != 3) context.fail("needs a 3-D input [N, C * prod(block_shape), L], found {}", dimsText(*in));
  const auto image = context.constantInts(1);
  const auto block = context.constantInts(2);
  if (image && block && image->size() != block->size()) {
    context.fail("image_shape [{}] and block_shape [{}] must have one length", fmt::join(*image, ", "),
                 fmt::join(*block, ", "));
  }
  const std::vector<Dim>* image_shape = knownShape(context, 1);
  std::optional<size_t> spatial;
  if (image) spatial = image->size();
  if (!spatial && image_shape && image_shape->size() == 1 && (*image_shape)[0].isKnown()) {
    spatial = static_cast<size_t>((*image_shape)[0].size);
  }
  if (!in || !spatial) return setUnknownShape(context, dtype);
  if (*spatial + 2 > kMaxRank) context.fail("{} spatial dimensions: more than kiln's rank limit of {}", *spatial, kMaxRank);
  std::vector<Dim> out{(*in)[0], Dim{}};
  if (block) {
    int64_t block_size = 1;
    for (int64_t b : *block) {
      if (b < 1) context.fail("block_shape [{}] must be positive", fmt::join(*block, ", "));
      const std::optional<int64_t> product = multiplySizes(block_size, b);  // [2^32, 2^32] wrapped to 0
      if (!product) context.fail("block_shape [{}] holds more than 2^63 elements", fmt::join(*block, ", "));
      block_size = *product;
    }
    const Dim& columns = (*in)[1];
    if (columns.isKnown()) {
      if (columns.size % block_size != 0) {
        context.fail("dimension 1 of {} does not divide by the block size {}", dimsText(*in), block_size);
      }
      out[1] = Dim::known(columns.size / block_size);
    }
  }
  for (size_t i = 0; i < *spatial; ++i) {
    if (image && (*image)[i] < 0) context.fail("image_shape [{}] must not be negative", fmt::join(*image, ", "));
    out.push_back(image ? Dim::known((*image)[i]) : Dim{});
  }
  context.output(0) = ValueType{dtype, out};
}

// ---------------------------------------------------------------- MaxUnpool

void maxUnpool(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  if (context.inputType(1).dtype != DType::kI64) {
    context.fail("the indices (input 1) must be int64, found {}", dtypeName(context.inputType(1).dtype));
  }
  const std::vector<Dim>* x = knownShape(context, 0);
  if (context.hasInput(2)) {
    if (const auto shape = context.constantInts(2)) {
      std::vector<Dim> out;
      for (int64_t size : *shape) out.push_back(Dim::known(size));
      if (x && out.size() != x->size()) {
        context.fail("output_shape [{}] must have the rank of the input {}", fmt::join(*shape, ", "), dimsText(*x));
      }
      context.output(0) = ValueType{dtype, out};
      return;
    }
    if (!x) return setUnknownShape(context, dtype);
    context.output(0) = ValueType{dtype, std::vector<Dim>(x->size())};
    return;
  }
  if (!x) return setUnknownShape(context, dtype);
  if (x->size() < 3) context.fail("needs an input [N, C, spatial...], found {}", dimsText(*x));
  const size_t spatial = x->size() - 2;
  const Ints kernel = context.node().intsAttribute("kernel_shape", {});
  if (kernel.size() != spatial) {
    context.fail("kernel_shape [{}] must have one size per spatial axis of {}", fmt::join(kernel, ", "), dimsText(*x));
  }
  const Ints strides = context.node().intsAttribute("strides", Ints(spatial, 1));
  const Ints pads = context.node().intsAttribute("pads", Ints(2 * spatial, 0));
  if (strides.size() != spatial || pads.size() != 2 * spatial) {
    context.fail("strides [{}] and pads [{}] do not match the {} spatial axes", fmt::join(strides, ", "),
                 fmt::join(pads, ", "), spatial);
  }
  std::vector<Dim> out{(*x)[0], (*x)[1]};
  for (size_t i = 0; i < spatial; ++i) {
    const Dim& in = (*x)[i + 2];
    if (!in.isKnown()) {
      out.emplace_back();
      continue;
    }
    const int64_t spread = addDims(context, multiplyDims(context, subtractDims(context, in.size, 1), strides[i]), kernel[i]);
    out.push_back(Dim::known(subtractDims(context, spread, addDims(context, pads[i], pads[i + spatial]))));
  }
  context.output(0) = ValueType{dtype, out};
}

// ------------------------------------------------------------------ BitCast

void bitCast(InferenceContext& context) {
  const DType from = context.inputType(0).dtype;
  if (!context.node().hasAttribute("to")) context.fail("needs the 'to' attribute");
  const int64_t code = context.node().intAttribute("to", 0);
  if (code < 0 || code > 255 || !isValidDType(static_cast<uint8_t>(code))) {
    context.fail("to = {} is not an element type kiln knows", code);
  }
  const auto to = static_cast<DType>(code);
  if (dtypeSize(to) != dtypeSize(from)) {
    context.fail("cannot reinterpret {} as {}: their sizes differ", dtypeName(from), dtypeName(to));
  }
  context.output(0) = ValueType{to, context.inputType(0).shape};
}

// ------------------------------------------------------------------- Einsum

// The parsed equation: one label string per input and the output's, with
// "..." replaced by '.' standing for every broadcast dimension.
struct EinsumTerms {
  std::vector<std::string> inputs;
  std::string output;
  bool explicit_output = false;
};

std::string einsumTerm(const InferenceContext& context, std::string term) {
  std::string out;
  for (size_t i = 0; i < term.size(); ++i) {
    const char c = term[i];
    if (c == ' ') continue;
    if (c == '.') {
      if (term.compare(i, 3, "...") != 0) context.fail("equation has a '.' outside an ellipsis");
      if (out.find('.') != std::string::npos) context.fail("equation has two ellipses in one term");
      out.push_back('.');
      i += 2;
    } else if (std::isalpha(static_cast<unsigned char>(c))) {
      out.push_back(c);
    } else {
      context.fail("equation has the character '{}' (letters, '...', ',' and '->' only)", c);
    }
  }
  return out;
}

EinsumTerms parseEinsum(const InferenceContext& context, const std::string& equation) {
  EinsumTerms terms;
  const size_t arrow = equation.find("->");
  const std::string lhs = equation.substr(0, arrow);
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    terms.inputs.push_back(einsumTerm(context, lhs.substr(start, comma == std::string::npos ? comma : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (arrow != std::string::npos) {
    terms.explicit_output = true;
    terms.output = einsumTerm(context, equation.substr(arrow + 2));
  } else {
    // Implicit: the ellipsis, then the labels seen once, alphabetically.
    std::map<char, int> counts;
    bool ellipsis = false;
    for (const std::string& term : terms.inputs) {
      for (char c : term) {
        if (c == '.') {
          ellipsis = true;
        } else {
          ++counts[c];
        }
      }
    }
    if (ellipsis) terms.output.push_back('.');
    // Upper case sorts before lower case, as numpy's implicit output does.
    for (const auto& [label, count] : counts) {
      if (count == 1) terms.output.push_back(label);
    }
  }
  return terms;
}

void einsum(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  for (size_t i = 1; i < context.inputCount(); ++i) {
    if (context.inputType(i).dtype != dtype) {
      context.fail("input {} is {} but input 0 is {}: they must match", i, dtypeName(context.inputType(i).dtype),
                   dtypeName(dtype));
    }
  }
  const EinsumTerms terms = parseEinsum(context, context.node().stringAttribute("equation", ""));
  if (terms.inputs.size() != context.inputCount()) {
    context.fail("the equation has {} input terms for {} inputs", terms.inputs.size(), context.inputCount());
  }
  std::map<char, Dim> sizes;
  std::vector<Dim> ellipsis;
  for (size_t i = 0; i < terms.inputs.size(); ++i) {
    const std::vector<Dim>* shape = knownShape(context, i);
    if (!shape) return setUnknownShape(context, dtype);
    const std::string& term = terms.inputs[i];
    const bool has_ellipsis = term.find('.') != std::string::npos;
    const size_t labels = term.size() - (has_ellipsis ? 1 : 0);
    if (has_ellipsis ? shape->size() < labels : shape->size() != labels) {
      context.fail("term '{}' does not fit input {} {}", term, i, dimsText(*shape));
    }
    const size_t broadcast = shape->size() - labels;
    size_t d = 0;
    for (char c : term) {
      if (c == '.') {
        const std::vector<Dim> part(shape->begin() + static_cast<std::ptrdiff_t>(d),
                                    shape->begin() + static_cast<std::ptrdiff_t>(d + broadcast));
        ellipsis = broadcastShapes(context, ellipsis, part);
        d += broadcast;
        continue;
      }
      const Dim& dim = (*shape)[d++];
      auto [it, inserted] = sizes.emplace(c, dim);
      if (inserted) continue;
      Dim& known = it->second;
      if (known.isKnown() && dim.isKnown() && known.size != dim.size) {
        // A label of size 1 broadcasts (numpy allows it).
        if (known.size == 1) {
          known = dim;
        } else if (dim.size != 1) {
          context.fail("label '{}' has sizes {} and {}", c, known.size, dim.size);
        }
      } else if (!known.isKnown()) {
        known = dim;
      }
    }
  }
  std::vector<Dim> out;
  for (char c : terms.output) {
    if (c == '.') {
      out.insert(out.end(), ellipsis.begin(), ellipsis.end());
      continue;
    }
    const auto it = sizes.find(c);
    if (it == sizes.end()) context.fail("output label '{}' is in no input term", c);
    if (std::count(terms.output.begin(), terms.output.end(), c) > 1) context.fail("output label '{}' repeats", c);
    out.push_back(it->second);
  }
  context.output(0) = ValueType{dtype, out};
}

// ---------------------------------------------------------------------- Det

void det(InferenceContext& context) {
  const DType dtype = context.inputType(0).dtype;
  if (dtype != DType::kF32 && dtype != DType::kF64 && dtype != DType::kF16 && dtype != DType::kBF16) {
    context.fail("needs a float input, found {}", dtypeName(dtype));
  }
  const std::vector<Dim>* in = knownShape(context, 0);
  if (!in) return setUnknownShape(context, dtype);
  if (in->size() < 2) context.fail("needs an input [*, M, M], found {}", dimsText(*in));
  const Dim &rows = (*in)[in->size() - 2], &columns = in->back();
  if (rows.isKnown() && columns.isKnown() && rows.size != columns.size) {
    context.fail("needs square matrices, found {}", dimsText(*in));
  }
  context.output(0) = ValueType{dtype, std::vector<Dim>(in->begin(), in->end() - 2)};
}

void add(OpRegistry& registry, const std::string& op, int64_t since, size_t min_inputs, size_t max_inputs,
         InferFunction infer) {
  registry.add(OpSchema{"", op, since, min_inputs, max_inputs, 1, 1, std::move(infer)});
}

}  // namespace

void registerIndexingOps(OpRegistry& registry) {
  add(registry, "TensorScatter", 24, 2, 3, tensorScatter);
  add(registry, "EyeLike", 9, 1, 1, eyeLike);
  add(registry, "ReverseSequence", 10, 2, 2, reverseSequence);
  add(registry, "CumProd", 26, 2, 2, cumulative);
  add(registry, "CenterCropPad", 18, 2, 2, centerCropPad);
  add(registry, "Col2Im", 18, 3, 3, col2Im);
  add(registry, "MaxUnpool", 9, 2, 3, maxUnpool);  // output_shape from 9; 11 only widens the types
  add(registry, "BitCast", 26, 1, 1, bitCast);
  add(registry, "Einsum", 12, 1, 64, einsum);
  add(registry, "Det", 11, 1, 1, det);
}

}  // namespace kiln
