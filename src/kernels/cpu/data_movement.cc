// Data-movement CPU kernels with ONNX semantics: Transpose, Concat, Split,
// Slice, Gather, Expand, Where, Tile, Pad and Resize (Cast: cast.cc), and
// kiln.QLinearConcat, Concat of 8-bit data requantized on the way.
//
// Kernels that only move data move bytes, by element size (1, 2, 4 or 8), so
// they work for every element type. Most of them reduce to one plan, built at
// prepare: a strided copy (StridedCopy) that walks the output in order and
// reads the input through per-dimension strides (0 along a broadcast
// dimension, negative along a reversed one). Adjacent dimensions that the
// input walks as one merge, so the common cases come out as a single memcpy
// or a loop over rows. A transpose whose input innermost dimension is not the
// output's innermost runs as 2-D tiles, so that both sides stay in cache
// (transpose_tile.h).
//
// Inputs that give positions (Slice starts/ends, Pad pads, Resize scales)
// are read at prepare when they are constants; otherwise run reads them from
// the call (they are small) into fixed-size arrays, so run never allocates.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "core/wrapping_arithmetic.h"
#include "kiln/tensor_info.h"
#include "kernels/slice_positions.h"
#include "kernels/cpu/channels_last.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/resize_general.h"
#include "kernels/cpu/resize_tables.h"
#include "kernels/cpu/setup_helpers.h"
#include "kernels/cpu/transpose_tile.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

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

std::string shapeString(const std::vector<int64_t>& shape) { return TensorInfo{DType::kF32, shape}.shapeString(); }

void expectCounts(std::string_view op, const KernelSetup& setup, size_t min_inputs, size_t max_inputs,
                  size_t outputs = 1) {
  if (setup.inputs.size() < min_inputs || setup.inputs.size() > max_inputs) {
    const std::string expected =
        min_inputs == max_inputs ? std::to_string(min_inputs) : fmt::format("{} to {}", min_inputs, max_inputs);
    throw UsageError(fmt::format("{}: expects {} inputs, got {}", op, expected, setup.inputs.size()));
  }
  if (outputs != 0 && setup.outputs.size() != outputs) {
    throw UsageError(fmt::format("{}: expects {} output, got {}", op, outputs, setup.outputs.size()));
  }
}

// Every input and output must have a static shape and an element type with a size.
void expectStatic(std::string_view op, const KernelSetup& setup) {
  auto check = [&](const TensorInfo& info, const char* what, size_t i) {
    if (info.dtype == DType::kUndefined) return;
    if (!info.isStatic()) throw UsageError(fmt::format("{}: needs static shapes, {} {} is {}", op, what, i, typeString(info)));
  };
  for (size_t i = 0; i < setup.inputs.size(); ++i) check(setup.inputs[i], "input", i);
  for (size_t i = 0; i < setup.outputs.size(); ++i) check(setup.outputs[i], "output", i);
}

// Element `i` of a float tensor (f32 or f64) as double.
double readFloat(const std::byte* data, DType dtype, uint64_t i) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, data + i * sizeof v, sizeof v);
    return v;
  }
  double v;
  std::memcpy(&v, data + i * sizeof v, sizeof v);
  return v;
}

void expectIntInput(std::string_view op, const KernelSetup& setup, size_t index, const char* name) {
  const TensorInfo& info = setup.inputs[index];
  if (info.dtype != DType::kI32 && info.dtype != DType::kI64) {
    throw UsageError(fmt::format("{}: {} must be i32 or i64, got {}", op, name, dtypeName(info.dtype)));
  }
  if (info.shape.size() > 1 || !info.isStatic()) {
    throw UsageError(fmt::format("{}: {} must be a static 1-D tensor, got {}", op, name, typeString(info)));
  }
}

std::vector<int64_t> constantInts(const KernelSetup& setup, size_t index) {
  const std::byte* bytes = constantInput(setup, index);
  const TensorInfo& info = setup.inputs[index];
  std::vector<int64_t> out(info.numElements());
  for (size_t i = 0; i < out.size(); ++i) out[i] = readInt(bytes, info.dtype, i);
  return out;
}

// An unsigned type of each element size: data-moving loops copy these.
template <size_t kSize>
struct Bits;
template <>
struct Bits<1> {
  using type = uint8_t;
};
template <>
struct Bits<2> {
  using type = uint16_t;
};
template <>
struct Bits<4> {
  using type = uint32_t;
};
template <>
struct Bits<8> {
  using type = uint64_t;
};

// ------------------------------------------------------------ strided copy

// Twice kMaxRank: Tile splits every dimension in two.
constexpr size_t kPlanRank = 2 * kMaxRank;

// Copies a strided view of the input into the contiguous output: output
// element (i0, ..., ik) reads input element offset + sum(i_d * strides[d]).
struct StridedCopy {
  uint32_t rank = 0;  // 0: a single element (or none, when empty)
  bool empty = false;
  int64_t offset = 0;  // elements
  std::array<int64_t, kPlanRank> dims{};
  std::array<int64_t, kPlanRank> strides{};      // input, elements
  std::array<int64_t, kPlanRank> out_strides{};  // output, elements
  // Tiled 2-D transpose: the dimension whose input stride is 1 (it is then
  // not the innermost); -1 for row copies.
  int32_t tile_dim = -1;
  std::array<uint32_t, kPlanRank> outer{};  // the dimensions the odometer walks
  uint32_t outer_count = 0;
  size_t element_size = 0;
};

// Builds the plan from uncollapsed output dims and input strides.
template <typename Dims, typename Strides>
void planStridedCopy(StridedCopy& plan, size_t rank, const Dims& dims, const Strides& strides, int64_t offset,
                     size_t element_size) {
  plan.element_size = element_size;
  plan.offset = offset;
  plan.rank = 0;
  // An empty copy does nothing: no plan (its other dimensions may be any
  // size, and their products need not fit).
  plan.empty = std::find(dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(rank), 0) !=
               dims.begin() + static_cast<std::ptrdiff_t>(rank);
  if (plan.empty) return;
  for (size_t d = 0; d < rank; ++d) {
    if (dims[d] == 1) continue;
    if (plan.rank > 0 && plan.strides[plan.rank - 1] == strides[d] * dims[d]) {
      plan.dims[plan.rank - 1] *= dims[d];
      plan.strides[plan.rank - 1] = strides[d];
      continue;
    }
    plan.dims[plan.rank] = dims[d];
    plan.strides[plan.rank] = strides[d];
    ++plan.rank;
  }
  int64_t stride = 1;
  for (uint32_t d = plan.rank; d-- > 0;) {
    plan.out_strides[d] = stride;
    stride *= plan.dims[d];
  }
  plan.tile_dim = -1;
  if (plan.rank >= 2 && plan.strides[plan.rank - 1] != 1 && plan.strides[plan.rank - 1] != 0) {
    for (uint32_t d = 0; d + 1 < plan.rank; ++d) {
      if (plan.strides[d] == 1) plan.tile_dim = static_cast<int32_t>(d);
    }
  }
  plan.outer_count = 0;
  for (uint32_t d = 0; d + 1 < plan.rank; ++d) {
    if (static_cast<int32_t>(d) != plan.tile_dim) plan.outer[plan.outer_count++] = d;
  }
}

template <typename T>
inline void copyRow(T* __restrict y, const T* __restrict x, int64_t n, int64_t stride) {
  if (stride == 1) {
    std::memcpy(y, x, static_cast<size_t>(n) * sizeof(T));
  } else if (stride == 0) {
    const T v = *x;
    for (int64_t i = 0; i < n; ++i) y[i] = v;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i * stride];
  }
}

// The copy is cut into items split across the threads (parallel.h): one
// row copy each, or for a tiled transpose a tile of up to kTransposeChunk x
// kTransposeChunk elements (an image's NCHW -> NHWC is a single [C, H*W]
// transpose; cut along both axes, so that [144, 6400] is 25 items, not one).
// A thread starts its odometer at its first item and walks on from there.
constexpr int64_t kTransposeChunk = 256;

template <typename T>
void runStridedCopyAs(const StridedCopy& plan, const std::byte* x_bytes, std::byte* y_bytes) {
  if (plan.empty) return;
  const T* x = reinterpret_cast<const T*>(x_bytes) + plan.offset;
  T* y = reinterpret_cast<T*>(y_bytes);
  if (plan.rank == 0) {
    *y = *x;
    return;
  }
  const uint32_t last = plan.rank - 1;
  const int64_t n = plan.dims[last];
  const int64_t s = plan.strides[last];
  const bool tiled = plan.tile_dim >= 0;
  const uint32_t t = tiled ? static_cast<uint32_t>(plan.tile_dim) : 0;
  // A tiled item is (tile-dimension chunk) x (last-dimension chunk).
  const int64_t column_chunks = tiled ? (n + kTransposeChunk - 1) / kTransposeChunk : 1;
  const int64_t chunks = tiled ? (plan.dims[t] + kTransposeChunk - 1) / kTransposeChunk * column_chunks : 1;
  int64_t rows = 1;
  for (uint32_t k = 0; k < plan.outer_count; ++k) rows *= plan.dims[plan.outer[k]];
  parallelForItems(rows * chunks, tiled ? kTransposeChunk * std::min(n, kTransposeChunk) : n, [&](int64_t begin, int64_t end) {
    // The odometer at row begin / chunks.
    std::array<int64_t, kPlanRank> index{};
    int64_t xo = 0;
    int64_t yo = 0;
    int64_t row = begin / chunks;
    for (uint32_t k = plan.outer_count; k-- > 0;) {
      const uint32_t d = plan.outer[k];
      index[d] = row % plan.dims[d];
      row /= plan.dims[d];
      xo += index[d] * plan.strides[d];
      yo += index[d] * plan.out_strides[d];
    }
    int64_t part = begin % chunks;
    for (int64_t item = begin; item < end; ++item) {
      if (tiled) {
        const int64_t first = part / column_chunks * kTransposeChunk;
        const int64_t count = std::min(kTransposeChunk, plan.dims[t] - first);
        const int64_t first_column = part % column_chunks * kTransposeChunk;
        const int64_t columns = std::min(kTransposeChunk, n - first_column);
        transposeTile(y + yo + first * plan.out_strides[t] + first_column, plan.out_strides[t],
                      x + xo + first + first_column * s, s, count, columns);
      } else {
        copyRow(y + yo, x + xo, n, s);
      }
      if (++part < chunks) continue;
      part = 0;
      for (uint32_t k = plan.outer_count; k-- > 0;) {
        const uint32_t d = plan.outer[k];
        xo += plan.strides[d];
        yo += plan.out_strides[d];
        if (++index[d] < plan.dims[d]) break;
        xo -= plan.strides[d] * plan.dims[d];
        yo -= plan.out_strides[d] * plan.dims[d];
        index[d] = 0;
      }
    }
  });
}

void runStridedCopy(const StridedCopy& plan, const std::byte* x, std::byte* y) {
  withElementSize(plan.element_size, [&](auto t) { runStridedCopyAs<decltype(t)>(plan, x, y); });
}

// Row-major strides of `shape`, in elements. The products wrap rather than
// overflow: they exceed int64 only for an empty tensor (a 0 among huge
// dimensions), whose strides nothing uses.
std::array<int64_t, kMaxRank> contiguousStrides(const std::vector<int64_t>& shape) {
  std::array<int64_t, kMaxRank> strides{};
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride = wrapMul(stride, shape[d]);
  }
  return strides;
}

struct CopyState final : KernelState {
  StridedCopy plan;
};

void runCopyPlan(const KernelCall& call) {
  const auto& state = static_cast<const CopyState&>(*call.state);
  runStridedCopy(state.plan, call.inputs[0].data, call.outputs[0].data);
}

// ---------------------------------------------------------------- Transpose

std::unique_ptr<KernelState> prepareTranspose(const KernelSetup& setup) {
  expectCounts("Transpose", setup, 1, 1);
  expectStatic("Transpose", setup);
  const TensorInfo& x = setup.inputs[0];
  refuseElementSize("Transpose", x.dtype);
  const size_t rank = x.shape.size();
  std::vector<int64_t> perm(rank);
  for (size_t d = 0; d < rank; ++d) perm[d] = static_cast<int64_t>(rank - 1 - d);
  perm = setup.params.getInts("perm", perm);
  std::vector<bool> seen(rank, false);
  if (perm.size() != rank) {
    throw UsageError(fmt::format("Transpose: perm has {} entries for an input of rank {}", perm.size(), rank));
  }
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(p)]) {
      throw UsageError(fmt::format("Transpose: perm [{}] is not a permutation of 0..{}", fmt::join(perm, ", "),
                                   static_cast<int64_t>(rank) - 1));
    }
    seen[static_cast<size_t>(p)] = true;
  }
  std::vector<int64_t> out_shape(rank);
  const auto in_strides = contiguousStrides(x.shape);
  std::array<int64_t, kMaxRank> strides{};
  for (size_t d = 0; d < rank; ++d) {
    out_shape[d] = x.shape[static_cast<size_t>(perm[d])];
    strides[d] = in_strides[static_cast<size_t>(perm[d])];
  }
  expectOutput("Transpose", setup.outputs[0], x.dtype, out_shape);
  auto state = std::make_unique<CopyState>();
  planStridedCopy(state->plan, rank, out_shape, strides, 0, dtypeSize(x.dtype));
  return state;
}

// -------------------------------------------------------------------- Tile

std::unique_ptr<KernelState> prepareTile(const KernelSetup& setup) {
  expectCounts("Tile", setup, 2, 2);
  expectStatic("Tile", setup);
  const TensorInfo& x = setup.inputs[0];
  refuseElementSize("Tile", x.dtype);
  expectIntInput("Tile", setup, 1, "repeats");
  const size_t rank = x.shape.size();
  const TensorInfo& y = setup.outputs[0];
  if (setup.inputs[1].numElements() != rank) {
    throw UsageError(fmt::format("Tile: repeats has {} entries for an input of rank {}", setup.inputs[1].numElements(), rank));
  }
  // The repeats follow from the output shape; a constant repeats must agree.
  std::vector<int64_t> repeats(rank, 1);
  if (constantInput(setup, 1) != nullptr) {
    repeats = constantInts(setup, 1);
    std::vector<int64_t> want(rank);
    for (size_t d = 0; d < rank; ++d) {
      const std::optional<int64_t> size = multiplySizes(x.shape[d], repeats[d]);
      if (!size) throw UsageError(fmt::format("Tile: repeats [{}] is negative or too large", fmt::join(repeats, ", ")));
      want[d] = *size;
    }
    expectOutput("Tile", y, x.dtype, want);
  } else {
    if (y.dtype != x.dtype || y.shape.size() != rank) expectOutput("Tile", y, x.dtype, x.shape);
    for (size_t d = 0; d < rank; ++d) {
      if (x.shape[d] == 0 ? y.shape[d] != 0 : y.shape[d] % x.shape[d] != 0) {
        throw UsageError(fmt::format("Tile: output {} is not a tiling of input {}", typeString(y), typeString(x)));
      }
      repeats[d] = x.shape[d] == 0 ? 0 : y.shape[d] / x.shape[d];
    }
  }
  const auto in_strides = contiguousStrides(x.shape);
  std::array<int64_t, kPlanRank> dims{};
  std::array<int64_t, kPlanRank> strides{};
  for (size_t d = 0; d < rank; ++d) {
    dims[2 * d] = repeats[d];
    strides[2 * d] = 0;
    dims[2 * d + 1] = x.shape[d];
    strides[2 * d + 1] = in_strides[d];
  }
  auto state = std::make_unique<CopyState>();
  planStridedCopy(state->plan, 2 * rank, dims, strides, 0, dtypeSize(x.dtype));
  return state;
}

// ------------------------------------------------------------------ Expand

// Input strides of `in` broadcast to `out` (numpy rules, right-aligned); false
// when it does not broadcast.
bool broadcastStrides(const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                      std::array<int64_t, kMaxRank>& strides) {
  if (in.size() > out.size()) return false;
  const size_t offset = out.size() - in.size();
  int64_t stride = 1;
  for (size_t d = out.size(); d-- > 0;) {
    const int64_t dim = d >= offset ? in[d - offset] : 1;
    if (dim != out[d] && dim != 1) return false;
    strides[d] = dim == 1 ? 0 : stride;
    stride = wrapMul(stride, dim);  // as contiguousStrides
  }
  return true;
}

std::unique_ptr<KernelState> prepareExpand(const KernelSetup& setup) {
  expectCounts("Expand", setup, 2, 2);
  expectStatic("Expand", setup);
  const TensorInfo& x = setup.inputs[0];
  refuseElementSize("Expand", x.dtype);
  expectIntInput("Expand", setup, 1, "shape");
  const TensorInfo& y = setup.outputs[0];
  if (constantInput(setup, 1) != nullptr) {
    // The output is the broadcast of the input's shape and `shape`.
    const std::vector<int64_t> shape = constantInts(setup, 1);
    const size_t rank = std::max(shape.size(), x.shape.size());
    std::vector<int64_t> want(rank, 1);
    for (size_t d = 0; d < rank; ++d) {
      const int64_t a = d + x.shape.size() >= rank ? x.shape[d + x.shape.size() - rank] : 1;
      const int64_t b = d + shape.size() >= rank ? shape[d + shape.size() - rank] : 1;
      if (a != b && a != 1 && b != 1) {
        throw UsageError(fmt::format("Expand: input {} does not broadcast to shape {}", typeString(x), shapeString(shape)));
      }
      want[d] = a == 1 ? b : a;
    }
    expectOutput("Expand", y, x.dtype, want);
  }
  std::array<int64_t, kMaxRank> strides{};
  if (y.dtype != x.dtype || !broadcastStrides(x.shape, y.shape, strides)) {
    throw UsageError(fmt::format("Expand: input {} does not broadcast to output {}", typeString(x), typeString(y)));
  }
  auto state = std::make_unique<CopyState>();
  planStridedCopy(state->plan, y.shape.size(), y.shape, strides, 0, dtypeSize(x.dtype));
  return state;
}

// ------------------------------------------------------------------- Slice

struct SliceState final : KernelState {
  StridedCopy plan;  // when the positions are constants
  bool from_call = false;
  uint32_t rank = 0;
  std::array<int64_t, kMaxRank> in_dims{};
  std::array<int64_t, kMaxRank> out_dims{};
  size_t element_size = 0;
  bool has_axes = false;
  bool has_steps = false;
};

// Fills `plan` for a slice; false when the positions are invalid or give
// another output shape than `out_dims`.
template <typename Get>
bool planSlice(StridedCopy& plan, uint32_t rank, const std::array<int64_t, kMaxRank>& in_dims,
               const std::array<int64_t, kMaxRank>& out_dims, uint64_t count, bool has_axes, bool has_steps, Get get,
               size_t element_size, std::array<int64_t, kMaxRank>* got_dims = nullptr) {
  std::array<int64_t, kMaxRank> first{};
  std::array<int64_t, kMaxRank> step{};
  std::array<int64_t, kMaxRank> size{};
  if (!resolveSlice(rank, in_dims, count, has_axes, has_steps, get, first, step, size)) return false;
  if (got_dims != nullptr) *got_dims = size;
  int64_t stride = 1;
  int64_t offset = 0;
  std::array<int64_t, kMaxRank> strides{};
  // Wrapping: a product leaves int64 only where it is not used (an axis of
  // one element, whose step may be anything, or an empty input).
  for (uint32_t d = rank; d-- > 0;) {
    if (size[d] != out_dims[d]) return false;
    strides[d] = wrapMul(stride, step[d]);
    offset = wrapAdd(offset, wrapMul(stride, first[d]));
    stride = wrapMul(stride, in_dims[d]);
  }
  planStridedCopy(plan, rank, out_dims, strides, offset, element_size);
  return true;
}

std::unique_ptr<KernelState> prepareSlice(const KernelSetup& setup) {
  expectCounts("Slice", setup, 1, 5);
  expectStatic("Slice", setup);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  refuseElementSize("Slice", x.dtype);
  if (y.dtype != x.dtype || y.shape.size() != x.shape.size()) {
    throw UsageError(fmt::format("Slice: output {} does not match input {}", typeString(y), typeString(x)));
  }
  auto state = std::make_unique<SliceState>();
  state->rank = static_cast<uint32_t>(x.shape.size());
  for (uint32_t d = 0; d < state->rank; ++d) {
    state->in_dims[d] = x.shape[d];
    state->out_dims[d] = y.shape[d];
  }
  state->element_size = dtypeSize(x.dtype);
  // Opset 1-9: attributes. Later: inputs 1-4.
  std::array<std::vector<int64_t>, 5> values;
  bool constant = true;
  uint64_t count = 0;
  if (setup.inputs.size() == 1) {
    values[1] = setup.params.getInts("starts", {});
    values[2] = setup.params.getInts("ends", {});
    values[3] = setup.params.getInts("axes", {});
    state->has_axes = setup.params.has("axes");
    if (values[1].size() != values[2].size() || (state->has_axes && values[3].size() != values[1].size())) {
      throw UsageError("Slice: starts, ends and axes must have the same length");
    }
    count = values[1].size();
  } else {
    if (setup.inputs.size() < 3 || setup.inputs.size() > 5 || !present(setup, 1) || !present(setup, 2)) {
      throw UsageError("Slice: expects data, starts and ends inputs, then optional axes and steps");
    }
    static constexpr const char* kNames[] = {"data", "starts", "ends", "axes", "steps"};
    for (size_t i = 1; i < setup.inputs.size(); ++i) {
      if (!present(setup, i)) continue;
      expectIntInput("Slice", setup, i, kNames[i]);
      if (i == 1) count = setup.inputs[i].numElements();
      if (setup.inputs[i].numElements() != count) {
        throw UsageError(fmt::format("Slice: {} has {} entries, starts {}", kNames[i], setup.inputs[i].numElements(), count));
      }
      if (constantInput(setup, i) == nullptr) {
        constant = false;
      } else {
        values[i] = constantInts(setup, i);
      }
    }
    state->has_axes = present(setup, 3);
    state->has_steps = present(setup, 4);
  }
  if (count > state->rank) throw UsageError(fmt::format("Slice: {} slices for an input of rank {}", count, state->rank));
  if (!constant) {
    state->from_call = true;
    return state;
  }
  std::array<int64_t, kMaxRank> got{};
  const bool ok = planSlice(
      state->plan, state->rank, state->in_dims, state->out_dims, count, state->has_axes, state->has_steps,
      [&](int input, uint64_t i) { return values[static_cast<size_t>(input)][i]; }, state->element_size, &got);
  if (!ok) {
    std::array<int64_t, kMaxRank> first{}, step{}, size{};
    if (!resolveSlice(state->rank, state->in_dims, count, state->has_axes, state->has_steps,
                      [&](int input, uint64_t i) { return values[static_cast<size_t>(input)][i]; }, first, step, size)) {
      throw UsageError("Slice: an axis is out of range or repeated, or a step is 0");
    }
    const std::vector<int64_t> want(size.begin(), size.begin() + state->rank);
    expectOutput("Slice", y, x.dtype, want);
  }
  return state;
}

void runSlice(const KernelCall& call) {
  const auto& state = static_cast<const SliceState&>(*call.state);
  if (!state.from_call) {
    runStridedCopy(state.plan, call.inputs[0].data, call.outputs[0].data);
    return;
  }
  const TensorView& starts = call.inputs[1];
  StridedCopy plan;
  const bool ok = planSlice(
      plan, state.rank, state.in_dims, state.out_dims, starts.numElements(), state.has_axes, state.has_steps,
      [&](int input, uint64_t i) { return readInt(call.inputs[input].data, call.inputs[input].dtype, i); },
      state.element_size);
  // Positions that disagree with the planned output shape: ONNX gives no
  // result to match, and run cannot throw; the output is left as it is.
  if (ok) runStridedCopy(plan, call.inputs[0].data, call.outputs[0].data);
}

// ------------------------------------------------------------ Concat, Split

// Concat and Split walk `outer` blocks; in each, every piece contributes a
// contiguous run of bytes.
struct PiecesState : KernelState {
  int64_t outer = 1;
  std::vector<size_t> piece_bytes;
  size_t whole_bytes = 0;
};

// Concat's checks and pieces; `op` names it in errors.
PiecesState planConcat(const KernelSetup& setup, const char* op) {
  expectCounts(op, setup, 1, 1u << 16);
  expectStatic(op, setup);
  const TensorInfo& first = setup.inputs[0];
  refuseElementSize(op, first.dtype);
  if (!setup.params.has("axis")) throw UsageError(fmt::format("{}: needs the attribute axis", op));
  const size_t axis = static_cast<size_t>(normalizeAxis(op, setup.params.getInt("axis", 0), first.shape.size()));
  std::vector<int64_t> out = first.shape;
  out[axis] = 0;
  PiecesState state;
  const size_t element = dtypeSize(first.dtype);
  for (size_t i = 0; i < setup.inputs.size(); ++i) {
    const TensorInfo& input = setup.inputs[i];
    bool match = input.dtype == first.dtype && input.shape.size() == first.shape.size();
    for (size_t d = 0; match && d < first.shape.size(); ++d) match = d == axis || input.shape[d] == first.shape[d];
    if (!match) {
      throw UsageError(fmt::format("{}: input {} is {} but input 0 is {}: they must match except along axis {}", op, i,
                                   typeString(input), typeString(first), axis));
    }
    out[axis] += input.shape[axis];
    state.piece_bytes.push_back(static_cast<size_t>(product(input.shape, axis, input.shape.size())) * element);
  }
  expectOutput(op, setup.outputs[0], first.dtype, out);
  state.outer = product(out, 0, axis);
  for (size_t bytes : state.piece_bytes) state.whole_bytes += bytes;
  return state;
}

std::unique_ptr<KernelState> prepareConcat(const KernelSetup& setup) {
  return std::make_unique<PiecesState>(planConcat(setup, "Concat"));
}

// memcpy for the pieces of Concat and Split, which are short when they cut
// the channels of channels-last tensors (16 floats a pixel, say): short ones
// are copied with fixed-size copies the compiler inlines, rather than a
// library call per piece.
inline void copyPiece(std::byte* dst, const std::byte* src, size_t bytes) {
  constexpr size_t kShort = 512;
  if (bytes >= kShort) {
    std::memcpy(dst, src, bytes);
    return;
  }
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) std::memcpy(dst + i, src + i, 32);
  for (; i + 4 <= bytes; i += 4) std::memcpy(dst + i, src + i, 4);
  for (; i < bytes; ++i) dst[i] = src[i];
}

// Concat and Split copy between one whole tensor and its pieces: in each of
// `outer` blocks, piece i's run of piece_bytes[i] bytes. This calls
// copy(whole_offset, piece, piece_offset, bytes) over all of them. Large
// copies are split across the threads (two cores copy the 6 MB Concat in
// SLANet's backbone in about half the time of one): by outer blocks when
// there are several, else each piece in chunks.
template <typename Copy>
void forEachPieceRun(const PiecesState& state, const Copy& copy) {
  constexpr int64_t kChunk = 16 << 10;  // bytes
  const size_t count = state.piece_bytes.size();
  if (state.outer == 0) return;  // an empty dimension before the axis: nothing to copy
  if (state.outer > 1) {
    parallelForItems(state.outer, static_cast<int64_t>(state.whole_bytes / 4), [&](int64_t begin, int64_t end) {
      size_t at = static_cast<size_t>(begin) * state.whole_bytes;
      for (int64_t o = begin; o < end; ++o) {
        for (size_t i = 0; i < count; ++i) {
          const size_t bytes = state.piece_bytes[i];
          copy(at, i, static_cast<size_t>(o) * bytes, bytes);
          at += bytes;
        }
      }
    });
    return;
  }
  size_t at = 0;
  for (size_t i = 0; i < count; ++i) {
    const int64_t bytes = static_cast<int64_t>(state.piece_bytes[i]);
    parallelForItems((bytes + kChunk - 1) / kChunk, kChunk / 4, [&](int64_t begin, int64_t end) {
      const int64_t first = begin * kChunk;
      const size_t length = static_cast<size_t>(std::min(end * kChunk, bytes) - first);
      copy(at + static_cast<size_t>(first), i, static_cast<size_t>(first), length);
    });
    at += static_cast<size_t>(bytes);
  }
}

void runConcat(const KernelCall& call) {
  std::byte* y = call.outputs[0].data;
  forEachPieceRun(static_cast<const PiecesState&>(*call.state),
                  [&](size_t whole_offset, size_t piece, size_t piece_offset, size_t bytes) {
                    copyPiece(y + whole_offset, call.inputs[piece].data + piece_offset, bytes);
                  });
}

// kiln.QLinearConcat(x_1, ..., x_n; axis, scales, zero_points): Concat of
// 8-bit tensors (all u8 or all i8) whose quantizations differ: each input is
// requantized to the output's as it is copied, exactly as DequantizeLinear
// then QuantizeLinear compute it (scales, zero_points: each input's, then the
// output's). What the QDQ fusion makes of Q(Concat(DQ(x_1), ...)) when the
// parameters differ (a YOLO's or a CSP block's concatenations). A function
// of one byte is a table of 256: built at prepare, looked up 64 bytes at a
// time (vec::lookup8), a plain copy where the parameters are the output's.
struct QuantizedPiecesState final : KernelState {
  PiecesState pieces;
  std::vector<std::array<uint8_t, 256>> tables;  // per input
  std::vector<bool> copies;                      // per input: the output's parameters, copied as they are
};

std::unique_ptr<KernelState> prepareQLinearConcat(const KernelSetup& setup) {
  constexpr const char* kOp = "kiln.QLinearConcat";
  auto state = std::make_unique<QuantizedPiecesState>();
  state->pieces = planConcat(setup, kOp);
  const DType type = setup.inputs[0].dtype;
  if (type != DType::kU8 && type != DType::kI8) {
    throw UsageError(fmt::format("{}: the inputs must be u8 or i8, found {}", kOp, dtypeName(type)));
  }
  const size_t n = setup.inputs.size();
  const std::vector<double> scales = setup.params.getFloats("scales", {});
  const std::vector<int64_t> zeros = setup.params.getInts("zero_points", {});
  const int64_t lowest = type == DType::kU8 ? 0 : -128;
  bool valid = scales.size() == n + 1 && zeros.size() == n + 1;
  for (size_t i = 0; valid && i <= n; ++i) {
    valid = scales[i] > 0 && std::isfinite(scales[i]) && zeros[i] >= lowest && zeros[i] <= lowest + 255;
  }
  if (!valid) {
    throw UsageError(fmt::format("{}: scales and zero_points take {} values each (the inputs', then the output's): "
                                 "positive scales, zero points of the type's range",
                                 kOp, n + 1));
  }
  const bool is_signed = type == DType::kI8;
  const auto y_scale = static_cast<float>(scales[n]);
  const auto y_zero = static_cast<float>(zeros[n]);
  std::array<uint8_t, 256> bytes{};
  for (size_t v = 0; v < bytes.size(); ++v) bytes[v] = static_cast<uint8_t>(v);
  const vec::VectorKernels& kernels = vec::vectorKernels();
  for (size_t i = 0; i < n; ++i) {
    std::array<float, 256> real{};
    kernels.dequantize8(bytes.data(), real.data(), 256, static_cast<float>(scales[i]), static_cast<float>(zeros[i]),
                        is_signed);
    state->tables.emplace_back();
    kernels.quantize8(real.data(), state->tables.back().data(), 256, y_scale, y_zero, is_signed);
    state->copies.push_back(state->tables.back() == bytes);
  }
  return state;
}

// By blocks of the dimensions before the axis; in each, piece by piece over
// all the block's rows, so that a table is loaded once per piece.
void runQLinearConcat(const KernelCall& call) {
  const auto& state = static_cast<const QuantizedPiecesState&>(*call.state);
  const PiecesState& pieces = state.pieces;
  auto* y = call.outputs[0].as<uint8_t>();
  const vec::VectorKernels& kernels = vec::vectorKernels();
  const auto whole = static_cast<int64_t>(pieces.whole_bytes);
  parallelForItems(pieces.outer, std::max<int64_t>(whole / 4, 1), [&](int64_t begin, int64_t end) {
    int64_t offset = 0;
    for (size_t i = 0; i < pieces.piece_bytes.size(); ++i) {
      const auto bytes = static_cast<int64_t>(pieces.piece_bytes[i]);
      const uint8_t* x = call.inputs[i].as<const uint8_t>() + begin * bytes;
      uint8_t* out = y + begin * whole + offset;
      if (state.copies[i]) {
        for (int64_t o = begin; o < end; ++o, x += bytes, out += whole) {
          copyPiece(reinterpret_cast<std::byte*>(out), reinterpret_cast<const std::byte*>(x), static_cast<size_t>(bytes));
        }
      } else {
        kernels.lookup8(x, bytes, out, whole, end - begin, bytes, state.tables[i].data());
      }
      offset += bytes;
    }
  });
}

std::unique_ptr<KernelState> prepareSplit(const KernelSetup& setup) {
  expectCounts("Split", setup, 1, 2, 0);
  if (setup.outputs.empty()) throw UsageError("Split: expects at least 1 output");
  expectStatic("Split", setup);
  const TensorInfo& x = setup.inputs[0];
  refuseElementSize("Split", x.dtype);
  const size_t axis = static_cast<size_t>(normalizeAxis("Split", setup.params.getInt("axis", 0), x.shape.size()));
  auto state = std::make_unique<PiecesState>();
  const size_t element = dtypeSize(x.dtype);
  int64_t total = 0;
  for (size_t i = 0; i < setup.outputs.size(); ++i) {
    const TensorInfo& y = setup.outputs[i];
    bool match = y.dtype == x.dtype && y.shape.size() == x.shape.size();
    for (size_t d = 0; match && d < x.shape.size(); ++d) match = d == axis || y.shape[d] == x.shape[d];
    if (!match) {
      throw UsageError(fmt::format("Split: output {} is {} but the input is {}: they must match except along axis {}", i,
                                   typeString(y), typeString(x), axis));
    }
    total += y.shape[axis];
    state->piece_bytes.push_back(static_cast<size_t>(product(y.shape, axis, y.shape.size())) * element);
  }
  if (total != x.shape[axis]) {
    throw UsageError(
        fmt::format("Split: the outputs add up to {} along axis {}, the input has {}", total, axis, x.shape[axis]));
  }
  if (present(setup, 1) && constantInput(setup, 1) != nullptr) {
    expectIntInput("Split", setup, 1, "split");
    const std::vector<int64_t> split = constantInts(setup, 1);
    bool same = split.size() == setup.outputs.size();
    for (size_t i = 0; same && i < split.size(); ++i) same = split[i] == setup.outputs[i].shape[axis];
    if (!same) throw UsageError(fmt::format("Split: split [{}] does not match the outputs", fmt::join(split, ", ")));
  }
  state->outer = product(x.shape, 0, axis);
  for (size_t bytes : state->piece_bytes) state->whole_bytes += bytes;
  return state;
}

void runSplit(const KernelCall& call) {
  const std::byte* x = call.inputs[0].data;
  forEachPieceRun(static_cast<const PiecesState&>(*call.state),
                  [&](size_t whole_offset, size_t piece, size_t piece_offset, size_t bytes) {
                    copyPiece(call.outputs[piece].data + piece_offset, x + whole_offset, bytes);
                  });
}

// ------------------------------------------------------------------ Gather

struct GatherState final : KernelState {
  using Loop = void (*)(const GatherState& state, const std::byte* x, const std::byte* indices, std::byte* y);
  Loop loop = nullptr;
  int64_t outer = 1;
  int64_t axis_dim = 0;
  int64_t inner = 1;  // elements
  int64_t count = 0;  // indices
  size_t element_size = 0;
};

template <typename T, typename I>
void gatherLoop(const GatherState& state, const std::byte* x_bytes, const std::byte* indices_bytes,
                std::byte* y_bytes) {
  const T* x = reinterpret_cast<const T*>(x_bytes);
  const I* indices = reinterpret_cast<const I*>(indices_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  const int64_t inner = state.inner;
  const int64_t dim = state.axis_dim;
  // An empty output (and maybe null buffers): nothing to copy, and no walk
  // over a vast outer axis.
  if (inner == 0 || state.count == 0) return;
  for (int64_t o = 0; o < state.outer; ++o) {
    const T* block = x + o * dim * inner;
    for (int64_t j = 0; j < state.count; ++j) {
      int64_t index = static_cast<int64_t>(indices[j]);
      if (index < 0) index += dim;
      if (index < 0 || index >= dim) {
        // Out of range: ONNX gives an error, which run cannot throw; zeros.
        std::memset(y, 0, static_cast<size_t>(inner) * sizeof(T));
      } else if (inner == 1) {
        *y = block[index];
      } else {
        std::memcpy(y, block + index * inner, static_cast<size_t>(inner) * sizeof(T));
      }
      y += inner;
    }
  }
}

std::unique_ptr<KernelState> prepareGather(const KernelSetup& setup) {
  expectCounts("Gather", setup, 2, 2);
  expectStatic("Gather", setup);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& indices = setup.inputs[1];
  refuseElementSize("Gather", x.dtype);
  if (indices.dtype != DType::kI32 && indices.dtype != DType::kI64) {
    throw UsageError(fmt::format("Gather: indices must be i32 or i64, got {}", dtypeName(indices.dtype)));
  }
  if (x.shape.empty()) throw UsageError("Gather: data must have rank 1 or more");
  const size_t axis = static_cast<size_t>(normalizeAxis("Gather", setup.params.getInt("axis", 0), x.shape.size()));
  std::vector<int64_t> out(x.shape.begin(), x.shape.begin() + static_cast<std::ptrdiff_t>(axis));
  out.insert(out.end(), indices.shape.begin(), indices.shape.end());
  out.insert(out.end(), x.shape.begin() + static_cast<std::ptrdiff_t>(axis) + 1, x.shape.end());
  expectOutput("Gather", setup.outputs[0], x.dtype, out);
  auto state = std::make_unique<GatherState>();
  state->outer = product(x.shape, 0, axis);
  state->axis_dim = x.shape[axis];
  state->inner = product(x.shape, axis + 1, x.shape.size());
  state->count = static_cast<int64_t>(indices.numElements());
  state->element_size = dtypeSize(x.dtype);
  if (constantInput(setup, 1) != nullptr) {
    for (int64_t i = 0; i < state->count; ++i) {
      const int64_t index = readInt(constantInput(setup, 1), indices.dtype, static_cast<uint64_t>(i));
      if (index < -state->axis_dim || index >= state->axis_dim) {
        throw UsageError(fmt::format("Gather: index {} is out of range for axis {} of size {}", index, axis,
                                     state->axis_dim));
      }
    }
  }
  const bool i32 = indices.dtype == DType::kI32;
  state->loop = withElementSize(state->element_size, [&](auto t) -> GatherState::Loop {
    using T = decltype(t);
    return i32 ? &gatherLoop<T, int32_t> : &gatherLoop<T, int64_t>;
  });
  return state;
}

void runGather(const KernelCall& call) {
  const auto& state = static_cast<const GatherState&>(*call.state);
  state.loop(state, call.inputs[0].data, call.inputs[1].data, call.outputs[0].data);
}

// ------------------------------------------------------------------- Where

struct WhereState final : KernelState {
  using Loop = void (*)(const WhereState& state, const std::byte* c, const std::byte* a, const std::byte* b,
                        std::byte* y);
  Loop loop = nullptr;
  uint32_t rank = 1;
  bool empty = false;
  std::array<int64_t, kMaxRank> dims{};
  std::array<std::array<int64_t, kMaxRank>, 3> strides{};
};

template <typename T>
void whereLoop(const WhereState& state, const std::byte* c_bytes, const std::byte* a_bytes, const std::byte* b_bytes,
               std::byte* y_bytes) {
  if (state.empty) return;
  const uint8_t* c = reinterpret_cast<const uint8_t*>(c_bytes);
  const T* a = reinterpret_cast<const T*>(a_bytes);
  const T* b = reinterpret_cast<const T*>(b_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  const uint32_t last = state.rank - 1;
  const int64_t n = state.dims[last];
  const int64_t sc = state.strides[0][last];
  const int64_t sa = state.strides[1][last];
  const int64_t sb = state.strides[2][last];
  int64_t rows = 1;
  for (uint32_t d = 0; d < last; ++d) rows *= state.dims[d];
  std::array<int64_t, kMaxRank> index{};
  int64_t co = 0, ao = 0, bo = 0;
  for (int64_t row = 0; row < rows; ++row) {
    T* out = y + row * n;
    // Contiguous rows select branch-free, by masks (T is an unsigned
    // integer of the element's size): a condition that changes at random,
    // as a ReLU's gradient's does, would mispredict half the branches.
    const uint8_t* cr = c + co;
    const auto pick = [](uint8_t condition, T yes, T no) {
      const T mask = static_cast<T>(T{0} - static_cast<T>(condition != 0));
      return static_cast<T>((yes & mask) | (no & static_cast<T>(~mask)));
    };
    if (sc == 1 && sa == 1 && sb == 1) {
      const T* ar = a + ao;
      const T* br = b + bo;
      for (int64_t i = 0; i < n; ++i) out[i] = pick(cr[i], ar[i], br[i]);
    } else if (sc == 1 && sa == 1 && sb == 0) {
      const T* ar = a + ao;
      const T fill = b[bo];
      for (int64_t i = 0; i < n; ++i) out[i] = pick(cr[i], ar[i], fill);
    } else if (sc == 1 && sa == 0 && sb == 1) {
      const T fill = a[ao];
      const T* br = b + bo;
      for (int64_t i = 0; i < n; ++i) out[i] = pick(cr[i], fill, br[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) out[i] = c[co + i * sc] != 0 ? a[ao + i * sa] : b[bo + i * sb];
    }
    for (uint32_t d = last; d-- > 0;) {
      co += state.strides[0][d];
      ao += state.strides[1][d];
      bo += state.strides[2][d];
      if (++index[d] < state.dims[d]) break;
      co -= state.strides[0][d] * state.dims[d];
      ao -= state.strides[1][d] * state.dims[d];
      bo -= state.strides[2][d] * state.dims[d];
      index[d] = 0;
    }
  }
}

std::unique_ptr<KernelState> prepareWhere(const KernelSetup& setup) {
  expectCounts("Where", setup, 3, 3);
  expectStatic("Where", setup);
  const TensorInfo& c = setup.inputs[0];
  const TensorInfo& a = setup.inputs[1];
  const TensorInfo& b = setup.inputs[2];
  if (c.dtype != DType::kBool) throw UsageError(fmt::format("Where: condition must be bool, got {}", dtypeName(c.dtype)));
  refuseElementSize("Where", a.dtype);
  if (a.dtype != b.dtype) {
    throw UsageError(fmt::format("Where: X is {} but Y is {}: they must match", dtypeName(a.dtype), dtypeName(b.dtype)));
  }
  const size_t rank = std::max({c.shape.size(), a.shape.size(), b.shape.size()});
  std::vector<int64_t> out(rank, 1);
  for (const TensorInfo* input : {&c, &a, &b}) {
    const size_t offset = rank - input->shape.size();
    for (size_t d = 0; d < input->shape.size(); ++d) {
      const int64_t dim = input->shape[d];
      int64_t& target = out[offset + d];
      if (dim == target || dim == 1) continue;
      if (target != 1) {
        throw UsageError(fmt::format("Where: input shapes {}, {} and {} do not broadcast", c.shapeString(),
                                     a.shapeString(), b.shapeString()));
      }
      target = dim;
    }
  }
  expectOutput("Where", setup.outputs[0], a.dtype, out);
  auto state = std::make_unique<WhereState>();
  std::array<std::array<int64_t, kMaxRank>, 3> full{};
  broadcastStrides(c.shape, out, full[0]);
  broadcastStrides(a.shape, out, full[1]);
  broadcastStrides(b.shape, out, full[2]);
  state->rank = 0;
  for (size_t d = 0; d < rank; ++d) {
    if (out[d] == 0) state->empty = true;
    if (out[d] == 1) continue;
    if (state->rank > 0) {
      const uint32_t last = state->rank - 1;
      bool mergeable = true;
      for (size_t k = 0; k < 3; ++k) mergeable = mergeable && state->strides[k][last] == full[k][d] * out[d];
      if (mergeable) {
        state->dims[last] *= out[d];
        for (size_t k = 0; k < 3; ++k) state->strides[k][last] = full[k][d];
        continue;
      }
    }
    state->dims[state->rank] = out[d];
    for (size_t k = 0; k < 3; ++k) state->strides[k][state->rank] = full[k][d];
    ++state->rank;
  }
  if (state->rank == 0) {
    state->rank = 1;
    state->dims[0] = 1;
  }
  state->loop = withElementSize(dtypeSize(a.dtype), [](auto t) -> WhereState::Loop { return &whereLoop<decltype(t)>; });
  return state;
}

void runWhere(const KernelCall& call) {
  const auto& state = static_cast<const WhereState&>(*call.state);
  state.loop(state, call.inputs[0].data, call.inputs[1].data, call.inputs[2].data, call.outputs[0].data);
}

// --------------------------------------------------------------------- Pad

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

struct PadState final : KernelState {
  using Loop = void (*)(const PadState& state, const std::array<int64_t, kMaxRank>& begin, const std::byte* x,
                        const std::byte* value, std::byte* y);
  Loop loop = nullptr;
  PadMode mode = PadMode::kConstant;
  uint32_t rank = 0;
  std::array<int64_t, kMaxRank> in_dims{};
  std::array<int64_t, kMaxRank> out_dims{};
  std::array<int64_t, kMaxRank> begin{};  // pads before each dimension (when constant)
  bool pads_from_call = false;
  bool axes_given = false;
  std::array<std::byte, 8> value{};  // the constant, as element bytes
  bool value_from_call = false;
  bool empty = false;
};

// Input index of output index `i` along a dimension of `n` input elements
// with `begin` pads before it; -1 for the constant.
inline int64_t padSource(PadMode mode, int64_t i, int64_t begin, int64_t n) {
  int64_t j = i - begin;
  if (j >= 0 && j < n) return j;
  switch (mode) {
    case PadMode::kConstant:
      return -1;
    case PadMode::kEdge:
      return j < 0 ? 0 : n - 1;
    case PadMode::kWrap:
      j %= n;
      return j < 0 ? j + n : j;
    case PadMode::kReflect: {
      if (n == 1) return 0;
      const int64_t period = 2 * (n - 1);
      j %= period;
      if (j < 0) j += period;
      return j < n ? j : period - j;
    }
  }
  return -1;
}

template <typename T>
void padLoop(const PadState& state, const std::array<int64_t, kMaxRank>& begin, const std::byte* x_bytes,
             const std::byte* value_bytes, std::byte* y_bytes) {
  if (state.empty) return;
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  T value;
  std::memcpy(&value, value_bytes, sizeof value);
  const uint32_t rank = state.rank;
  if (rank == 0) {
    *y = *x;
    return;
  }
  const uint32_t last = rank - 1;
  const int64_t n_out = state.out_dims[last];
  const int64_t n_in = state.in_dims[last];
  const int64_t b = begin[last];
  const PadMode mode = state.mode;
  // The output range that copies the input row as it is.
  const int64_t lo = std::clamp<int64_t>(b, 0, n_out);
  const int64_t hi = std::clamp<int64_t>(b + n_in, 0, n_out);
  std::array<int64_t, kMaxRank> strides{};
  int64_t stride = 1;
  for (uint32_t d = rank; d-- > 0;) {
    strides[d] = stride;
    stride *= state.in_dims[d];
  }
  int64_t rows = 1;
  for (uint32_t d = 0; d < last; ++d) rows *= state.out_dims[d];
  std::array<int64_t, kMaxRank> index{};
  for (int64_t row = 0; row < rows; ++row) {
    T* out = y + row * n_out;
    int64_t offset = 0;
    bool inside = true;
    for (uint32_t d = 0; d < last; ++d) {
      const int64_t source = padSource(mode, index[d], begin[d], state.in_dims[d]);
      if (source < 0) {
        inside = false;
        break;
      }
      offset += source * strides[d];
    }
    if (!inside || n_in == 0) {
      for (int64_t i = 0; i < n_out; ++i) out[i] = value;
    } else {
      const T* in = x + offset;
      for (int64_t i = 0; i < lo; ++i) {
        const int64_t source = padSource(mode, i, b, n_in);
        out[i] = source < 0 ? value : in[source];
      }
      if (hi > lo) std::memcpy(out + lo, in + (lo - b), static_cast<size_t>(hi - lo) * sizeof(T));
      for (int64_t i = std::max(hi, lo); i < n_out; ++i) {
        const int64_t source = padSource(mode, i, b, n_in);
        out[i] = source < 0 ? value : in[source];
      }
    }
    for (uint32_t d = last; d-- > 0;) {
      if (++index[d] < state.out_dims[d]) break;
      index[d] = 0;
    }
  }
}

// The pads before each dimension, from pads (2 * count entries) and axes;
// false when they are invalid or do not give the output shape.
template <typename Get>
bool resolvePads(const PadState& state, uint64_t pad_count, bool has_axes, uint64_t axes_count, Get get,
                 std::array<int64_t, kMaxRank>& begin, std::array<int64_t, kMaxRank>& end) {
  const uint32_t rank = state.rank;
  begin.fill(0);
  end.fill(0);
  const uint64_t count = has_axes ? axes_count : rank;
  if (pad_count != 2 * count) return false;
  for (uint64_t i = 0; i < count; ++i) {
    int64_t axis = has_axes ? get(3, i) : static_cast<int64_t>(i);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= static_cast<int64_t>(rank)) return false;
    begin[static_cast<size_t>(axis)] = get(1, i);
    end[static_cast<size_t>(axis)] = get(1, i + count);
  }
  for (uint32_t d = 0; d < rank; ++d) {
    // A pad removes at most the input and adds at most the output, so that
    // every output index minus its begin pad fits (padSource): pads of
    // -2^63 that another sum cancels are refused, not wrapped.
    const int64_t in = state.in_dims[d], out = state.out_dims[d];
    if (begin[d] < -in || begin[d] > out || end[d] < -in || end[d] > out) return false;
    // in + begin + end, which vast pads may take past int64.
    const std::optional<int64_t> padded = checkedAdd(in, begin[d]);
    const std::optional<int64_t> sum = padded ? checkedAdd(*padded, end[d]) : std::nullopt;
    if (sum != out) return false;
    // reflect and edge need an element to repeat; reflect also no more pad than it has.
    if (state.mode != PadMode::kConstant && state.out_dims[d] > 0 && state.in_dims[d] == 0) return false;
  }
  return true;
}

std::unique_ptr<KernelState> preparePad(const KernelSetup& setup) {
  expectCounts("Pad", setup, 1, 4);
  expectStatic("Pad", setup);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  refuseElementSize("Pad", x.dtype);
  if (y.dtype != x.dtype || y.shape.size() != x.shape.size()) {
    throw UsageError(fmt::format("Pad: output {} does not match input {}", typeString(y), typeString(x)));
  }
  auto state = std::make_unique<PadState>();
  const std::string mode = setup.params.getString("mode", "constant");
  if (mode == "constant") {
    state->mode = PadMode::kConstant;
  } else if (mode == "reflect") {
    state->mode = PadMode::kReflect;
  } else if (mode == "edge") {
    state->mode = PadMode::kEdge;
  } else if (mode == "wrap") {
    state->mode = PadMode::kWrap;
  } else {
    throw UsageError(fmt::format("Pad: mode is '{}', expected 'constant', 'reflect', 'edge' or 'wrap'", mode));
  }
  state->rank = static_cast<uint32_t>(x.shape.size());
  for (uint32_t d = 0; d < state->rank; ++d) {
    state->in_dims[d] = x.shape[d];
    state->out_dims[d] = y.shape[d];
    if (y.shape[d] == 0) state->empty = true;
  }
  // The constant: input 2, or attribute value (opset < 11); 0 by default.
  const size_t element = dtypeSize(x.dtype);
  if (present(setup, 2)) {
    const TensorInfo& value = setup.inputs[2];
    if (value.dtype != x.dtype || value.numElements() != 1) {
      throw UsageError(fmt::format("Pad: constant_value must be one {} element, got {}", dtypeName(x.dtype),
                                   typeString(value)));
    }
    if (constantInput(setup, 2) != nullptr) {
      std::memcpy(state->value.data(), constantInput(setup, 2), element);
    } else {
      state->value_from_call = true;
    }
  } else if (setup.params.has("value")) {
    const double value = setup.params.getFloat("value", 0);
    if (x.dtype == DType::kF32) {
      const float f = static_cast<float>(value);
      std::memcpy(state->value.data(), &f, sizeof f);
    } else if (x.dtype == DType::kF64) {
      std::memcpy(state->value.data(), &value, sizeof value);
    } else if (value != 0) {
      throw UsageError(fmt::format("Pad: attribute value needs f32 or f64 data, got {}", dtypeName(x.dtype)));
    }
  }
  std::array<std::vector<int64_t>, 4> values;
  bool constant = true;
  uint64_t pad_count = 0;
  uint64_t axes_count = 0;
  if (setup.inputs.size() == 1 || !present(setup, 1)) {
    values[1] = setup.params.getInts("pads", {});
    if (!setup.params.has("pads")) throw UsageError("Pad: needs pads");
    pad_count = values[1].size();
  } else {
    expectIntInput("Pad", setup, 1, "pads");
    pad_count = setup.inputs[1].numElements();
    if (constantInput(setup, 1) != nullptr) {
      values[1] = constantInts(setup, 1);
    } else {
      constant = false;
    }
    if (present(setup, 3)) {
      expectIntInput("Pad", setup, 3, "axes");
      state->axes_given = true;
      axes_count = setup.inputs[3].numElements();
      if (constantInput(setup, 3) != nullptr) {
        values[3] = constantInts(setup, 3);
      } else {
        constant = false;
      }
    }
  }
  if (pad_count != 2 * (state->axes_given ? axes_count : state->rank)) {
    throw UsageError(fmt::format("Pad: pads has {} entries, expected {}", pad_count,
                                 2 * (state->axes_given ? axes_count : state->rank)));
  }
  if (constant) {
    std::array<int64_t, kMaxRank> end{};
    if (!resolvePads(*state, pad_count, state->axes_given, axes_count,
                     [&](int input, uint64_t i) { return values[static_cast<size_t>(input)][i]; }, state->begin, end)) {
      throw UsageError(fmt::format("Pad: pads [{}] do not take input {} to output {}", fmt::join(values[1], ", "),
                                   typeString(x), typeString(y)));
    }
  } else {
    state->pads_from_call = true;
  }
  state->loop = withElementSize(element, [](auto t) -> PadState::Loop { return &padLoop<decltype(t)>; });
  return state;
}

void runPad(const KernelCall& call) {
  const auto& state = static_cast<const PadState&>(*call.state);
  const std::byte* value = state.value_from_call ? call.inputs[2].data : state.value.data();
  if (!state.pads_from_call) {
    state.loop(state, state.begin, call.inputs[0].data, value, call.outputs[0].data);
    return;
  }
  std::array<int64_t, kMaxRank> begin{};
  std::array<int64_t, kMaxRank> end{};
  const bool has_axes = state.axes_given;
  const uint64_t axes_count = has_axes ? call.inputs[3].numElements() : 0;
  if (!resolvePads(state, call.inputs[1].numElements(), has_axes, axes_count,
                   [&](int input, uint64_t i) { return readInt(call.inputs[input].data, call.inputs[input].dtype, i); },
                   begin, end)) {
    // The output would be left unwritten: refuse the call instead.
    throw UsageError("Pad: the pads given at run time do not take the input to the output's shape");
  }
  state.loop(state, begin, call.inputs[0].data, value, call.outputs[0].data);
}

// ------------------------------------------------------------------ Resize

enum class CoordinateMode { kHalfPixel, kPytorchHalfPixel, kAlignCorners, kAsymmetric, kTfHalfPixelForNearest };
enum class NearestMode { kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };

// Resizes the last two dimensions of a tensor seen as [planes, H, W], or,
// for kiln.NhwcResize, the middle two of [planes, H, W, inner].
struct ResizeState final : KernelState {
  int64_t inner = 1;  // elements per pixel: 1, or the channels of kiln.NhwcResize
  bool linear = false;
  CoordinateMode coordinates = CoordinateMode::kHalfPixel;
  NearestMode nearest = NearestMode::kRoundPreferFloor;
  DType dtype = DType::kF32;
  size_t element_size = 4;
  int64_t planes = 1;
  int64_t in_h = 1, in_w = 1, out_h = 1, out_w = 1;
  double scale_h = 1, scale_w = 1;
  int scales_input = -1;  // >= 0: read the scales from this input at run
  uint32_t rank = 0;
  // Per output row and column, when the scales are known at prepare:
  // nearest: the source index; linear: the two sources and the weight of the second.
  std::vector<int64_t> row0, row1, col0, col1;
  std::vector<float> row_w, col_w;
  // What this 2-D kernel does not do runs in resize_general.cc's kernel.
  std::unique_ptr<KernelState> general;
};

double sourceCoordinate(CoordinateMode mode, int64_t i, double scale, int64_t in, int64_t out) {
  const double x = static_cast<double>(i);
  switch (mode) {
    case CoordinateMode::kHalfPixel:
      return (x + 0.5) / scale - 0.5;
    case CoordinateMode::kPytorchHalfPixel:
      return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
    case CoordinateMode::kAlignCorners:
      return out == 1 ? 0.0 : x * static_cast<double>(in - 1) / static_cast<double>(out - 1);
    case CoordinateMode::kAsymmetric:
      return x / scale;
    case CoordinateMode::kTfHalfPixelForNearest:
      return (x + 0.5) / scale;
  }
  return 0;
}

// The source of output index `i` along one axis: i0, i1 and the weight of i1.
void axisSource(const ResizeState& state, int64_t i, double scale, int64_t in, int64_t out, int64_t& i0, int64_t& i1,
                float& w) {
  const double x = sourceCoordinate(state.coordinates, i, scale, in, out);
  if (!state.linear) {
    double r = 0;
    switch (state.nearest) {
      case NearestMode::kRoundPreferFloor:
        r = x - std::floor(x) == 0.5 ? std::floor(x) : std::round(x);
        break;
      case NearestMode::kRoundPreferCeil:
        r = x - std::floor(x) == 0.5 ? std::ceil(x) : std::round(x);
        break;
      case NearestMode::kFloor:
        r = std::floor(x);
        break;
      case NearestMode::kCeil:
        r = std::ceil(x);
        break;
    }
    i0 = std::clamp<int64_t>(static_cast<int64_t>(std::clamp(r, -1.0, static_cast<double>(in))), 0, in - 1);
    i1 = i0;
    w = 0;
    return;
  }
  const double clamped = std::clamp(x, 0.0, static_cast<double>(in - 1));
  const double f = std::floor(clamped);
  i0 = static_cast<int64_t>(f);
  i1 = std::min(i0 + 1, in - 1);
  w = static_cast<float>(clamped - f);
}

// Output rows [begin, end) of all planes (row r is row r % out_h of plane
// r / out_h). A nearest row whose source row is the one before's is a copy
// of the output row before it (each row of a 2x upsampling: half the work).
template <typename T>
void resizeRows(const ResizeState& state, double scale_h, double scale_w, const T* x, T* y, int64_t begin,
                int64_t end) {
  const bool tables = !state.row0.empty() || state.out_h == 0;
  const int64_t inner = state.inner;
  const int64_t in_plane = state.in_h * state.in_w * inner;
  const int64_t out_row = state.out_w * inner;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t plane = r / state.out_h;
    const int64_t oy = r % state.out_h;
    T* out = y + r * out_row;
    if (!state.linear && tables && r > begin && oy > 0 &&
        state.row0[static_cast<size_t>(oy)] == state.row0[static_cast<size_t>(oy - 1)]) {
      std::copy_n(out - out_row, out_row, out);
      continue;
    }
    int64_t y0, y1;
    float wy;
    if (tables) {
      y0 = state.row0[static_cast<size_t>(oy)];
      y1 = state.row1[static_cast<size_t>(oy)];
      wy = state.row_w[static_cast<size_t>(oy)];
    } else {
      axisSource(state, oy, scale_h, state.in_h, state.out_h, y0, y1, wy);
    }
    const T* r0 = x + plane * in_plane + y0 * state.in_w * inner;
    const T* r1 = x + plane * in_plane + y1 * state.in_w * inner;
    for (int64_t ox = 0; ox < state.out_w; ++ox) {
      int64_t x0, x1;
      float wx;
      if (tables) {
        x0 = state.col0[static_cast<size_t>(ox)];
        x1 = state.col1[static_cast<size_t>(ox)];
        wx = state.col_w[static_cast<size_t>(ox)];
      } else {
        axisSource(state, ox, scale_w, state.in_w, state.out_w, x0, x1, wx);
      }
      if constexpr (std::is_floating_point_v<T>) {
        if (state.linear) {
          using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
          for (int64_t k = 0; k < inner; ++k) {
            const T* a = r0 + k;
            const T* b = r1 + k;
            const C top = a[x0 * inner] + static_cast<C>(wx) * (a[x1 * inner] - a[x0 * inner]);
            const C bottom = b[x0 * inner] + static_cast<C>(wx) * (b[x1 * inner] - b[x0 * inner]);
            out[ox * inner + k] = static_cast<T>(top + static_cast<C>(wy) * (bottom - top));
          }
          continue;
        }
      }
      std::copy_n(r0 + x0 * inner, inner, out + ox * inner);
    }
  }
}

// Every output row, split across the threads (parallel.h).
template <typename T>
void resizeLoop(const ResizeState& state, double scale_h, double scale_w, const std::byte* x_bytes,
                std::byte* y_bytes) {
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  parallelForItems(state.planes * state.out_h, state.out_w * state.inner * (state.linear ? 4 : 1),
                   [&](int64_t begin, int64_t end) { resizeRows(state, scale_h, scale_w, x, y, begin, end); });
}

// `channels_last`: the data are [N, H, W, C] in memory while `setup`
// describes them in NCHW (kiln.NhwcResize; see channels_last.h).
std::unique_ptr<KernelState> prepareResize(const KernelSetup& setup, bool channels_last) {
  expectCounts("Resize", setup, 1, 4);
  expectStatic("Resize", setup);
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& y = setup.outputs[0];
  auto state = std::make_unique<ResizeState>();
  if (needsGeneralResize(setup)) {
    state->general = prepareGeneralResize(setup, channels_last);
    return state;
  }
  const std::string mode = setup.params.getString("mode", "nearest");
  if (mode == "linear" || mode == "bilinear") {
    state->linear = true;
  } else if (mode != "nearest") {
    throw UsageError(fmt::format("Resize: mode '{}' is not supported (nearest, linear)", mode));
  }
  const std::string coordinates = setup.params.getString("coordinate_transformation_mode", "half_pixel");
  if (coordinates == "half_pixel") {
    state->coordinates = CoordinateMode::kHalfPixel;
  } else if (coordinates == "pytorch_half_pixel") {
    state->coordinates = CoordinateMode::kPytorchHalfPixel;
  } else if (coordinates == "align_corners") {
    state->coordinates = CoordinateMode::kAlignCorners;
  } else if (coordinates == "asymmetric") {
    state->coordinates = CoordinateMode::kAsymmetric;
  } else if (coordinates == "tf_half_pixel_for_nearest") {
    state->coordinates = CoordinateMode::kTfHalfPixelForNearest;
  } else {
    throw UsageError(fmt::format("Resize: coordinate_transformation_mode '{}' is not supported", coordinates));
  }
  const std::string nearest = setup.params.getString("nearest_mode", "round_prefer_floor");
  if (nearest == "round_prefer_floor") {
    state->nearest = NearestMode::kRoundPreferFloor;
  } else if (nearest == "round_prefer_ceil") {
    state->nearest = NearestMode::kRoundPreferCeil;
  } else if (nearest == "floor") {
    state->nearest = NearestMode::kFloor;
  } else if (nearest == "ceil") {
    state->nearest = NearestMode::kCeil;
  } else {
    throw UsageError(fmt::format("Resize: nearest_mode '{}' is not supported", nearest));
  }
  if (setup.params.getInt("antialias", 0) != 0) throw UsageError("Resize: antialias is not supported");
  if (setup.params.has("axes")) throw UsageError("Resize: the attribute axes is not supported");
  if (setup.params.getString("keep_aspect_ratio_policy", "stretch") != "stretch") {
    throw UsageError("Resize: keep_aspect_ratio_policy other than 'stretch' is not supported");
  }
  if (x.shape.size() < 2) throw UsageError(fmt::format("Resize: needs rank 2 or more, got {}", typeString(x)));
  if (state->linear) {
    if (x.dtype != DType::kF32 && x.dtype != DType::kF64) {
      throw UsageError(fmt::format("Resize: linear mode needs f32 or f64 data, got {}", dtypeName(x.dtype)));
    }
  } else {
    refuseElementSize("Resize", x.dtype);
  }
  const size_t rank = x.shape.size();
  if (y.dtype != x.dtype || y.shape.size() != rank) {
    throw UsageError(fmt::format("Resize: output {} does not match input {}", typeString(y), typeString(x)));
  }
  for (size_t d = 0; d + 2 < rank; ++d) {
    if (y.shape[d] != x.shape[d]) {
      throw UsageError(fmt::format("Resize: only the last two dimensions can change: input {}, output {}",
                                   typeString(x), typeString(y)));
    }
  }
  state->dtype = x.dtype;
  state->element_size = dtypeSize(x.dtype);
  state->rank = static_cast<uint32_t>(rank);
  state->planes = product(x.shape, 0, rank - 2);
  if (channels_last) {  // [N, C, H, W] seen as N planes of H x W pixels of C
    state->planes = x.shape[0];
    state->inner = x.shape[1];
  }
  state->in_h = x.shape[rank - 2];
  state->in_w = x.shape[rank - 1];
  state->out_h = y.shape[rank - 2];
  state->out_w = y.shape[rank - 1];
  if ((state->in_h == 0 || state->in_w == 0) && state->out_h * state->out_w * state->planes != 0) {
    throw UsageError(fmt::format("Resize: cannot resize the empty input {}", typeString(x)));
  }
  // Opset 10: (X, scales). Opset 11+: (X, roi, scales, sizes).
  const int scales_index = setup.inputs.size() == 2 ? 1 : 2;
  const bool has_sizes = present(setup, 3) && setup.inputs[3].numElements() > 0;
  const bool has_scales =
      present(setup, static_cast<size_t>(scales_index)) && setup.inputs[static_cast<size_t>(scales_index)].numElements() > 0;
  if (!has_sizes && !has_scales) throw UsageError("Resize: needs scales or sizes");
  if (!has_sizes) {
    const TensorInfo& scales = setup.inputs[static_cast<size_t>(scales_index)];
    if (scales.dtype != DType::kF32 && scales.dtype != DType::kF64) {
      throw UsageError(fmt::format("Resize: scales must be f32, got {}", dtypeName(scales.dtype)));
    }
    if (scales.numElements() != rank) {
      throw UsageError(fmt::format("Resize: scales has {} entries for an input of rank {}", scales.numElements(), rank));
    }
    const std::byte* bytes = constantInput(setup, static_cast<size_t>(scales_index));
    if (bytes == nullptr) {
      state->scales_input = scales_index;
    } else {
      for (size_t d = 0; d < rank; ++d) {
        const double s = readFloat(bytes, scales.dtype, d);
        if (!(s > 0)) throw UsageError(fmt::format("Resize: scale {} of dimension {} is not positive", s, d));
        if (d + 2 < rank && s != 1) {
          throw UsageError(fmt::format("Resize: only the last two dimensions can be scaled, dimension {} has scale {}",
                                       d, s));
        }
        const double scaled = std::floor(static_cast<double>(x.shape[d]) * s);
        const int64_t want = scaled < 9.2e18 ? static_cast<int64_t>(scaled) : -1;  // no int64: matches no output
        if (want != y.shape[d]) {
          throw UsageError(fmt::format("Resize: scale {} takes dimension {} from {} to {}, the output has {}", s, d,
                                       x.shape[d], want, y.shape[d]));
        }
      }
      state->scale_h = readFloat(bytes, scales.dtype, rank - 2);
      state->scale_w = readFloat(bytes, scales.dtype, rank - 1);
    }
  } else {
    expectIntInput("Resize", setup, 3, "sizes");
    if (constantInput(setup, 3) != nullptr) {
      const std::vector<int64_t> sizes = constantInts(setup, 3);
      if (sizes != y.shape) {
        throw UsageError(fmt::format("Resize: sizes {} differ from the output {}", shapeString(sizes), typeString(y)));
      }
    }
    state->scale_h = state->in_h == 0 ? 1 : static_cast<double>(state->out_h) / static_cast<double>(state->in_h);
    state->scale_w = state->in_w == 0 ? 1 : static_cast<double>(state->out_w) / static_cast<double>(state->in_w);
  }
  // The per-axis source tables; none for an empty output, whose other axes
  // may be huge (nothing runs then).
  if (state->scales_input < 0 && y.numElements() != 0) {
    auto table = [&](int64_t out, int64_t in, double scale, std::vector<int64_t>& i0s, std::vector<int64_t>& i1s,
                     std::vector<float>& ws) {
      for (int64_t i = 0; i < out; ++i) {
        int64_t i0, i1;
        float w;
        axisSource(*state, i, scale, in, out, i0, i1, w);
        i0s.push_back(i0);
        i1s.push_back(i1);
        ws.push_back(w);
      }
    };
    table(state->out_h, state->in_h, state->scale_h, state->row0, state->row1, state->row_w);
    table(state->out_w, state->in_w, state->scale_w, state->col0, state->col1, state->col_w);
  }
  return state;
}

void runResize(const KernelCall& call) {
  const auto& state = static_cast<const ResizeState&>(*call.state);
  if (call.outputs[0].numElements() == 0) return;
  if (state.general) {
    KernelCall general = call;
    general.state = state.general.get();
    runGeneralResize(general);
    return;
  }
  if (state.planes * state.inner * state.out_h * state.out_w == 0) return;
  double scale_h = state.scale_h;
  double scale_w = state.scale_w;
  if (state.scales_input >= 0) {
    const TensorView& scales = call.inputs[state.scales_input];
    scale_h = readFloat(scales.data, scales.dtype, state.rank - 2);
    scale_w = readFloat(scales.data, scales.dtype, state.rank - 1);
    if (!(scale_h > 0) || !(scale_w > 0)) return;
  }
  const std::byte* x = call.inputs[0].data;
  std::byte* y = call.outputs[0].data;
  if (state.linear) {
    if (state.dtype == DType::kF64) {
      resizeLoop<double>(state, scale_h, scale_w, x, y);
    } else {
      resizeLoop<float>(state, scale_h, scale_w, x, y);
    }
    return;
  }
  withElementSize(state.element_size, [&](auto t) { resizeLoop<decltype(t)>(state, scale_h, scale_w, x, y); });
}

std::unique_ptr<KernelState> prepareNchwResize(const KernelSetup& setup) { return prepareResize(setup, false); }

}  // namespace

std::optional<ResizeTables> resizeTables(const KernelSetup& setup) {
  const std::unique_ptr<KernelState> prepared = prepareResize(setup, false);
  const auto& state = static_cast<const ResizeState&>(*prepared);
  if (state.general || state.scales_input >= 0) return std::nullopt;
  ResizeTables tables;
  tables.linear = state.linear;
  tables.dtype = state.dtype;
  tables.planes = state.planes;
  tables.in_h = state.in_h;
  tables.in_w = state.in_w;
  tables.out_h = state.out_h;
  tables.out_w = state.out_w;
  tables.row0 = state.row0;
  tables.row1 = state.row1;
  tables.col0 = state.col0;
  tables.col1 = state.col1;
  tables.row_w = state.row_w;
  tables.col_w = state.col_w;
  return tables;
}

namespace {

std::unique_ptr<KernelState> prepareNhwcResize(const KernelSetup& setup) {
  const NchwSetup nchw("kiln.NhwcResize", setup);
  return prepareResize(nchw.get(), /*channels_last=*/true);
}

// Upsample (opsets 7 to 9) is Resize with asymmetric coordinates and
// nearest rounding down; opset 7 gives its scales as an attribute, which
// becomes a constant input here.
std::unique_ptr<KernelState> prepareUpsample(const KernelSetup& setup) {
  ParamMap params = setup.params;
  params.set("coordinate_transformation_mode", std::string("asymmetric"));
  params.set("nearest_mode", std::string("floor"));
  if (setup.inputs.size() != 1) return prepareResize(KernelSetup{params, setup.inputs, setup.outputs, setup.constants}, false);
  std::vector<float> scales;
  for (double scale : setup.params.getFloats("scales", {})) scales.push_back(static_cast<float>(scale));
  const std::array<TensorInfo, 2> inputs{setup.inputs[0], TensorInfo{DType::kF32, {static_cast<int64_t>(scales.size())}}};
  const std::array<const std::byte*, 2> constants{nullptr, reinterpret_cast<const std::byte*>(scales.data())};
  return prepareResize(KernelSetup{params, inputs, setup.outputs, constants}, false);
}

}  // namespace

void registerDataMovementKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Transpose", &prepareTranspose, &runCopyPlan});
  registry.add(KernelDef{"Concat", &prepareConcat, &runConcat});
  registry.add(KernelDef{"kiln.QLinearConcat", &prepareQLinearConcat, &runQLinearConcat});
  registry.add(KernelDef{"Split", &prepareSplit, &runSplit});
  registry.add(KernelDef{"Slice", &prepareSlice, &runSlice});
  registry.add(KernelDef{"Gather", &prepareGather, &runGather});
  registry.add(KernelDef{"Expand", &prepareExpand, &runCopyPlan});
  registry.add(KernelDef{"Tile", &prepareTile, &runCopyPlan});
  registry.add(KernelDef{"Where", &prepareWhere, &runWhere});
  registry.add(KernelDef{"Pad", &preparePad, &runPad});
  registry.add(KernelDef{"Resize", &prepareNchwResize, &runResize});
  registry.add(KernelDef{"Upsample", &prepareUpsample, &runResize});
  registry.add(KernelDef{"kiln.NhwcResize", &prepareNhwcResize, &runResize});
}

}  // namespace kiln
