#include "ops/shape_helpers.h"

#include <cmath>

namespace kiln {

std::vector<Dim> broadcastInputs(const InferenceContext& context, const std::vector<size_t>& inputs) {
  std::vector<Dim> result;
  for (size_t input : inputs) {
    if (!context.hasInput(input)) continue;
    const std::vector<Dim>& shape = context.inputShape(input);
    if (shape.size() > result.size()) result.insert(result.begin(), shape.size() - result.size(), Dim::known(1));
    const size_t offset = result.size() - shape.size();
    for (size_t i = 0; i < shape.size(); ++i) {
      Dim& into = result[offset + i];
      const Dim& dim = shape[i];
      if (dim == into || (dim.isKnown() && dim.size == 1)) continue;
      if (into.isKnown() && into.size == 1) {
        into = dim;
      } else if (into.isKnown() && dim.isKnown()) {
        context.fail("cannot broadcast input {} dimension {} ({}) against {}", input, i, dim.size, into.size);
      } else if (!into.isKnown() && dim.isKnown()) {
        into = dim;  // the known size must be what the unknown one is at run time
      } else if (!into.isKnown() && !dim.isKnown()) {
        into = Dim{};  // two different unknowns: anonymous
      }
    }
  }
  return result;
}

size_t normalizeAxis(const InferenceContext& context, int64_t axis, size_t rank) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r) context.fail("axis {} is out of range for rank {}", axis, rank);
  return static_cast<size_t>(axis < 0 ? axis + r : axis);
}

void copyInputType(InferenceContext& context, size_t input, size_t output) {
  context.output(output) = context.inputType(input);
}

int64_t addDims(const InferenceContext& context, int64_t a, int64_t b) {
  const std::optional<int64_t> sum = checkedAdd(a, b);
  if (!sum) context.fail("the dimension arithmetic {} + {} overflows 64 bits", a, b);
  return *sum;
}

int64_t subtractDims(const InferenceContext& context, int64_t a, int64_t b) {
  const std::optional<int64_t> difference = checkedSubtract(a, b);
  if (!difference) context.fail("the dimension arithmetic {} - {} overflows 64 bits", a, b);
  return *difference;
}

int64_t multiplyDims(const InferenceContext& context, int64_t a, int64_t b) {
  const std::optional<int64_t> product = checkedMultiply(a, b);
  if (!product) context.fail("the dimension arithmetic {} * {} overflows 64 bits", a, b);
  return *product;
}

int64_t dimFromFloat(const InferenceContext& context, double value) {
  if (!(std::abs(value) < 9.2e18)) context.fail("the dimension {} computed in floating point is not a size", value);
  return static_cast<int64_t>(value);
}

Dim divided(const Dim& a, int64_t c) { return a.isKnown() && c != 0 ? Dim::known(a.size / c) : Dim{}; }

Dim productOf(const InferenceContext& context, const std::vector<Dim>& dims) {
  int64_t product = 1;
  for (const Dim& dim : dims) {
    if (!dim.isKnown()) return Dim{};
    product = multiplyDims(context, product, dim.size);
  }
  return Dim::known(product);
}

const std::vector<Dim>* knownShape(const InferenceContext& context, size_t index) {
  if (!context.hasInput(index)) return nullptr;
  const ValueType& type = context.inputType(index);
  return type.shape ? &*type.shape : nullptr;
}

std::vector<Dim> broadcastShapes(const InferenceContext& context, const std::vector<Dim>& a,
                                 const std::vector<Dim>& b) {
  std::vector<Dim> result = a.size() >= b.size() ? a : b;
  const std::vector<Dim>& other = a.size() >= b.size() ? b : a;
  const size_t offset = result.size() - other.size();
  for (size_t i = 0; i < other.size(); ++i) {
    Dim& into = result[offset + i];
    const Dim& dim = other[i];
    if (dim == into || (dim.isKnown() && dim.size == 1)) continue;
    if (into.isKnown() && into.size == 1) {
      into = dim;
    } else if (into.isKnown() && dim.isKnown()) {
      context.fail("cannot broadcast {} against {}", dimsText(a), dimsText(b));
    } else if (dim.isKnown()) {
      into = dim;  // the known size must be what the unknown one is at run time
    } else if (!into.isKnown()) {
      into = Dim{};  // two different unknowns: anonymous
    }
  }
  return result;
}

std::vector<size_t> normalizeAxes(const InferenceContext& context, const std::vector<int64_t>& axes, size_t rank) {
  std::vector<size_t> result;
  std::vector<bool> seen(rank, false);
  for (int64_t axis : axes) {
    const size_t normalized = normalizeAxis(context, axis, rank);
    if (seen[normalized]) context.fail("axis {} is given more than once", axis);
    seen[normalized] = true;
    result.push_back(normalized);
  }
  return result;
}

std::string dimsText(const std::vector<Dim>& dims) {
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) text += ", ";
    text += dims[i].isKnown() ? std::to_string(dims[i].size) : (dims[i].symbol.empty() ? "?" : dims[i].symbol);
  }
  return text + "]";
}

}  // namespace kiln
