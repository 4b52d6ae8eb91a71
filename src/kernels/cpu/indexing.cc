// Indexing, scatter/gather and shape-manipulation CPU kernels with ONNX
// semantics: Shape, Size, ConstantOfShape, GatherElements, GatherND,
// Scatter, ScatterElements, ScatterND, TensorScatter, Trilu, TopK, OneHot,
// Range, EyeLike, DepthToSpace, SpaceToDepth, ReverseSequence, CumSum,
// CumProd, CenterCropPad, Col2Im, MaxUnpool, BitCast, Einsum and Det.
//
// Kernels that only move data move elements by size (1, 2, 4 or 8 bytes), so
// they take every element type; those that compute (the scatter reductions,
// TopK, the cumulative ops, Einsum, Det) run in the element type, f16 and
// bf16 through f32.
//
// Inputs that are positions or sizes (Trilu's k, CumSum's axis, Range's
// start and delta) are read at prepare when they are constants, else at run.
// Sizes that decide the output shape (TopK's k, OneHot's depth, Range's
// length) come from the output's static shape; run checks the input against
// it where it can, and writes what it can without reading out of bounds when
// they disagree (run cannot throw). Out-of-range indices, which ONNX calls
// errors, are refused at prepare when the indices are constants; at run they
// are skipped (gathers write zeros).
//
// Kernels that need working memory (TopK, Det) keep it in thread_local
// buffers that grow on first use: no allocation once warm.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/wrapping_arithmetic.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/numeric_types.h"
#include "kernels/cpu/setup_helpers.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

using Ints = std::vector<int64_t>;
using numeric::Arith;
using numeric::BFloat16;
using numeric::Half;
using numeric::TypeTag;
using numeric::withFloatType;
using numeric::withNumericType;

// ------------------------------------------------------------------ helpers

using setup_helpers::constantInput;
using setup_helpers::expectOutput;
using setup_helpers::normalizeAxis;
using setup_helpers::present;
using setup_helpers::product;
using setup_helpers::readInt;
using setup_helpers::refuseElementSize;
using setup_helpers::withElementSize;
using setup_helpers::typeString;

void expectCounts(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs,
                  size_t outputs = 1) {
  if (setup.inputs.size() < min_inputs || setup.inputs.size() > max_inputs) {
    const std::string expected =
        min_inputs == max_inputs ? std::to_string(min_inputs) : fmt::format("{} to {}", min_inputs, max_inputs);
    throw UsageError(fmt::format("{}: expects {} inputs, got {}", op, expected, setup.inputs.size()));
  }
  if (setup.outputs.size() != outputs) {
    throw UsageError(fmt::format("{}: expects {} output{}, got {}", op, outputs, outputs == 1 ? "" : "s",
                                 setup.outputs.size()));
  }
  auto check = [&](const TensorInfo& info, const char* what, size_t i) {
    if (info.dtype == DType::kUndefined) return;
    if (!info.isStatic()) {
      throw UsageError(fmt::format("{}: needs static shapes, {} {} is {}", op, what, i, typeString(info)));
    }
  };
  for (size_t i = 0; i < setup.inputs.size(); ++i) check(setup.inputs[i], "input", i);
  for (size_t i = 0; i < setup.outputs.size(); ++i) check(setup.outputs[i], "output", i);
}

Ints stridesOf(const Ints& shape) {
  Ints strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

bool isIndexType(DType dtype) { return dtype == DType::kI32 || dtype == DType::kI64; }

void expectIndexType(std::string_view op, const TensorInfo& info, const char* what) {
  if (!isIndexType(info.dtype)) {
    throw UsageError(fmt::format("{}: {} must be i32 or i64, got {}", op, what, dtypeName(info.dtype)));
  }
}

// Element `i` of an i32 or i64 tensor.
// The bytes of `value` as one element of `dtype` (bool: 0 or 1).
std::array<std::byte, 8> elementBytes(DType dtype, double value) {
  std::array<std::byte, 8> bytes{};
  if (dtype == DType::kBool) {
    bytes[0] = static_cast<std::byte>(value != 0);
    return bytes;
  }
  const bool known = withNumericType(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = typename Arith<T>::Acc;
    const T v = Arith<T>::store(static_cast<Acc>(value));
    std::memcpy(bytes.data(), &v, sizeof v);
  });
  if (!known) throw UsageError(fmt::format("no kernel writes {} values", dtypeName(dtype)));
  return bytes;
}

// A number read as an index, truncated toward zero; INT64_MIN (out of any
// range) when it has no int64 value (NaN, infinities, 1e30): casting those
// is undefined.
int64_t indexOf(double value) { return std::abs(value) < 9.2e18 ? static_cast<int64_t>(value) : INT64_MIN; }

// Element `i` of a numeric tensor as double (OneHot's float indices and depth).
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

// ------------------------------------------------------------- Shape, Size

// Writes fixed i64 values: Shape and Size of a static input.
struct ValuesState final : KernelState {
  Ints values;
};

std::unique_ptr<KernelState> prepareShape(const KernelSetup& setup) {
  expectCounts("Shape", setup, 1, 1);
  const Ints& dims = setup.inputs[0].shape;
  const auto rank = static_cast<int64_t>(dims.size());
  auto clampToRank = [rank](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + rank : i, 0, rank); };
  const int64_t start = clampToRank(setup.params.getInt("start", 0));
  const int64_t end = std::max(start, clampToRank(setup.params.getInt("end", rank)));
  auto state = std::make_unique<ValuesState>();
  state->values.assign(dims.begin() + start, dims.begin() + end);
  expectOutput("Shape", setup.outputs[0], DType::kI64, {end - start});
  return state;
}

std::unique_ptr<KernelState> prepareSize(const KernelSetup& setup) {
  expectCounts("Size", setup, 1, 1);
  auto state = std::make_unique<ValuesState>();
  state->values = {static_cast<int64_t>(setup.inputs[0].numElements())};
  expectOutput("Size", setup.outputs[0], DType::kI64, {});
  return state;
}

void runValues(const KernelCall& call) {
  const auto& state = static_cast<const ValuesState&>(*call.state);
  if (!state.values.empty()) {
    std::memcpy(call.outputs[0].data, state.values.data(), state.values.size() * sizeof(int64_t));
  }
}

// --------------------------------------------------------- ConstantOfShape

// Fills the output with one element's bytes.
struct FillState final : KernelState {
  std::array<std::byte, 8> value{};
  size_t element_size = 0;
};

template <typename T>
void fillWith(std::byte* data, uint64_t count, const std::array<std::byte, 8>& value) {
  T v;
  std::memcpy(&v, value.data(), sizeof v);
  std::fill_n(reinterpret_cast<T*>(data), count, v);
}

void fill(std::byte* data, uint64_t count, size_t element_size, const std::array<std::byte, 8>& value) {
  withElementSize(element_size, [&](auto t) { fillWith<decltype(t)>(data, count, value); });
}

std::unique_ptr<KernelState> prepareConstantOfShape(const KernelSetup& setup) {
  expectCounts("ConstantOfShape", setup, 1, 1);
  const TensorInfo& y = setup.outputs[0];
  expectIndexType("ConstantOfShape", setup.inputs[0], "the shape");
  if (const std::byte* shape = constantInput(setup, 0)) {
    Ints dims(setup.inputs[0].numElements());
    for (size_t i = 0; i < dims.size(); ++i) dims[i] = readInt(shape, setup.inputs[0].dtype, i);
    expectOutput("ConstantOfShape", y, y.dtype, dims);
  }
  refuseElementSize("ConstantOfShape", y.dtype);
  auto state = std::make_unique<FillState>();
  state->element_size = dtypeSize(y.dtype);
  // The compiler passes the one-element 'value' tensor as a number: an int
  // for integer types (i64 and u64 copied bit for bit), else a float.
  const auto it = setup.params.values().find("value");
  if (it != setup.params.values().end() && std::holds_alternative<int64_t>(it->second)) {
    const int64_t value = std::get<int64_t>(it->second);
    if (y.dtype == DType::kI64 || y.dtype == DType::kU64) {
      std::memcpy(state->value.data(), &value, sizeof value);
    } else {
      state->value = elementBytes(y.dtype, static_cast<double>(value));
    }
  } else {
    state->value = elementBytes(y.dtype, setup.params.getFloat("value", 0.0));
  }
  return state;
}

void runFill(const KernelCall& call) {
  const auto& state = static_cast<const FillState&>(*call.state);
  fill(call.outputs[0].data, call.outputs[0].numElements(), state.element_size, state.value);
}

// ------------------------------------------------------------ GatherElements

struct GatherElementsState final : KernelState {
  uint32_t rank = 0;
  size_t axis = 0;
  std::array<int64_t, kMaxRank> index_dims{};
  std::array<int64_t, kMaxRank> data_strides{};
  int64_t axis_dim = 0;
  DType index_dtype = DType::kI64;
  size_t element_size = 0;
};

template <typename T>
void gatherElementsLoop(const GatherElementsState& s, const std::byte* x_bytes, const std::byte* indices,
                        std::byte* y_bytes) {
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  uint64_t count = 1;
  for (uint32_t d = 0; d < s.rank; ++d) count *= static_cast<uint64_t>(s.index_dims[d]);
  std::array<int64_t, kMaxRank> coord{};
  int64_t base = 0;  // data offset of coord with the axis coordinate at 0
  for (uint64_t i = 0; i < count; ++i) {
    int64_t index = readInt(indices, s.index_dtype, i);
    if (index < 0) index += s.axis_dim;
    y[i] = index >= 0 && index < s.axis_dim ? x[base + index * s.data_strides[s.axis]] : T(0);
    for (uint32_t d = s.rank; d-- > 0;) {
      if (d != s.axis) base += s.data_strides[d];
      if (++coord[d] < s.index_dims[d]) break;
      if (d != s.axis) base -= s.data_strides[d] * s.index_dims[d];
      coord[d] = 0;
    }
  }
}

std::unique_ptr<KernelState> prepareGatherElements(const KernelSetup& setup) {
  expectCounts("GatherElements", setup, 2, 2);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& indices = setup.inputs[1];
  refuseElementSize("GatherElements", x.dtype);
  expectIndexType("GatherElements", indices, "indices");
  if (x.shape.empty() || x.shape.size() != indices.shape.size()) {
    throw UsageError(fmt::format("GatherElements: data {} and indices {} must have one rank, 1 or more", typeString(x),
                                 typeString(indices)));
  }
  auto state = std::make_unique<GatherElementsState>();
  state->rank = static_cast<uint32_t>(x.shape.size());
  state->axis = static_cast<size_t>(normalizeAxis("GatherElements", setup.params.getInt("axis", 0), x.shape.size()));
  const Ints strides = stridesOf(x.shape);
  for (size_t d = 0; d < x.shape.size(); ++d) {
    if (d != state->axis && indices.shape[d] > x.shape[d]) {
      throw UsageError(fmt::format("GatherElements: indices {} exceed data {} along axis {}", typeString(indices),
                                   typeString(x), d));
    }
    state->index_dims[d] = indices.shape[d];
    state->data_strides[d] = strides[d];
  }
  state->axis_dim = x.shape[state->axis];
  state->index_dtype = indices.dtype;
  state->element_size = dtypeSize(x.dtype);
  expectOutput("GatherElements", setup.outputs[0], x.dtype, indices.shape);
  if (const std::byte* bytes = constantInput(setup, 1)) {
    for (uint64_t i = 0; i < indices.numElements(); ++i) {
      const int64_t index = readInt(bytes, indices.dtype, i);
      if (index < -state->axis_dim || index >= state->axis_dim) {
        throw UsageError(fmt::format("GatherElements: index {} is out of range for axis {} of size {}", index,
                                     state->axis, state->axis_dim));
      }
    }
  }
  return state;
}

void runGatherElements(const KernelCall& call) {
  const auto& state = static_cast<const GatherElementsState&>(*call.state);
  withElementSize(state.element_size, [&](auto t) {
    gatherElementsLoop<decltype(t)>(state, call.inputs[0].data, call.inputs[1].data, call.outputs[0].data);
  });
}

// ----------------------------------------------------------------- GatherND

// Data seen as [batch, addressed..., slice]; indices as [batch, tuples, depth].
struct GatherNdState final : KernelState {
  int64_t batch = 1;
  int64_t tuples = 1;  // index tuples per batch entry
  int64_t depth = 0;   // the length of one tuple
  std::array<int64_t, kMaxRank> addressed{};         // the dims the tuple indexes
  std::array<int64_t, kMaxRank> addressed_strides{};  // in slices
  int64_t slices_per_batch = 1;
  int64_t slice_bytes = 0;
  DType index_dtype = DType::kI64;
};

void runGatherNd(const KernelCall& call) {
  const auto& s = static_cast<const GatherNdState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  const std::byte* indices = call.inputs[1].data;
  std::byte* y = call.outputs[0].data;
  uint64_t tuple = 0;
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t t = 0; t < s.tuples; ++t, ++tuple, y += s.slice_bytes) {
      int64_t slice = 0;
      bool valid = true;
      for (int64_t k = 0; k < s.depth; ++k) {
        int64_t index = readInt(indices, s.index_dtype, tuple * static_cast<uint64_t>(s.depth) + static_cast<uint64_t>(k));
        if (index < 0) index += s.addressed[static_cast<size_t>(k)];
        valid = valid && index >= 0 && index < s.addressed[static_cast<size_t>(k)];
        if (valid) slice += index * s.addressed_strides[static_cast<size_t>(k)];  // an invalid index may overflow
      }
      if (!valid) {
        std::memset(y, 0, static_cast<size_t>(s.slice_bytes));
        continue;
      }
      std::memcpy(y, x + (b * s.slices_per_batch + slice) * s.slice_bytes, static_cast<size_t>(s.slice_bytes));
    }
  }
}

// The index tuples' layout shared by GatherND and ScatterND.
void planTuples(std::string_view op, const TensorInfo& data, const TensorInfo& indices, int64_t batch_dims,
                GatherNdState& s) {
  if (indices.shape.empty()) throw UsageError(fmt::format("{}: indices must have rank 1 or more", op));
  const auto b = static_cast<size_t>(batch_dims);
  if (batch_dims < 0 || b >= data.shape.size() || b >= indices.shape.size()) {
    throw UsageError(fmt::format("{}: batch_dims {} must be less than the ranks of data {} and indices {}", op,
                                 batch_dims, typeString(data), typeString(indices)));
  }
  for (size_t d = 0; d < b; ++d) {
    if (data.shape[d] != indices.shape[d]) {
      throw UsageError(fmt::format("{}: the batch dimensions of data {} and indices {} differ", op, typeString(data),
                                   typeString(indices)));
    }
  }
  const int64_t depth = indices.shape.back();
  if (depth < 1 || b + static_cast<size_t>(depth) > data.shape.size()) {
    throw UsageError(fmt::format("{}: index tuples of {} cannot address data {} after {} batch dimensions", op, depth,
                                 typeString(data), b));
  }
  s.batch = product(data.shape, 0, b);
  s.tuples = product(indices.shape, b, indices.shape.size() - 1);
  s.depth = depth;
  const size_t end = b + static_cast<size_t>(depth);
  const int64_t slice = product(data.shape, end, data.shape.size());
  s.slice_bytes = slice * static_cast<int64_t>(dtypeSize(data.dtype));
  s.slices_per_batch = product(data.shape, b, end);
  int64_t stride = 1;
  for (size_t k = static_cast<size_t>(depth); k-- > 0;) {
    s.addressed[k] = data.shape[b + k];
    s.addressed_strides[k] = stride;
    stride *= data.shape[b + k];
  }
  s.index_dtype = indices.dtype;
}

std::unique_ptr<KernelState> prepareGatherNd(const KernelSetup& setup) {
  expectCounts("GatherND", setup, 2, 2);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& indices = setup.inputs[1];
  expectIndexType("GatherND", indices, "indices");
  if (dtypeSize(x.dtype) == 0) throw UsageError(fmt::format("GatherND: no kernel for {} data", dtypeName(x.dtype)));
  auto state = std::make_unique<GatherNdState>();
  const int64_t batch_dims = setup.params.getInt("batch_dims", 0);
  planTuples("GatherND", x, indices, batch_dims, *state);
  Ints out(indices.shape.begin(), indices.shape.end() - 1);
  out.insert(out.end(), x.shape.begin() + batch_dims + state->depth, x.shape.end());
  expectOutput("GatherND", setup.outputs[0], x.dtype, out);
  return state;
}

// ----------------------------------------------------------- the scatters

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Reduction reductionOf(std::string_view op, const KernelSetup& setup) {
  const std::string name = setup.params.getString("reduction", "none");
  if (name == "none") return Reduction::kNone;
  if (name == "add") return Reduction::kAdd;
  if (name == "mul") return Reduction::kMul;
  if (name == "max") return Reduction::kMax;
  if (name == "min") return Reduction::kMin;
  throw UsageError(fmt::format("{}: reduction '{}' is not none, add, mul, max or min", op, name));
}

template <typename T>
void reduceInto(Reduction reduction, T* into, const T* from, int64_t n) {
  using A = Arith<T>;
  // Integers wrap as ONNX defines them (INT64_MIN * -2 is undefined in C++).
  constexpr bool kWraps = std::is_integral_v<T> && !std::is_same_v<T, bool>;
  for (int64_t i = 0; i < n; ++i) {
    const auto a = A::load(into[i]);
    const auto b = A::load(from[i]);
    switch (reduction) {
      case Reduction::kNone: into[i] = from[i]; break;
      case Reduction::kAdd:
        if constexpr (kWraps) {
          into[i] = wrapAdd(into[i], from[i]);
        } else {
          into[i] = A::store(static_cast<typename A::Acc>(a + b));
        }
        break;
      case Reduction::kMul:
        if constexpr (kWraps) {
          into[i] = wrapMul(into[i], from[i]);
        } else {
          into[i] = A::store(static_cast<typename A::Acc>(a * b));
        }
        break;
      case Reduction::kMax: into[i] = A::store(std::max(a, b)); break;
      case Reduction::kMin: into[i] = A::store(std::min(a, b)); break;
    }
  }
}

using ReduceFn = void (*)(Reduction reduction, std::byte* into, const std::byte* from, int64_t n);

template <typename T>
void reduceBytes(Reduction reduction, std::byte* into, const std::byte* from, int64_t n) {
  reduceInto(reduction, reinterpret_cast<T*>(into), reinterpret_cast<const T*>(from), n);
}

// The function combining updates into the output for `dtype`: any element
// type without a reduction, numeric types with one.
ReduceFn reduceFnFor(std::string_view op, DType dtype, Reduction reduction) {
  ReduceFn fn = nullptr;
  if (reduction == Reduction::kNone) {
    refuseElementSize(op, dtype);
    withElementSize(dtypeSize(dtype), [&](auto t) { fn = &reduceBytes<decltype(t)>; });
    return fn;
  }
  withNumericType(dtype, [&](auto tag) { fn = &reduceBytes<typename decltype(tag)::type>; });
  if (fn == nullptr) throw UsageError(fmt::format("{}: no reduction for {} data", op, dtypeName(dtype)));
  return fn;
}

void copyInput(const KernelCall& call, size_t input, uint64_t bytes) {
  if (call.inputs[input].data != call.outputs[0].data && bytes != 0) {
    std::memcpy(call.outputs[0].data, call.inputs[input].data, bytes);
  }
}

struct ScatterElementsState final : KernelState {
  ReduceFn reduce = nullptr;
  Reduction reduction = Reduction::kNone;
  uint32_t rank = 0;
  size_t axis = 0;
  std::array<int64_t, kMaxRank> update_dims{};
  std::array<int64_t, kMaxRank> data_strides{};
  int64_t axis_dim = 0;
  DType index_dtype = DType::kI64;
  size_t element_size = 0;
  uint64_t data_bytes = 0;
};

std::unique_ptr<KernelState> prepareScatterElementsAs(std::string_view op, const KernelSetup& setup) {
  expectCounts(op, setup, 3, 3);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& indices = setup.inputs[1];
  const TensorInfo& updates = setup.inputs[2];
  expectIndexType(op, indices, "indices");
  if (x.shape.empty() || indices.shape != updates.shape || indices.shape.size() != x.shape.size() ||
      updates.dtype != x.dtype) {
    throw UsageError(fmt::format("{}: data {}, indices {} and updates {} must have one rank, the indices and updates "
                                 "one shape and the data and updates one type",
                                 op, typeString(x), typeString(indices), typeString(updates)));
  }
  auto state = std::make_unique<ScatterElementsState>();
  state->reduction = reductionOf(op, setup);
  state->reduce = reduceFnFor(op, x.dtype, state->reduction);
  state->rank = static_cast<uint32_t>(x.shape.size());
  state->axis = static_cast<size_t>(normalizeAxis(op, setup.params.getInt("axis", 0), x.shape.size()));
  const Ints strides = stridesOf(x.shape);
  for (size_t d = 0; d < x.shape.size(); ++d) {
    if (d != state->axis && indices.shape[d] > x.shape[d]) {
      throw UsageError(fmt::format("{}: indices {} exceed data {} along axis {}", op, typeString(indices),
                                   typeString(x), d));
    }
    state->update_dims[d] = indices.shape[d];
    state->data_strides[d] = strides[d];
  }
  state->axis_dim = x.shape[state->axis];
  state->index_dtype = indices.dtype;
  state->element_size = dtypeSize(x.dtype);
  state->data_bytes = x.sizeInBytes();
  expectOutput(op, setup.outputs[0], x.dtype, x.shape);
  if (const std::byte* bytes = constantInput(setup, 1)) {
    for (uint64_t i = 0; i < indices.numElements(); ++i) {
      const int64_t index = readInt(bytes, indices.dtype, i);
      if (index < -state->axis_dim || index >= state->axis_dim) {
        throw UsageError(fmt::format("{}: index {} is out of range for axis {} of size {}", op, index, state->axis,
                                     state->axis_dim));
      }
    }
  }
  return state;
}

std::unique_ptr<KernelState> prepareScatterElements(const KernelSetup& setup) {
  return prepareScatterElementsAs("ScatterElements", setup);
}
std::unique_ptr<KernelState> prepareScatter(const KernelSetup& setup) { return prepareScatterElementsAs("Scatter", setup); }

void runScatterElements(const KernelCall& call) {
  const auto& s = static_cast<const ScatterElementsState&>(*call.state);
  copyInput(call, 0, s.data_bytes);
  const std::byte* indices = call.inputs[1].data;
  const std::byte* updates = call.inputs[2].data;
  std::byte* y = call.outputs[0].data;
  const auto size = static_cast<int64_t>(s.element_size);
  uint64_t count = 1;
  for (uint32_t d = 0; d < s.rank; ++d) count *= static_cast<uint64_t>(s.update_dims[d]);
  std::array<int64_t, kMaxRank> coord{};
  int64_t base = 0;
  for (uint64_t i = 0; i < count; ++i) {
    int64_t index = readInt(indices, s.index_dtype, i);
    if (index < 0) index += s.axis_dim;
    if (index >= 0 && index < s.axis_dim) {
      s.reduce(s.reduction, y + (base + index * s.data_strides[s.axis]) * size,
               updates + static_cast<int64_t>(i) * size, 1);
    }
    for (uint32_t d = s.rank; d-- > 0;) {
      if (d != s.axis) base += s.data_strides[d];
      if (++coord[d] < s.update_dims[d]) break;
      if (d != s.axis) base -= s.data_strides[d] * s.update_dims[d];
      coord[d] = 0;
    }
  }
}

struct ScatterNdState final : KernelState {
  GatherNdState tuples;
  ReduceFn reduce = nullptr;
  Reduction reduction = Reduction::kNone;
  int64_t slice_elements = 0;
  uint64_t data_bytes = 0;
};

std::unique_ptr<KernelState> prepareScatterNd(const KernelSetup& setup) {
  expectCounts("ScatterND", setup, 3, 3);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& indices = setup.inputs[1];
  const TensorInfo& updates = setup.inputs[2];
  expectIndexType("ScatterND", indices, "indices");
  auto state = std::make_unique<ScatterNdState>();
  state->reduction = reductionOf("ScatterND", setup);
  state->reduce = reduceFnFor("ScatterND", x.dtype, state->reduction);
  planTuples("ScatterND", x, indices, 0, state->tuples);
  Ints expected(indices.shape.begin(), indices.shape.end() - 1);
  expected.insert(expected.end(), x.shape.begin() + state->tuples.depth, x.shape.end());
  if (updates.dtype != x.dtype || updates.shape != expected) {
    throw UsageError(fmt::format("ScatterND: updates {} should be {}{} for data {} and indices {}", typeString(updates),
                                 dtypeName(x.dtype), TensorInfo{x.dtype, expected}.shapeString(), typeString(x),
                                 typeString(indices)));
  }
  state->slice_elements = product(x.shape, static_cast<size_t>(state->tuples.depth), x.shape.size());
  state->data_bytes = x.sizeInBytes();
  expectOutput("ScatterND", setup.outputs[0], x.dtype, x.shape);
  return state;
}

void runScatterNd(const KernelCall& call) {
  const auto& state = static_cast<const ScatterNdState&>(*call.state);
  const GatherNdState& s = state.tuples;
  copyInput(call, 0, state.data_bytes);
  const std::byte* indices = call.inputs[1].data;
  const std::byte* updates = call.inputs[2].data;
  std::byte* y = call.outputs[0].data;
  for (int64_t t = 0; t < s.tuples; ++t) {
    int64_t slice = 0;
    bool valid = true;
    for (int64_t k = 0; k < s.depth; ++k) {
      int64_t index = readInt(indices, s.index_dtype, static_cast<uint64_t>(t * s.depth + k));
      if (index < 0) index += s.addressed[static_cast<size_t>(k)];
      valid = valid && index >= 0 && index < s.addressed[static_cast<size_t>(k)];
      if (valid) slice += index * s.addressed_strides[static_cast<size_t>(k)];  // an invalid index may overflow
    }
    if (valid) state.reduce(state.reduction, y + slice * s.slice_bytes, updates + t * s.slice_bytes, state.slice_elements);
  }
}

// ------------------------------------------------------------ TensorScatter

// The cache seen as [prefix, max_sequence, inner] with prefix's first
// dimension the batch; the update as [prefix, sequence, inner].
struct TensorScatterState final : KernelState {
  int64_t batch = 1;
  int64_t per_batch = 1;  // prefix entries per batch entry
  int64_t max_sequence = 0;
  int64_t sequence = 0;
  int64_t inner_bytes = 0;
  bool circular = false;
  bool has_indices = false;
  uint64_t cache_bytes = 0;
};

std::unique_ptr<KernelState> prepareTensorScatter(const KernelSetup& setup) {
  expectCounts("TensorScatter", setup, 2, 3);
  const TensorInfo& cache = setup.inputs[0];
  const TensorInfo& update = setup.inputs[1];
  const size_t rank = cache.shape.size();
  if (rank < 2 || update.shape.size() != rank || update.dtype != cache.dtype || dtypeSize(cache.dtype) == 0) {
    throw UsageError(fmt::format("TensorScatter: the cache {} and update {} must have one type and one rank, 2 or more",
                                 typeString(cache), typeString(update)));
  }
  const auto axis = static_cast<size_t>(normalizeAxis("TensorScatter", setup.params.getInt("axis", -2), rank));
  if (axis == 0) throw UsageError("TensorScatter: axis must not be the batch axis 0");
  for (size_t d = 0; d < rank; ++d) {
    if (d == axis ? update.shape[d] > cache.shape[d] : update.shape[d] != cache.shape[d]) {
      throw UsageError(fmt::format("TensorScatter: the update {} does not fit the cache {} along axis {}",
                                   typeString(update), typeString(cache), d));
    }
  }
  auto state = std::make_unique<TensorScatterState>();
  const std::string mode = setup.params.getString("mode", "linear");
  if (mode != "linear" && mode != "circular") {
    throw UsageError(fmt::format("TensorScatter: mode '{}' is not linear or circular", mode));
  }
  state->circular = mode == "circular";
  state->batch = cache.shape[0];
  state->per_batch = product(cache.shape, 1, axis);
  state->max_sequence = cache.shape[axis];
  state->sequence = update.shape[axis];
  state->inner_bytes = product(cache.shape, axis + 1, rank) * static_cast<int64_t>(dtypeSize(cache.dtype));
  state->cache_bytes = cache.sizeInBytes();
  if (present(setup, 2)) {
    const TensorInfo& indices = setup.inputs[2];
    if (indices.dtype != DType::kI64 || indices.shape != Ints{cache.shape[0]}) {
      throw UsageError(fmt::format("TensorScatter: write_indices must be i64[{}], got {}", cache.shape[0],
                                   typeString(indices)));
    }
    state->has_indices = true;
  }
  expectOutput("TensorScatter", setup.outputs[0], cache.dtype, cache.shape);
  return state;
}

void runTensorScatter(const KernelCall& call) {
  const auto& s = static_cast<const TensorScatterState&>(*call.state);
  copyInput(call, 0, s.cache_bytes);
  const std::byte* update = call.inputs[1].data;
  std::byte* y = call.outputs[0].data;
  const auto bytes = static_cast<size_t>(s.inner_bytes);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t start = s.has_indices ? readInt(call.inputs[2].data, DType::kI64, static_cast<uint64_t>(b)) : 0;
    for (int64_t p = 0; p < s.per_batch; ++p) {
      const int64_t row = b * s.per_batch + p;
      for (int64_t i = 0; i < s.sequence; ++i) {
        int64_t at = start + i;
        if (s.circular) at = ((at % s.max_sequence) + s.max_sequence) % s.max_sequence;
        if (at < 0 || at >= s.max_sequence) continue;
        std::memcpy(y + (row * s.max_sequence + at) * s.inner_bytes, update + (row * s.sequence + i) * s.inner_bytes,
                    bytes);
      }
    }
  }
}

// -------------------------------------------------------------------- Trilu

struct TriluState final : KernelState {
  bool upper = true;
  int64_t k = 0;
  bool k_at_run = false;
  int64_t matrices = 1, rows = 0, columns = 0;
  size_t element_size = 0;
};

std::unique_ptr<KernelState> prepareTrilu(const KernelSetup& setup) {
  expectCounts("Trilu", setup, 1, 2);
  const TensorInfo& x = setup.inputs[0];
  if (x.shape.size() < 2) throw UsageError(fmt::format("Trilu: needs rank 2 or more, got {}", typeString(x)));
  refuseElementSize("Trilu", x.dtype);
  auto state = std::make_unique<TriluState>();
  state->upper = setup.params.getInt("upper", 1) != 0;
  if (present(setup, 1)) {
    const TensorInfo& k = setup.inputs[1];
    if (k.dtype != DType::kI64 || k.numElements() != 1) {
      throw UsageError(fmt::format("Trilu: k must be one i64 value, got {}", typeString(k)));
    }
    if (const std::byte* bytes = constantInput(setup, 1)) {
      state->k = readInt(bytes, DType::kI64, 0);
    } else {
      state->k_at_run = true;
    }
  }
  const size_t rank = x.shape.size();
  state->matrices = product(x.shape, 0, rank - 2);
  state->rows = x.shape[rank - 2];
  state->columns = x.shape[rank - 1];
  state->element_size = dtypeSize(x.dtype);
  expectOutput("Trilu", setup.outputs[0], x.dtype, x.shape);
  return state;
}

void runTrilu(const KernelCall& call) {
  const auto& s = static_cast<const TriluState&>(*call.state);
  if (s.matrices == 0 || s.rows == 0 || s.columns == 0) return;  // empty (the other sizes may be anything)
  // Any k past the matrix's corners acts as the corner: clamped, so that
  // i + k cannot overflow (rows + columns + 1 cannot: the matrix is in memory).
  const int64_t reach = s.rows + s.columns + 1;
  const int64_t k = std::clamp<int64_t>(s.k_at_run ? readInt(call.inputs[1].data, DType::kI64, 0) : s.k, -reach, reach);
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  const auto size = static_cast<int64_t>(s.element_size);
  const int64_t row_bytes = s.columns * size;
  for (int64_t m = 0; m < s.matrices; ++m) {
    for (int64_t i = 0; i < s.rows; ++i) {
      const int64_t offset = (m * s.rows + i) * row_bytes;
      // upper keeps j >= i + k; lower keeps j <= i + k.
      const int64_t split = std::clamp<int64_t>(s.upper ? i + k : i + k + 1, 0, s.columns);
      const int64_t zero_begin = s.upper ? 0 : split, zero_end = s.upper ? split : s.columns;
      const int64_t keep_begin = s.upper ? split : 0, keep_end = s.upper ? s.columns : split;
      if (x != y && keep_end > keep_begin) {
        std::memcpy(y + offset + keep_begin * size, x + offset + keep_begin * size,
                    static_cast<size_t>((keep_end - keep_begin) * size));
      }
      if (zero_end > zero_begin) {
        std::memset(y + offset + zero_begin * size, 0, static_cast<size_t>((zero_end - zero_begin) * size));
      }
    }
  }
}

// --------------------------------------------------------------------- TopK

struct TopKState final : KernelState {
  using Loop = void (*)(const TopKState& s, const std::byte* x, std::byte* values, int64_t* indices);
  Loop loop = nullptr;
  int64_t outer = 1, axis_dim = 0, inner = 1, k = 0;
  bool largest = true;
};

template <typename T>
void topKLoop(const TopKState& s, const std::byte* x_bytes, std::byte* values_bytes, int64_t* indices) {
  using A = Arith<T>;
  using Acc = typename A::Acc;
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* values = reinterpret_cast<T*>(values_bytes);
  thread_local std::vector<std::pair<Acc, int64_t>> scratch;
  if (scratch.size() < static_cast<size_t>(s.axis_dim)) scratch.resize(static_cast<size_t>(s.axis_dim));
  // Ties keep the lower index first; NaN counts as the largest value.
  auto before = [largest = s.largest](const std::pair<Acc, int64_t>& a, const std::pair<Acc, int64_t>& b) {
    if constexpr (std::is_floating_point_v<Acc>) {
      const bool a_nan = a.first != a.first, b_nan = b.first != b.first;
      if (a_nan || b_nan) {
        if (a_nan && b_nan) return a.second < b.second;
        return largest ? a_nan : b_nan;
      }
    }
    if (a.first != b.first) return largest ? a.first > b.first : a.first < b.first;
    return a.second < b.second;
  };
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t in = 0; in < s.inner; ++in) {
      const T* row = x + o * s.axis_dim * s.inner + in;
      for (int64_t j = 0; j < s.axis_dim; ++j) scratch[static_cast<size_t>(j)] = {A::load(row[j * s.inner]), j};
      std::partial_sort(scratch.begin(), scratch.begin() + s.k, scratch.begin() + s.axis_dim, before);
      const int64_t out = o * s.k * s.inner + in;
      for (int64_t j = 0; j < s.k; ++j) {
        const auto& [value, index] = scratch[static_cast<size_t>(j)];
        values[out + j * s.inner] = row[index * s.inner];
        indices[out + j * s.inner] = index;
      }
    }
  }
}

std::unique_ptr<KernelState> prepareTopK(const KernelSetup& setup) {
  expectCounts("TopK", setup, 1, 2, 2);
  const TensorInfo& x = setup.inputs[0];
  if (x.shape.empty()) throw UsageError(fmt::format("TopK: needs rank 1 or more, got {}", typeString(x)));
  auto state = std::make_unique<TopKState>();
  const auto axis = static_cast<size_t>(normalizeAxis("TopK", setup.params.getInt("axis", -1), x.shape.size()));
  const TensorInfo& values = setup.outputs[0];
  if (values.shape.size() != x.shape.size()) {
    throw UsageError(fmt::format("TopK: output {} does not match input {}", typeString(values), typeString(x)));
  }
  state->k = values.shape[axis];
  if (present(setup, 1)) {
    const TensorInfo& k = setup.inputs[1];
    if (k.dtype != DType::kI64 || k.numElements() != 1) {
      throw UsageError(fmt::format("TopK: k must be one i64 value, got {}", typeString(k)));
    }
    if (const std::byte* bytes = constantInput(setup, 1); bytes && readInt(bytes, DType::kI64, 0) != state->k) {
      throw UsageError(fmt::format("TopK: k is {} but the output {} has {}", readInt(bytes, DType::kI64, 0),
                                   typeString(values), state->k));
    }
  } else if (setup.params.getInt("k", state->k) != state->k) {
    throw UsageError(fmt::format("TopK: k is {} but the output {} has {}", setup.params.getInt("k", 0),
                                 typeString(values), state->k));
  }
  if (state->k > x.shape[axis]) {
    throw UsageError(fmt::format("TopK: k {} is larger than axis {} of {}", state->k, axis, typeString(x)));
  }
  Ints out = x.shape;
  out[axis] = state->k;
  expectOutput("TopK", setup.outputs[0], x.dtype, out);
  expectOutput("TopK", setup.outputs[1], DType::kI64, out);
  state->outer = product(x.shape, 0, axis);
  state->axis_dim = x.shape[axis];
  state->inner = product(x.shape, axis + 1, x.shape.size());
  state->largest = setup.params.getInt("largest", 1) != 0;
  withNumericType(x.dtype, [&](auto tag) { state->loop = &topKLoop<typename decltype(tag)::type>; });
  if (state->loop == nullptr) throw UsageError(fmt::format("TopK: no kernel for {} data", dtypeName(x.dtype)));
  return state;
}

void runTopK(const KernelCall& call) {
  const auto& s = static_cast<const TopKState&>(*call.state);
  if (s.outer == 0 || s.inner == 0 || s.axis_dim == 0) return;  // empty: the outputs are too (k <= axis)
  s.loop(s, call.inputs[0].data, call.outputs[0].data, call.outputs[1].as<int64_t>());
}

// ------------------------------------------------------------------- OneHot

struct OneHotState final : KernelState {
  int64_t outer = 1, depth = 0, inner = 1;
  bool no_indices = false;  // outer or inner is 0 (the other may be 2^40: nothing to walk)
  DType index_dtype = DType::kI64;
  size_t element_size = 0;
};

std::unique_ptr<KernelState> prepareOneHot(const KernelSetup& setup) {
  expectCounts("OneHot", setup, 3, 3);
  const TensorInfo& indices = setup.inputs[0];
  const TensorInfo& depth = setup.inputs[1];
  const TensorInfo& values = setup.inputs[2];
  for (const TensorInfo* info : {&indices, &depth}) {
    if (!withNumericType(info->dtype, [](auto) {})) {
      throw UsageError(fmt::format("OneHot: indices and depth must be numeric, got {}", typeString(*info)));
    }
  }
  if (values.numElements() != 2 || values.shape.size() != 1) {
    throw UsageError(fmt::format("OneHot: values must be [off, on], got {}", typeString(values)));
  }
  refuseElementSize("OneHot", values.dtype);
  const size_t rank = indices.shape.size() + 1;
  const auto axis = static_cast<size_t>(normalizeAxis("OneHot", setup.params.getInt("axis", -1), rank));
  const TensorInfo& y = setup.outputs[0];
  if (y.shape.size() != rank) {
    throw UsageError(fmt::format("OneHot: output {} does not fit indices {}", typeString(y), typeString(indices)));
  }
  auto state = std::make_unique<OneHotState>();
  state->depth = y.shape[axis];
  if (const std::byte* bytes = constantInput(setup, 1)) {
    const int64_t given = indexOf(readNumber(bytes, depth.dtype, 0));
    if (given != state->depth) {
      throw UsageError(fmt::format("OneHot: depth is {} but the output {} has {}", given, typeString(y), state->depth));
    }
  }
  Ints out = indices.shape;
  out.insert(out.begin() + static_cast<std::ptrdiff_t>(axis), state->depth);
  expectOutput("OneHot", y, values.dtype, out);
  state->outer = product(indices.shape, 0, axis);
  state->inner = product(indices.shape, axis, indices.shape.size());
  state->no_indices = indices.numElements() == 0;
  state->index_dtype = indices.dtype;
  state->element_size = dtypeSize(values.dtype);
  return state;
}

void runOneHot(const KernelCall& call) {
  const auto& s = static_cast<const OneHotState&>(*call.state);
  std::array<std::byte, 8> off{}, on{};
  std::memcpy(off.data(), call.inputs[2].data, s.element_size);
  std::memcpy(on.data(), call.inputs[2].data + s.element_size, s.element_size);
  std::byte* y = call.outputs[0].data;
  fill(y, call.outputs[0].numElements(), s.element_size, off);
  if (s.no_indices) return;
  const std::byte* indices = call.inputs[0].data;
  for (int64_t o = 0; o < s.outer; ++o) {
    for (int64_t i = 0; i < s.inner; ++i) {
      int64_t index = indexOf(readNumber(indices, s.index_dtype, static_cast<uint64_t>(o * s.inner + i)));
      if (index < 0) index += s.depth;
      if (index < 0 || index >= s.depth) continue;
      std::memcpy(y + ((o * s.depth + index) * s.inner + i) * static_cast<int64_t>(s.element_size), on.data(),
                  s.element_size);
    }
  }
}

// -------------------------------------------------------------------- Range

struct RangeState final : KernelState {
  using Loop = void (*)(const std::byte* start, const std::byte* delta, std::byte* y, int64_t n);
  Loop loop = nullptr;
};

template <typename T>
void rangeLoop(const std::byte* start_bytes, const std::byte* delta_bytes, std::byte* y_bytes, int64_t n) {
  using A = Arith<T>;
  T start, delta;
  std::memcpy(&start, start_bytes, sizeof start);
  std::memcpy(&delta, delta_bytes, sizeof delta);
  T* y = reinterpret_cast<T*>(y_bytes);
  if constexpr (std::is_integral_v<T>) {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(start + static_cast<T>(i) * delta);
  } else {
    // As numpy's arange: start + i * delta, in double.
    const double s = static_cast<double>(A::load(start)), d = static_cast<double>(A::load(delta));
    for (int64_t i = 0; i < n; ++i) {
      y[i] = A::store(static_cast<typename A::Acc>(s + static_cast<double>(i) * d));
    }
  }
}

std::unique_ptr<KernelState> prepareRange(const KernelSetup& setup) {
  expectCounts("Range", setup, 3, 3);
  const DType dtype = setup.inputs[0].dtype;
  for (size_t i = 0; i < 3; ++i) {
    if (setup.inputs[i].dtype != dtype || setup.inputs[i].numElements() != 1) {
      throw UsageError(fmt::format("Range: start, limit and delta must be scalars of one type, input {} is {}", i,
                                   typeString(setup.inputs[i])));
    }
  }
  const TensorInfo& y = setup.outputs[0];
  if (y.dtype != dtype || y.shape.size() != 1) {
    throw UsageError(fmt::format("Range: output {} must be a 1-D {} tensor", typeString(y), dtypeName(dtype)));
  }
  auto state = std::make_unique<RangeState>();
  withNumericType(dtype, [&](auto tag) { state->loop = &rangeLoop<typename decltype(tag)::type>; });
  if (state->loop == nullptr) throw UsageError(fmt::format("Range: no kernel for {}", dtypeName(dtype)));
  return state;
}

void runRange(const KernelCall& call) {
  const auto& s = static_cast<const RangeState&>(*call.state);
  s.loop(call.inputs[0].data, call.inputs[2].data, call.outputs[0].data, call.outputs[0].dims[0]);
}

// ------------------------------------------------------------------ EyeLike

struct EyeLikeState final : KernelState {
  int64_t rows = 0, columns = 0, k = 0;
  size_t element_size = 0;
  std::array<std::byte, 8> one{};
};

std::unique_ptr<KernelState> prepareEyeLike(const KernelSetup& setup) {
  expectCounts("EyeLike", setup, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  if (x.shape.size() != 2) throw UsageError(fmt::format("EyeLike: needs a 2-D input, got {}", typeString(x)));
  refuseElementSize("EyeLike", y.dtype);
  expectOutput("EyeLike", y, y.dtype, x.shape);
  auto state = std::make_unique<EyeLikeState>();
  state->rows = x.shape[0];
  state->columns = x.shape[1];
  state->k = setup.params.getInt("k", 0);
  state->element_size = dtypeSize(y.dtype);
  state->one = elementBytes(y.dtype, 1.0);
  return state;
}

void runEyeLike(const KernelCall& call) {
  const auto& s = static_cast<const EyeLikeState&>(*call.state);
  std::byte* y = call.outputs[0].data;
  std::memset(y, 0, static_cast<size_t>(s.rows * s.columns) * s.element_size);
  for (int64_t i = 0; i < s.rows; ++i) {
    const int64_t j = i + s.k;
    if (j >= 0 && j < s.columns) {
      std::memcpy(y + (i * s.columns + j) * static_cast<int64_t>(s.element_size), s.one.data(), s.element_size);
    }
  }
}

// ------------------------------------------------ DepthToSpace, SpaceToDepth

// A permutation of a 6-D view of the input: output element (o0..o5) reads
// input offset sum(o_d * strides[d]).
struct PermuteState final : KernelState {
  std::array<int64_t, 6> dims{};
  std::array<int64_t, 6> strides{};
  size_t element_size = 0;
};

template <typename T>
void permuteLoop(const PermuteState& s, const T* x, T* y) {
  const auto& n = s.dims;
  const auto& st = s.strides;
  // Empty: nothing to do, and the outer loops must not count through the
  // other dimensions (a crafted blocksize makes them 2^62 long).
  if (std::find(n.begin(), n.end(), 0) != n.end()) return;
  for (int64_t a = 0; a < n[0]; ++a) {
    for (int64_t b = 0; b < n[1]; ++b) {
      for (int64_t c = 0; c < n[2]; ++c) {
        for (int64_t d = 0; d < n[3]; ++d) {
          for (int64_t e = 0; e < n[4]; ++e) {
            const T* row = x + a * st[0] + b * st[1] + c * st[2] + d * st[3] + e * st[4];
            for (int64_t f = 0; f < n[5]; ++f) *y++ = row[f * st[5]];
          }
        }
      }
    }
  }
}

// `view`: the input's 6-D shape; `perm`: which view axis each output axis is.
std::unique_ptr<KernelState> planPermute(const std::array<int64_t, 6>& view, const std::array<int, 6>& perm,
                                         size_t element_size) {
  std::array<int64_t, 6> strides{};
  int64_t stride = 1;
  for (size_t d = 6; d-- > 0;) {
    strides[d] = stride;
    stride = wrapMul(stride, view[d]);  // past int64 only when empty (unused then)
  }
  auto state = std::make_unique<PermuteState>();
  for (size_t d = 0; d < 6; ++d) {
    state->dims[d] = view[static_cast<size_t>(perm[d])];
    state->strides[d] = strides[static_cast<size_t>(perm[d])];
  }
  state->element_size = element_size;
  return state;
}

void runPermute(const KernelCall& call) {
  const auto& s = static_cast<const PermuteState&>(*call.state);
  withElementSize(s.element_size, [&](auto t) {
    using T = decltype(t);
    permuteLoop<T>(s, call.inputs[0].as<const T>(), call.outputs[0].as<T>());
  });
}

std::unique_ptr<KernelState> prepareDepthSpace(std::string_view op, const KernelSetup& setup, bool to_space) {
  expectCounts(op, setup, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  refuseElementSize(op, x.dtype);
  if (x.shape.size() != 4) throw UsageError(fmt::format("{}: needs a 4-D input [N, C, H, W], got {}", op, typeString(x)));
  const int64_t b = setup.params.getInt("blocksize", 0);
  if (b <= 0) throw UsageError(fmt::format("{}: needs a positive blocksize, got {}", op, b));
  const int64_t n = x.shape[0], c = x.shape[1], h = x.shape[2], w = x.shape[3];
  const size_t size = dtypeSize(x.dtype);
  if (to_space) {
    if (c % (b * b) != 0) throw UsageError(fmt::format("{}: channels of {} do not divide by {}", op, typeString(x), b * b));
    expectOutput(op, setup.outputs[0], x.dtype, {n, c / (b * b), h * b, w * b});
    const std::string mode = setup.params.getString("mode", "DCR");
    if (mode == "DCR") return planPermute({n, b, b, c / (b * b), h, w}, {0, 3, 4, 1, 5, 2}, size);
    if (mode == "CRD") return planPermute({n, c / (b * b), b, b, h, w}, {0, 1, 4, 2, 5, 3}, size);
    throw UsageError(fmt::format("{}: mode '{}' is not DCR or CRD", op, mode));
  }
  if (h % b != 0 || w % b != 0) {
    throw UsageError(fmt::format("{}: height and width of {} do not divide by {}", op, typeString(x), b));
  }
  expectOutput(op, setup.outputs[0], x.dtype, {n, c * b * b, h / b, w / b});
  const std::string mode = setup.params.getString("mode", "DCR");  // an attribute from opset 28
  if (mode == "DCR") return planPermute({n, c, h / b, b, w / b, b}, {0, 3, 5, 1, 2, 4}, size);
  if (mode == "CRD") return planPermute({n, c, h / b, b, w / b, b}, {0, 1, 3, 5, 2, 4}, size);
  throw UsageError(fmt::format("{}: mode '{}' is not DCR or CRD", op, mode));
}

std::unique_ptr<KernelState> prepareDepthToSpace(const KernelSetup& setup) {
  return prepareDepthSpace("DepthToSpace", setup, true);
}
std::unique_ptr<KernelState> prepareSpaceToDepth(const KernelSetup& setup) {
  return prepareDepthSpace("SpaceToDepth", setup, false);
}

// ---------------------------------------------------------- ReverseSequence

struct ReverseSequenceState final : KernelState {
  int64_t time = 0, batch = 0;
  int64_t time_stride = 0, batch_stride = 0;  // in bytes
  int64_t inner_bytes = 0;                    // one (time, batch) entry
  DType lens_dtype = DType::kI64;
  uint64_t bytes = 0;
};

std::unique_ptr<KernelState> prepareReverseSequence(const KernelSetup& setup) {
  expectCounts("ReverseSequence", setup, 2, 2);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& lens = setup.inputs[1];
  expectIndexType("ReverseSequence", lens, "sequence_lens");
  if (x.shape.size() < 2 || dtypeSize(x.dtype) == 0) {
    throw UsageError(fmt::format("ReverseSequence: needs an input of rank 2 or more, got {}", typeString(x)));
  }
  const int64_t batch_axis = setup.params.getInt("batch_axis", 1);
  const int64_t time_axis = setup.params.getInt("time_axis", 0);
  if ((batch_axis != 0 && batch_axis != 1) || (time_axis != 0 && time_axis != 1) || batch_axis == time_axis) {
    throw UsageError(fmt::format("ReverseSequence: batch_axis {} and time_axis {} must be 0 and 1", batch_axis,
                                 time_axis));
  }
  auto state = std::make_unique<ReverseSequenceState>();
  state->inner_bytes = product(x.shape, 2, x.shape.size()) * static_cast<int64_t>(dtypeSize(x.dtype));
  state->time = x.shape[static_cast<size_t>(time_axis)];
  state->batch = x.shape[static_cast<size_t>(batch_axis)];
  const int64_t second = x.shape[1] * state->inner_bytes;  // stride of axis 0
  state->time_stride = time_axis == 0 ? second : state->inner_bytes;
  state->batch_stride = batch_axis == 0 ? second : state->inner_bytes;
  if (lens.shape != Ints{state->batch}) {
    throw UsageError(fmt::format("ReverseSequence: sequence_lens {} must hold one length per batch entry of {}",
                                 typeString(lens), typeString(x)));
  }
  state->lens_dtype = lens.dtype;
  state->bytes = x.sizeInBytes();
  expectOutput("ReverseSequence", setup.outputs[0], x.dtype, x.shape);
  return state;
}

void runReverseSequence(const KernelCall& call) {
  const auto& s = static_cast<const ReverseSequenceState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  copyInput(call, 0, s.bytes);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int64_t len = std::clamp<int64_t>(readInt(call.inputs[1].data, s.lens_dtype, static_cast<uint64_t>(b)), 0, s.time);
    for (int64_t t = 0; t < len; ++t) {
      std::memcpy(y + b * s.batch_stride + t * s.time_stride, x + b * s.batch_stride + (len - 1 - t) * s.time_stride,
                  static_cast<size_t>(s.inner_bytes));
    }
  }
}

// ---------------------------------------------------------- CumSum, CumProd

struct CumulativeState final : KernelState {
  using Loop = void (*)(const CumulativeState& s, int64_t axis, const std::byte* x, std::byte* y);
  Loop loop = nullptr;
  Ints shape;
  int64_t axis = 0;
  bool axis_at_run = false;
  DType axis_dtype = DType::kI64;
  bool exclusive = false, reverse = false;
};

template <typename T, bool kProduct>
void cumulativeLoop(const CumulativeState& s, int64_t axis, const std::byte* x_bytes, std::byte* y_bytes) {
  using A = Arith<T>;
  using Acc = typename A::Acc;
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  const auto a = static_cast<size_t>(axis);
  const int64_t outer = product(s.shape, 0, a), n = s.shape[a], inner = product(s.shape, a + 1, s.shape.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      Acc acc = kProduct ? Acc(1) : Acc(0);
      for (int64_t step = 0; step < n; ++step) {
        const int64_t j = s.reverse ? n - 1 - step : step;
        const int64_t at = (o * n + j) * inner + i;
        const Acc v = A::load(x[at]);
        // Integers wrap, as the elementwise kernels do (never C++'s undefined overflow).
        auto next = [&] {
          if constexpr (std::is_integral_v<Acc>) {
            return kProduct ? wrapMul(acc, v) : wrapAdd(acc, v);
          } else {
            return static_cast<Acc>(kProduct ? acc * v : acc + v);
          }
        };
        if (s.exclusive) {
          y[at] = A::store(acc);
          acc = next();
        } else {
          acc = next();
          y[at] = A::store(acc);
        }
      }
    }
  }
}

template <bool kProduct>
std::unique_ptr<KernelState> prepareCumulative(const KernelSetup& setup) {
  constexpr std::string_view op = kProduct ? "CumProd" : "CumSum";
  expectCounts(op, setup, 2, 2);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& axis = setup.inputs[1];
  expectIndexType(op, axis, "axis");
  if (axis.numElements() != 1 || axis.shape.size() > 1) {
    throw UsageError(fmt::format("{}: axis must be one value, got {}", op, typeString(axis)));
  }
  if (x.shape.empty()) throw UsageError(fmt::format("{}: needs rank 1 or more, got {}", op, typeString(x)));
  auto state = std::make_unique<CumulativeState>();
  state->shape = x.shape;
  state->axis_dtype = axis.dtype;
  if (const std::byte* bytes = constantInput(setup, 1)) {
    state->axis = normalizeAxis(op, readInt(bytes, axis.dtype, 0), x.shape.size());
  } else {
    state->axis_at_run = true;
  }
  state->exclusive = setup.params.getInt("exclusive", 0) != 0;
  state->reverse = setup.params.getInt("reverse", 0) != 0;
  withNumericType(x.dtype, [&](auto tag) { state->loop = &cumulativeLoop<typename decltype(tag)::type, kProduct>; });
  if (state->loop == nullptr) throw UsageError(fmt::format("{}: no kernel for {} data", op, dtypeName(x.dtype)));
  expectOutput(op, setup.outputs[0], x.dtype, x.shape);
  return state;
}

void runCumulative(const KernelCall& call) {
  const auto& s = static_cast<const CumulativeState&>(*call.state);
  // An empty tensor has nothing to scan, and the products of its other
  // dimensions may be vast (the loop over them ran for hours: fuzz find).
  if (std::find(s.shape.begin(), s.shape.end(), 0) != s.shape.end()) return;
  int64_t axis = s.axis;
  if (s.axis_at_run) {
    const auto rank = static_cast<int64_t>(s.shape.size());
    axis = readInt(call.inputs[1].data, s.axis_dtype, 0);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) return;  // invalid: run cannot throw
  }
  s.loop(s, axis, call.inputs[0].data, call.outputs[0].data);
}

// ------------------------------------------------------------ CenterCropPad

// Copies the region the input and output share, centred, into a zeroed output.
struct CenterCropPadState final : KernelState {
  uint32_t rank = 0;
  std::array<int64_t, kMaxRank> count{};  // the shared region
  std::array<int64_t, kMaxRank> in_strides{}, out_strides{};
  int64_t in_offset = 0, out_offset = 0;  // elements
  size_t element_size = 0;
  uint64_t out_bytes = 0;
  bool padded = false;
};

std::unique_ptr<KernelState> prepareCenterCropPad(const KernelSetup& setup) {
  expectCounts("CenterCropPad", setup, 2, 2);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  refuseElementSize("CenterCropPad", x.dtype);
  if (y.dtype != x.dtype || y.shape.size() != x.shape.size() || x.shape.empty()) {
    throw UsageError(fmt::format("CenterCropPad: output {} does not match input {}", typeString(y), typeString(x)));
  }
  expectIndexType("CenterCropPad", setup.inputs[1], "shape");
  auto state = std::make_unique<CenterCropPadState>();
  state->rank = static_cast<uint32_t>(x.shape.size());
  const Ints in_strides = stridesOf(x.shape), out_strides = stridesOf(y.shape);
  for (size_t d = 0; d < x.shape.size(); ++d) {
    const int64_t in = x.shape[d], out = y.shape[d];
    state->count[d] = std::min(in, out);
    state->in_strides[d] = in_strides[d];
    state->out_strides[d] = out_strides[d];
    if (in > out) state->in_offset += (in - out) / 2 * in_strides[d];
    if (out > in) {
      state->out_offset += (out - in) / 2 * out_strides[d];
      state->padded = true;
    }
  }
  state->element_size = dtypeSize(x.dtype);
  state->out_bytes = y.sizeInBytes();
  return state;
}

void runCenterCropPad(const KernelCall& call) {
  const auto& s = static_cast<const CenterCropPadState&>(*call.state);
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  if (s.padded) std::memset(y, 0, s.out_bytes);
  int64_t rows = 1;
  for (uint32_t d = 0; d + 1 < s.rank; ++d) rows *= s.count[d];
  if (rows == 0 || s.count[s.rank - 1] == 0) return;
  const auto size = static_cast<int64_t>(s.element_size);
  const auto row_bytes = static_cast<size_t>(s.count[s.rank - 1] * size);
  std::array<int64_t, kMaxRank> coord{};
  int64_t in = s.in_offset, out = s.out_offset;
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(y + out * size, x + in * size, row_bytes);
    for (uint32_t d = s.rank - 1; d-- > 0;) {
      in += s.in_strides[d];
      out += s.out_strides[d];
      if (++coord[d] < s.count[d]) break;
      in -= s.in_strides[d] * s.count[d];
      out -= s.out_strides[d] * s.count[d];
      coord[d] = 0;
    }
  }
}

// ------------------------------------------------------------------- Col2Im

// Sums blocks of columns back into an image: column (c, k, l) of the input,
// k the position inside the block and l the block's position, adds into
// image pixel l * stride - pad_begin + k * dilation. The image shape is the
// output's; a block_shape that is not a constant is read at run, where one
// that does not fit the input gives zeros.
struct Col2ImGeometry {
  std::array<int64_t, kMaxRank> block{}, grid{};  // grid: block positions per axis
};

struct Col2ImState final : KernelState {
  using Loop = void (*)(const Col2ImState& s, const Col2ImGeometry& g, const std::byte* x, std::byte* y);
  Loop loop = nullptr;
  size_t spatial = 0;
  int64_t batch = 0, channels = 0;
  std::array<int64_t, kMaxRank> image{}, strides{}, dilations{};
  std::array<int64_t, 2 * kMaxRank> all_pads{};  // the begin pads, then the end pads
  int64_t block_size = 1, grid_size = 1, image_size = 1;
  Col2ImGeometry geometry;  // when block_shape is a constant
  bool block_at_run = false;
  DType block_dtype = DType::kI64;
};

// The block positions per axis for `block`; false when they do not fit.
bool col2ImGeometry(const Col2ImState& s, Col2ImGeometry& g) {
  int64_t block_size = 1, grid_size = 1;
  for (size_t d = 0; d < s.spatial; ++d) {
    const int64_t extent = s.dilations[d] * (g.block[d] - 1) + 1;
    const int64_t room = s.image[d] + s.all_pads[d] + s.all_pads[d + s.spatial] - extent;
    if (g.block[d] < 1 || room < 0) return false;
    g.grid[d] = room / s.strides[d] + 1;
    block_size *= g.block[d];
    grid_size *= g.grid[d];
  }
  return block_size == s.block_size && grid_size == s.grid_size;
}

template <typename T>
void col2ImLoop(const Col2ImState& s, const Col2ImGeometry& g, const std::byte* x_bytes, std::byte* y_bytes) {
  using A = Arith<T>;
  using Acc = typename A::Acc;
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  const size_t n = s.spatial;
  thread_local std::vector<Acc> image;
  if (image.size() < static_cast<size_t>(s.image_size)) image.resize(static_cast<size_t>(s.image_size));
  std::array<int64_t, kMaxRank> k{}, l{};
  for (int64_t plane = 0; plane < s.batch * s.channels; ++plane) {
    std::fill_n(image.begin(), s.image_size, Acc(0));
    const T* columns = x + plane * s.block_size * s.grid_size;
    std::fill(k.begin(), k.end(), 0);
    for (int64_t kb = 0; kb < s.block_size; ++kb) {
      std::fill(l.begin(), l.end(), 0);
      for (int64_t lb = 0; lb < s.grid_size; ++lb) {
        int64_t pixel = 0;
        bool inside = true;
        for (size_t d = 0; d < n; ++d) {
          const int64_t at = l[d] * s.strides[d] - s.all_pads[d] + k[d] * s.dilations[d];
          inside = inside && at >= 0 && at < s.image[d];
          pixel = pixel * s.image[d] + at;
        }
        if (inside) image[static_cast<size_t>(pixel)] += A::load(columns[kb * s.grid_size + lb]);
        for (size_t d = n; d-- > 0;) {
          if (++l[d] < g.grid[d]) break;
          l[d] = 0;
        }
      }
      for (size_t d = n; d-- > 0;) {
        if (++k[d] < g.block[d]) break;
        k[d] = 0;
      }
    }
    T* out = y + plane * s.image_size;
    for (int64_t i = 0; i < s.image_size; ++i) out[i] = A::store(image[static_cast<size_t>(i)]);
  }
}

std::unique_ptr<KernelState> prepareCol2Im(const KernelSetup& setup) {
  expectCounts("Col2Im", setup, 3, 3);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  if (x.shape.size() != 3) {
    throw UsageError(fmt::format("Col2Im: needs an input [N, C * prod(block_shape), L], got {}", typeString(x)));
  }
  expectIndexType("Col2Im", setup.inputs[1], "image_shape");
  expectIndexType("Col2Im", setup.inputs[2], "block_shape");
  auto state = std::make_unique<Col2ImState>();
  const size_t n = setup.inputs[2].numElements();
  if (n == 0 || n + 2 > kMaxRank || setup.inputs[1].numElements() != n || y.shape.size() != n + 2 || y.dtype != x.dtype) {
    throw UsageError(fmt::format("Col2Im: image_shape {}, block_shape {} and the output {} must have one spatial rank, "
                                 "1 to {}",
                                 typeString(setup.inputs[1]), typeString(setup.inputs[2]), typeString(y), kMaxRank - 2));
  }
  state->spatial = n;
  const Ints strides = setup.params.getInts("strides", Ints(n, 1));
  const Ints dilations = setup.params.getInts("dilations", Ints(n, 1));
  const Ints pads = setup.params.getInts("pads", Ints(2 * n, 0));
  if (strides.size() != n || dilations.size() != n || pads.size() != 2 * n) {
    throw UsageError(fmt::format("Col2Im: strides, dilations and pads must have {}, {} and {} values", n, n, 2 * n));
  }
  const std::byte* image_bytes = constantInput(setup, 1);
  for (size_t d = 0; d < n; ++d) {
    state->image[d] = y.shape[d + 2];
    if (image_bytes != nullptr && readInt(image_bytes, setup.inputs[1].dtype, d) != state->image[d]) {
      throw UsageError(fmt::format("Col2Im: image_shape disagrees with the output {}", typeString(y)));
    }
    if (strides[d] < 1 || dilations[d] < 1) throw UsageError("Col2Im: strides and dilations must be positive");
    state->strides[d] = strides[d];
    state->dilations[d] = dilations[d];
    state->all_pads[d] = pads[d];
    state->all_pads[d + n] = pads[d + n];
    state->image_size *= state->image[d];
  }
  state->batch = x.shape[0];
  state->channels = y.shape[1];
  if (y.shape[0] != x.shape[0] || state->channels == 0 || x.shape[1] % state->channels != 0) {
    throw UsageError(fmt::format("Col2Im: output {} does not fit input {}", typeString(y), typeString(x)));
  }
  state->block_size = x.shape[1] / state->channels;
  state->grid_size = x.shape[2];
  state->block_dtype = setup.inputs[2].dtype;
  if (const std::byte* block_bytes = constantInput(setup, 2)) {
    for (size_t d = 0; d < n; ++d) state->geometry.block[d] = readInt(block_bytes, state->block_dtype, d);
    if (!col2ImGeometry(*state, state->geometry)) {
      throw UsageError(fmt::format("Col2Im: block_shape does not fit input {} and output {} (with these strides, "
                                   "dilations and pads)",
                                   typeString(x), typeString(y)));
    }
  } else {
    state->block_at_run = true;
  }
  withFloatType(x.dtype, [&](auto tag) { state->loop = &col2ImLoop<typename decltype(tag)::type>; });
  if (state->loop == nullptr) throw UsageError(fmt::format("Col2Im: no kernel for {} data", dtypeName(x.dtype)));
  return state;
}

void runCol2Im(const KernelCall& call) {
  const auto& s = static_cast<const Col2ImState&>(*call.state);
  Col2ImGeometry geometry = s.geometry;
  if (s.block_at_run) {
    for (size_t d = 0; d < s.spatial; ++d) geometry.block[d] = readInt(call.inputs[2].data, s.block_dtype, d);
    if (!col2ImGeometry(s, geometry)) {
      std::memset(call.outputs[0].data, 0, call.outputs[0].numElements() * dtypeSize(call.outputs[0].dtype));
      return;
    }
  }
  s.loop(s, geometry, call.inputs[0].data, call.outputs[0].data);
}

// ---------------------------------------------------------------- MaxUnpool

// The indices are flat positions in the tensor that MaxPool read, of the
// shape the attributes give back; an output_shape larger than that holds it
// in its leading corner, zeros around (as ONNX's reference does).
struct MaxUnpoolState final : KernelState {
  uint32_t rank = 0;
  std::array<int64_t, kMaxRank> unpooled{};     // the shape the indices address
  std::array<int64_t, kMaxRank> out_strides{};  // of the output, elements
  uint64_t count = 0;
  uint64_t out_count = 0;
  bool same = true;  // unpooled == the output shape
  size_t element_size = 0;
};

std::unique_ptr<KernelState> prepareMaxUnpool(const KernelSetup& setup) {
  expectCounts("MaxUnpool", setup, 2, 3);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& indices = setup.inputs[1];
  const TensorInfo& y = setup.outputs[0];
  refuseElementSize("MaxUnpool", x.dtype);
  if (indices.dtype != DType::kI64 || indices.shape != x.shape) {
    throw UsageError(fmt::format("MaxUnpool: indices must be i64 of the input's shape {}, got {}", typeString(x),
                                 typeString(indices)));
  }
  const size_t rank = x.shape.size();
  if (rank < 3 || y.dtype != x.dtype || y.shape.size() != rank || y.shape[0] != x.shape[0] ||
      y.shape[1] != x.shape[1]) {
    throw UsageError(fmt::format("MaxUnpool: output {} does not fit input {}", typeString(y), typeString(x)));
  }
  const size_t n = rank - 2;
  const Ints kernel = setup.params.getInts("kernel_shape", {});
  const Ints strides = setup.params.getInts("strides", Ints(n, 1));
  const Ints pads = setup.params.getInts("pads", Ints(2 * n, 0));
  if (kernel.size() != n || strides.size() != n || pads.size() != 2 * n) {
    throw UsageError(fmt::format("MaxUnpool: kernel_shape, strides and pads must have {}, {} and {} values", n, n, 2 * n));
  }
  auto state = std::make_unique<MaxUnpoolState>();
  state->rank = static_cast<uint32_t>(rank);
  const Ints out_strides = stridesOf(y.shape);
  for (size_t d = 0; d < rank; ++d) {
    const size_t s = d - 2;
    state->unpooled[d] = d < 2 ? x.shape[d] : (x.shape[d] - 1) * strides[s] - pads[s] - pads[s + n] + kernel[s];
    if (state->unpooled[d] > y.shape[d]) {
      throw UsageError(fmt::format("MaxUnpool: output {} is smaller than the unpooled shape along axis {} ({})",
                                   typeString(y), d, state->unpooled[d]));
    }
    state->same = state->same && state->unpooled[d] == y.shape[d];
    state->out_strides[d] = out_strides[d];
  }
  state->count = x.numElements();
  state->out_count = y.numElements();
  state->element_size = dtypeSize(x.dtype);
  return state;
}

void runMaxUnpool(const KernelCall& call) {
  const auto& s = static_cast<const MaxUnpoolState&>(*call.state);
  std::byte* y = call.outputs[0].data;
  std::memset(y, 0, s.out_count * s.element_size);
  const std::byte* x = call.inputs[0].data;
  const int64_t* indices = call.inputs[1].as<const int64_t>();
  uint64_t unpooled_count = 1;
  for (uint32_t d = 0; d < s.rank; ++d) unpooled_count *= static_cast<uint64_t>(s.unpooled[d]);
  for (uint64_t i = 0; i < s.count; ++i) {
    int64_t at = indices[i];
    if (at < 0 || static_cast<uint64_t>(at) >= unpooled_count) continue;
    if (!s.same) {
      int64_t rest = at;
      at = 0;
      for (uint32_t d = s.rank; d-- > 0;) {
        at += (rest % s.unpooled[d]) * s.out_strides[d];
        rest /= s.unpooled[d];
      }
    }
    std::memcpy(y + static_cast<uint64_t>(at) * s.element_size, x + i * s.element_size, s.element_size);
  }
}

// ------------------------------------------------------------------ BitCast

struct CopyState final : KernelState {
  uint64_t bytes = 0;
};

std::unique_ptr<KernelState> prepareBitCast(const KernelSetup& setup) {
  expectCounts("BitCast", setup, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  if (dtypeSize(y.dtype) != dtypeSize(x.dtype) || y.shape != x.shape || dtypeSize(x.dtype) == 0) {
    throw UsageError(fmt::format("BitCast: cannot reinterpret {} as {}", typeString(x), typeString(y)));
  }
  auto state = std::make_unique<CopyState>();
  state->bytes = x.sizeInBytes();
  return state;
}

void runBitCast(const KernelCall& call) {
  copyInput(call, 0, static_cast<const CopyState&>(*call.state).bytes);
}

// ------------------------------------------------------------------- Einsum

// Every label of the equation, the ellipsis's dimensions included, gets an
// axis of one iteration space: the output's labels first, then the summed
// ones. Each operand walks it with a stride per axis (0 where it lacks the
// label; a repeated label, a diagonal, adds its strides).
struct EinsumState final : KernelState {
  using Loop = void (*)(const EinsumState& s, const KernelCall& call);
  Loop loop = nullptr;
  size_t out_axes = 0;  // the leading axes of the space
  Ints sizes;           // per axis
  std::vector<Ints> strides;  // per input, per axis
  int64_t out_count = 1, sum_count = 1;
};

template <typename T>
void einsumLoop(const EinsumState& s, const KernelCall& call) {
  using A = Arith<T>;
  using Acc = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_floating_point_v<typename A::Acc>, double,
                                                    typename A::Acc>>;
  const size_t inputs = s.strides.size();
  const size_t axes = s.sizes.size();
  T* y = call.outputs[0].as<T>();
  std::array<const T*, 64> x{};
  for (size_t i = 0; i < inputs; ++i) x[i] = call.inputs[i].as<const T>();
  std::array<int64_t, 64> offsets{};  // per input, of the current output element
  std::array<int64_t, 2 * kMaxRank * 4> coord{};
  for (int64_t o = 0; o < s.out_count; ++o) {
    Acc acc = 0;
    std::array<int64_t, 64> at = offsets;
    for (size_t d = s.out_axes; d < axes; ++d) coord[d] = 0;
    for (int64_t r = 0; r < s.sum_count; ++r) {
      Acc term = 1;
      for (size_t i = 0; i < inputs; ++i) term *= static_cast<Acc>(A::load(x[i][at[i]]));
      acc += term;
      for (size_t d = axes; d-- > s.out_axes;) {
        for (size_t i = 0; i < inputs; ++i) at[i] += s.strides[i][d];
        if (++coord[d] < s.sizes[d]) break;
        for (size_t i = 0; i < inputs; ++i) at[i] -= s.strides[i][d] * s.sizes[d];
        coord[d] = 0;
      }
    }
    y[o] = A::store(static_cast<typename A::Acc>(acc));
    for (size_t d = s.out_axes; d-- > 0;) {
      for (size_t i = 0; i < inputs; ++i) offsets[i] += s.strides[i][d];
      if (++coord[d] < s.sizes[d]) break;
      for (size_t i = 0; i < inputs; ++i) offsets[i] -= s.strides[i][d] * s.sizes[d];
      coord[d] = 0;
    }
  }
}

// One term of the equation: its labels, '.' for the ellipsis.
std::string einsumTerm(const std::string& term) {
  std::string out;
  for (size_t i = 0; i < term.size(); ++i) {
    const char c = term[i];
    if (c == ' ') continue;
    if (c == '.' && term.compare(i, 3, "...") == 0 && out.find('.') == std::string::npos) {
      out.push_back('.');
      i += 2;
    } else if (std::isalpha(static_cast<unsigned char>(c))) {
      out.push_back(c);
    } else {
      throw UsageError(fmt::format("Einsum: cannot read the term '{}'", term));
    }
  }
  return out;
}

std::unique_ptr<KernelState> prepareEinsum(const KernelSetup& setup) {
  if (setup.inputs.empty() || setup.inputs.size() > 64) throw UsageError("Einsum: expects 1 to 64 inputs");
  expectCounts("Einsum", setup, setup.inputs.size(), setup.inputs.size());
  const DType dtype = setup.inputs[0].dtype;
  const std::string equation = setup.params.getString("equation", "");
  const size_t arrow = equation.find("->");
  std::vector<std::string> terms;
  const std::string lhs = equation.substr(0, arrow);
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(einsumTerm(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != setup.inputs.size()) {
    throw UsageError(fmt::format("Einsum: '{}' has {} terms for {} inputs", equation, terms.size(), setup.inputs.size()));
  }
  // Labels -> sizes; the ellipsis's dimensions become labels 0, 1, ... (as
  // many as the widest ellipsis, aligned right and broadcast).
  std::map<char, int64_t> sizes;
  size_t ellipsis_rank = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const bool has = terms[i].find('.') != std::string::npos;
    const size_t labels = terms[i].size() - (has ? 1 : 0);
    const size_t rank = setup.inputs[i].shape.size();
    if (setup.inputs[i].dtype != dtype || (has ? rank < labels : rank != labels)) {
      throw UsageError(fmt::format("Einsum: term '{}' does not fit input {} {}", terms[i], i,
                                   typeString(setup.inputs[i])));
    }
    if (has) ellipsis_rank = std::max(ellipsis_rank, rank - labels);
  }
  // Expanded terms: one label per dimension; ellipsis labels are '0' + k
  // counted from the left of the widest ellipsis.
  std::vector<std::string> expanded(terms.size());
  for (size_t i = 0; i < terms.size(); ++i) {
    const size_t rank = setup.inputs[i].shape.size();
    const bool has = terms[i].find('.') != std::string::npos;
    const size_t broadcast = has ? rank - (terms[i].size() - 1) : 0;
    for (char c : terms[i]) {
      if (c != '.') {
        expanded[i].push_back(c);
        continue;
      }
      for (size_t k = 0; k < broadcast; ++k) expanded[i].push_back(static_cast<char>('0' + (ellipsis_rank - broadcast + k)));
    }
    for (size_t d = 0; d < rank; ++d) {
      const char label = expanded[i][d];
      const int64_t size = setup.inputs[i].shape[d];
      auto [it, inserted] = sizes.emplace(label, size);
      if (inserted || it->second == size) continue;
      if (it->second == 1 && std::isdigit(static_cast<unsigned char>(label))) {
        it->second = size;
      } else if (!(size == 1 && std::isdigit(static_cast<unsigned char>(label)))) {
        throw UsageError(fmt::format("Einsum: label '{}' has sizes {} and {}", label, it->second, size));
      }
    }
  }
  std::string output;
  if (arrow != std::string::npos) {
    for (char c : einsumTerm(equation.substr(arrow + 2))) {
      if (c != '.') {
        output.push_back(c);
        continue;
      }
      for (size_t k = 0; k < ellipsis_rank; ++k) output.push_back(static_cast<char>('0' + k));
    }
  } else {
    for (size_t k = 0; k < ellipsis_rank; ++k) output.push_back(static_cast<char>('0' + k));
    std::map<char, int> counts;
    for (const std::string& term : terms) {
      for (char c : term) {
        if (c != '.') ++counts[c];
      }
    }
    for (const auto& [label, count] : counts) {
      if (count == 1) output.push_back(label);
    }
  }
  auto state = std::make_unique<EinsumState>();
  std::string order = output;
  for (const auto& [label, size] : sizes) {
    if (order.find(label) == std::string::npos) order.push_back(label);
  }
  Ints out_shape;
  for (size_t d = 0; d < order.size(); ++d) {
    const auto it = sizes.find(order[d]);
    if (it == sizes.end()) throw UsageError(fmt::format("Einsum: output label '{}' is in no input", order[d]));
    state->sizes.push_back(it->second);
    if (d < output.size()) {
      out_shape.push_back(it->second);
      state->out_count *= it->second;
    } else {
      state->sum_count *= it->second;
    }
  }
  state->out_axes = output.size();
  if (order.size() > 2 * kMaxRank * 4) throw UsageError("Einsum: too many labels");
  for (size_t i = 0; i < terms.size(); ++i) {
    const Ints strides = stridesOf(setup.inputs[i].shape);
    Ints walk(order.size(), 0);
    for (size_t d = 0; d < expanded[i].size(); ++d) {
      if (setup.inputs[i].shape[d] == 1) continue;  // broadcast
      walk[order.find(expanded[i][d])] += strides[d];
    }
    state->strides.push_back(walk);
  }
  expectOutput("Einsum", setup.outputs[0], dtype, out_shape);
  withNumericType(dtype, [&](auto tag) { state->loop = &einsumLoop<typename decltype(tag)::type>; });
  if (state->loop == nullptr) throw UsageError(fmt::format("Einsum: no kernel for {} data", dtypeName(dtype)));
  return state;
}

void runEinsum(const KernelCall& call) {
  const auto& s = static_cast<const EinsumState&>(*call.state);
  s.loop(s, call);
}

// ---------------------------------------------------------------------- Det

struct DetState final : KernelState {
  using Loop = void (*)(const DetState& s, const std::byte* x, std::byte* y);
  Loop loop = nullptr;
  int64_t matrices = 1, n = 0;
};

// LU decomposition with partial pivoting, in double.
template <typename T>
void detLoop(const DetState& s, const std::byte* x_bytes, std::byte* y_bytes) {
  using A = Arith<T>;
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  const int64_t n = s.n;
  thread_local std::vector<double> a;
  if (a.size() < static_cast<size_t>(n * n)) a.resize(static_cast<size_t>(n * n));
  for (int64_t m = 0; m < s.matrices; ++m) {
    for (int64_t i = 0; i < n * n; ++i) a[static_cast<size_t>(i)] = static_cast<double>(A::load(x[m * n * n + i]));
    double det = 1;
    for (int64_t c = 0; c < n && det != 0; ++c) {
      int64_t pivot = c;
      for (int64_t r = c + 1; r < n; ++r) {
        if (std::abs(a[static_cast<size_t>(r * n + c)]) > std::abs(a[static_cast<size_t>(pivot * n + c)])) pivot = r;
      }
      if (a[static_cast<size_t>(pivot * n + c)] == 0) {
        det = 0;
        break;
      }
      if (pivot != c) {
        for (int64_t j = 0; j < n; ++j) std::swap(a[static_cast<size_t>(c * n + j)], a[static_cast<size_t>(pivot * n + j)]);
        det = -det;
      }
      const double p = a[static_cast<size_t>(c * n + c)];
      det *= p;
      for (int64_t r = c + 1; r < n; ++r) {
        const double f = a[static_cast<size_t>(r * n + c)] / p;
        for (int64_t j = c; j < n; ++j) a[static_cast<size_t>(r * n + j)] -= f * a[static_cast<size_t>(c * n + j)];
      }
    }
    y[m] = A::store(static_cast<typename A::Acc>(det));
  }
}

std::unique_ptr<KernelState> prepareDet(const KernelSetup& setup) {
  expectCounts("Det", setup, 1, 1);
  const TensorInfo& x = setup.inputs[0];
  const size_t rank = x.shape.size();
  if (rank < 2 || x.shape[rank - 1] != x.shape[rank - 2]) {
    throw UsageError(fmt::format("Det: needs square matrices [*, M, M], got {}", typeString(x)));
  }
  auto state = std::make_unique<DetState>();
  state->matrices = product(x.shape, 0, rank - 2);
  state->n = x.shape[rank - 1];
  withFloatType(x.dtype, [&](auto tag) { state->loop = &detLoop<typename decltype(tag)::type>; });
  if (state->loop == nullptr) throw UsageError(fmt::format("Det: no kernel for {} data", dtypeName(x.dtype)));
  expectOutput("Det", setup.outputs[0], x.dtype, Ints(x.shape.begin(), x.shape.end() - 2));
  return state;
}

void runDet(const KernelCall& call) {
  const auto& s = static_cast<const DetState&>(*call.state);
  s.loop(s, call.inputs[0].data, call.outputs[0].data);
}

}  // namespace

void registerIndexingKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Shape", &prepareShape, &runValues});
  registry.add(KernelDef{"Size", &prepareSize, &runValues});
  registry.add(KernelDef{"ConstantOfShape", &prepareConstantOfShape, &runFill});
  registry.add(KernelDef{"GatherElements", &prepareGatherElements, &runGatherElements});
  registry.add(KernelDef{"GatherND", &prepareGatherNd, &runGatherNd});
  registry.add(KernelDef{"Scatter", &prepareScatter, &runScatterElements});
  registry.add(KernelDef{"ScatterElements", &prepareScatterElements, &runScatterElements});
  registry.add(KernelDef{"ScatterND", &prepareScatterNd, &runScatterNd});
  registry.add(KernelDef{"TensorScatter", &prepareTensorScatter, &runTensorScatter});
  registry.add(KernelDef{"Trilu", &prepareTrilu, &runTrilu});
  registry.add(KernelDef{"TopK", &prepareTopK, &runTopK});
  registry.add(KernelDef{"OneHot", &prepareOneHot, &runOneHot});
  registry.add(KernelDef{"Range", &prepareRange, &runRange});
  registry.add(KernelDef{"EyeLike", &prepareEyeLike, &runEyeLike});
  registry.add(KernelDef{"DepthToSpace", &prepareDepthToSpace, &runPermute});
  registry.add(KernelDef{"SpaceToDepth", &prepareSpaceToDepth, &runPermute});
  registry.add(KernelDef{"ReverseSequence", &prepareReverseSequence, &runReverseSequence});
  registry.add(KernelDef{"CumSum", &prepareCumulative<false>, &runCumulative});
  registry.add(KernelDef{"CumProd", &prepareCumulative<true>, &runCumulative});
  registry.add(KernelDef{"CenterCropPad", &prepareCenterCropPad, &runCenterCropPad});
  registry.add(KernelDef{"Col2Im", &prepareCol2Im, &runCol2Im});
  registry.add(KernelDef{"MaxUnpool", &prepareMaxUnpool, &runMaxUnpool});
  registry.add(KernelDef{"BitCast", &prepareBitCast, &runBitCast});
  registry.add(KernelDef{"Einsum", &prepareEinsum, &runEinsum});
  registry.add(KernelDef{"Det", &prepareDet, &runDet});
}

}  // namespace kiln
