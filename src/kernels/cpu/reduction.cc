// Reduction CPU kernels with ONNX semantics: ReduceSum, ReduceMean,
// ReduceMax, ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceSumSquare,
// ReduceLogSum, ReduceLogSumExp, and ArgMax / ArgMin.
//
// prepare merges adjacent input dimensions that are all kept or all reduced
// (dropping those of size 1), so the input reads as alternating kept (K) and
// reduced (R) groups: [K R] (rows), [R K] (columns), [K R K] and so on. run
// walks the input once, in memory order, one innermost group at a time:
//   innermost R: each row folds into one output element, with kBlock
//                independent partial results (vectorises; more accurate sums);
//   innermost K: each row folds elementwise into a row of the output.
// The output starts at the op's identity and ends with its finishing step
// (the mean's division, the L2's square root). In f32 the common ops fold
// with the vector kernels (vector_kernels.h) instead: see VectorForm. A
// large [K R] input splits its rows across threads (parallel.h).
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
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/setup_helpers.h"
#include "kernels/cpu/vector_kernels.h"
#include "kernels/kernel.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr int64_t kBlock = 16;

using setup_helpers::reduceAxes;
using setup_helpers::typeString;

// Sums of integers wrap (core/wrapping_arithmetic.h); of floats, round.
template <typename T>
T sumStep(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return wrapAdd(a, b);
  } else {
    return a + b;
  }
}
template <typename T>
T productStep(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return wrapMul(a, b);
  } else {
    return a * b;
  }
}

// Which f32 vector kernels fold an op: a reduced row with sum, sumSquares
// (centred on 0), max or min, and a kept row with the binary Add, Max or Min
// (none for sums of squares).
enum class VectorForm { kNone, kSum, kSumSquares, kMax, kMin };

// Each op: its name, whether it takes integers, its identity, the map applied
// to each element, how two partial results combine, the finishing step
// (given how many elements each output folded), and its VectorForm. An op
// deriving from another and changing its map or combine restates kVector.
struct Sum {
  static constexpr std::string_view kName = "ReduceSum";
  static constexpr bool kIntegers = true;
  static constexpr bool kBools = false;  // Max and Min of bools: any and all
  static constexpr VectorForm kVector = VectorForm::kSum;
  template <typename T>
  static T identity() {
    return T(0);
  }
  template <typename T>
  static T map(T x) {
    return x;
  }
  template <typename T>
  static T combine(T a, T b) {
    return sumStep(a, b);
  }
  template <typename T>
  static T finish(T a, int64_t) {
    return a;
  }
};
struct Mean : Sum {
  static constexpr std::string_view kName = "ReduceMean";
  static constexpr bool kIntegers = false;
  template <typename T>
  static T finish(T a, int64_t n) {
    return a / static_cast<T>(n);  // 0 / 0 = NaN for an empty reduction, as numpy
  }
};
struct SumSquare : Sum {
  static constexpr std::string_view kName = "ReduceSumSquare";
  static constexpr bool kIntegers = false;
  static constexpr VectorForm kVector = VectorForm::kSumSquares;
  template <typename T>
  static T map(T x) {
    return x * x;
  }
};
struct L2 : SumSquare {
  static constexpr std::string_view kName = "ReduceL2";
  template <typename T>
  static T finish(T a, int64_t) {
    return std::sqrt(a);
  }
};
struct L1 : Sum {
  static constexpr std::string_view kName = "ReduceL1";
  static constexpr bool kIntegers = false;
  static constexpr VectorForm kVector = VectorForm::kNone;
  template <typename T>
  static T map(T x) {
    return std::abs(x);
  }
};
struct LogSum : Sum {
  static constexpr std::string_view kName = "ReduceLogSum";
  static constexpr bool kIntegers = false;
  template <typename T>
  static T finish(T a, int64_t) {
    return std::log(a);
  }
};
// log(sum(exp(x))), without shifting by the maximum: as ONNX's reference,
// so exp overflows where it does.
struct LogSumExp : Sum {
  static constexpr std::string_view kName = "ReduceLogSumExp";
  static constexpr bool kIntegers = false;
  static constexpr VectorForm kVector = VectorForm::kNone;
  template <typename T>
  static T map(T x) {
    return std::exp(x);
  }
  template <typename T>
  static T finish(T a, int64_t) {
    return std::log(a);
  }
};
struct Prod : Sum {
  static constexpr std::string_view kName = "ReduceProd";
  static constexpr bool kIntegers = true;
  static constexpr VectorForm kVector = VectorForm::kNone;
  template <typename T>
  static T identity() {
    return T(1);
  }
  template <typename T>
  static T combine(T a, T b) {
    return productStep(a, b);
  }
};
// Max and Min propagate NaN, as numpy's max and min do.
struct Max : Sum {
  static constexpr std::string_view kName = "ReduceMax";
  static constexpr bool kIntegers = true;
  static constexpr bool kBools = true;
  static constexpr VectorForm kVector = VectorForm::kMax;
  template <typename T>
  static T identity() {
    if constexpr (std::is_floating_point_v<T>) return -std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::lowest();
  }
  template <typename T>
  static T combine(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return a < b ? b : a;
    } else {
      return (a > b || a != a) ? a : b;
    }
  }
};
struct Min : Sum {
  static constexpr std::string_view kName = "ReduceMin";
  static constexpr bool kIntegers = true;
  static constexpr bool kBools = true;
  static constexpr VectorForm kVector = VectorForm::kMin;
  template <typename T>
  static T identity() {
    if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::infinity();
    return std::numeric_limits<T>::max();
  }
  template <typename T>
  static T combine(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return b < a ? b : a;
    } else {
      return (a < b || a != a) ? a : b;
    }
  }
};

// The merged input: `rank` groups, each kept or reduced, with the output
// stride of each (0 for a reduced group).
struct ReducePlan {
  uint32_t rank = 0;
  std::array<int64_t, kMaxRank> dims{};
  std::array<bool, kMaxRank> reduced{};
  std::array<int64_t, kMaxRank> out_strides{};
  int64_t out_count = 1;     // output elements
  int64_t reduce_count = 1;  // input elements per output element
  bool empty_input = false;
};

struct ReduceState final : KernelState {
  using Loop = void (*)(const ReducePlan& plan, const std::byte* x, std::byte* y);
  Loop loop = nullptr;
  ReducePlan plan;
  size_t copy_bytes = 0;  // noop_with_empty_axes: a copy
  bool copy = false;
};

template <typename Op, typename T>
T reduceRow(const T* x, int64_t n) {
  if constexpr (std::is_same_v<T, float> && Op::kVector != VectorForm::kNone) {
    const vec::VectorKernels& kernels = vec::vectorKernels();
    if constexpr (Op::kVector == VectorForm::kSum) return kernels.sum(x, n);
    if constexpr (Op::kVector == VectorForm::kSumSquares) return kernels.sumSquares(x, n, 0.0f);
    if constexpr (Op::kVector == VectorForm::kMax) return kernels.max(x, n);
    if constexpr (Op::kVector == VectorForm::kMin) return kernels.min(x, n);
  }
  int64_t i = 0;
  T acc = Op::template identity<T>();
  if (n >= kBlock) {
    T partial[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) partial[j] = Op::map(x[j]);
    for (i = kBlock; i + kBlock <= n; i += kBlock) {
      for (int64_t j = 0; j < kBlock; ++j) partial[j] = Op::combine(partial[j], Op::map(x[i + j]));
    }
    for (int64_t j = 0; j < kBlock; ++j) acc = Op::combine(acc, partial[j]);
  }
  for (; i < n; ++i) acc = Op::combine(acc, Op::map(x[i]));
  return acc;
}

// The binary vector kernel that folds a kept f32 row, if any.
template <typename Op>
constexpr std::optional<vec::Binary> vectorFold() {
  if (Op::kVector == VectorForm::kSum) return vec::Binary::kAdd;
  if (Op::kVector == VectorForm::kMax) return vec::Binary::kMax;
  if (Op::kVector == VectorForm::kMin) return vec::Binary::kMin;
  return std::nullopt;
}

template <typename Op, typename T>
void foldRow(T* __restrict y, const T* __restrict x, int64_t n) {
  if constexpr (std::is_same_v<T, float> && vectorFold<Op>().has_value()) {
    vec::vectorKernels().binaryFn(*vectorFold<Op>(), vec::Operands::kBoth)(y, x, y, n);
    return;
  }
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    T block[kBlock];
    for (int64_t j = 0; j < kBlock; ++j) block[j] = Op::combine(y[i + j], Op::map(x[i + j]));
    for (int64_t j = 0; j < kBlock; ++j) y[i + j] = block[j];
  }
  for (; i < n; ++i) y[i] = Op::combine(y[i], Op::map(x[i]));
}

template <typename Op, typename T>
void reduceLoop(const ReducePlan& plan, const std::byte* x_bytes, std::byte* y_bytes) {
  const T* x = reinterpret_cast<const T*>(x_bytes);
  T* y = reinterpret_cast<T*>(y_bytes);
  const T identity = Op::template identity<T>();
  for (int64_t i = 0; i < plan.out_count; ++i) y[i] = identity;
  if (!plan.empty_input && plan.rank == 2 && !plan.reduced[0] && plan.reduced[1]) {
    // [K R]: each output folds a row of its own, so the rows split across
    // threads.
    const int64_t n = plan.dims[1];
    parallelForItems(plan.dims[0], n, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) y[row] = Op::combine(y[row], reduceRow<Op>(x + row * n, n));
    });
  } else if (!plan.empty_input && plan.rank > 0) {
    const uint32_t last = plan.rank - 1;
    const int64_t n = plan.dims[last];
    const bool row_reduced = plan.reduced[last];
    int64_t rows = 1;
    for (uint32_t d = 0; d < last; ++d) rows *= plan.dims[d];
    std::array<int64_t, kMaxRank> index{};
    int64_t yo = 0;
    for (int64_t row = 0; row < rows; ++row) {
      const T* in = x + row * n;
      if (row_reduced) {
        y[yo] = Op::combine(y[yo], reduceRow<Op>(in, n));
      } else {
        foldRow<Op>(y + yo, in, n);
      }
      for (uint32_t d = last; d-- > 0;) {
        yo += plan.out_strides[d];
        if (++index[d] < plan.dims[d]) break;
        yo -= plan.out_strides[d] * plan.dims[d];
        index[d] = 0;
      }
    }
  } else if (!plan.empty_input) {
    y[0] = Op::combine(y[0], Op::map(x[0]));  // a scalar
  }
  for (int64_t i = 0; i < plan.out_count; ++i) y[i] = Op::finish(y[i], plan.reduce_count);
}

// Bools as bytes 0 and 1: Max is any, Min is all; an empty Min (whose
// identity is 255) is true.
template <typename Op>
void reduceBoolLoop(const ReducePlan& plan, const std::byte* x, std::byte* y_bytes) {
  reduceLoop<Op, uint8_t>(plan, x, y_bytes);
  auto* y = reinterpret_cast<uint8_t*>(y_bytes);
  for (int64_t i = 0; i < plan.out_count; ++i) y[i] = y[i] != 0;
}

// The reduced axes, normalised and sorted; from the attribute `axes` or a
// constant input 1.
template <typename Op>
std::unique_ptr<KernelState> prepareReduce(const KernelSetup& setup) {
  constexpr std::string_view op = Op::kName;
  if (setup.inputs.empty() || setup.inputs.size() > 2) {
    throw UsageError(fmt::format("{}: expects 1 to 2 inputs, got {}", op, setup.inputs.size()));
  }
  if (setup.outputs.size() != 1) throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  const TensorInfo& x = setup.inputs[0];
  const DType dtype = x.dtype;
  const bool integer = dtype == DType::kI32 || dtype == DType::kI64;
  if (!(dtype == DType::kF32 || dtype == DType::kF64 || (Op::kIntegers && integer) ||
        (Op::kBools && dtype == DType::kBool))) {
    throw UsageError(fmt::format("{}: no kernel for {} inputs (supports {})", op, dtypeName(dtype),
                                 Op::kIntegers ? "f32, f64, i32, i64" : "f32, f64"));
  }
  if (!x.isStatic()) throw UsageError(fmt::format("{}: needs static shapes, input 0 is {}", op, typeString(x)));
  const size_t rank = x.shape.size();
  std::vector<int64_t> axes = reduceAxes(op, setup, rank);
  const bool keepdims = setup.params.getInt("keepdims", 1) != 0;
  const bool noop = setup.params.getInt("noop_with_empty_axes", 0) != 0;
  auto state = std::make_unique<ReduceState>();
  if (axes.empty() && noop) {
    const TensorInfo expected{dtype, x.shape};
    if (setup.outputs[0] != expected) {
      throw UsageError(fmt::format("{}: output is {} but the inputs give {}", op, typeString(setup.outputs[0]),
                                   typeString(expected)));
    }
    state->copy = true;
    state->copy_bytes = x.sizeInBytes();
    return state;
  }
  std::vector<bool> reduced(rank, axes.empty());
  for (int64_t axis : axes) reduced[static_cast<size_t>(axis)] = true;
  std::vector<int64_t> out;
  for (size_t d = 0; d < rank; ++d) {
    if (!reduced[d]) {
      out.push_back(x.shape[d]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  const TensorInfo expected{dtype, out};
  if (setup.outputs[0] != expected) {
    throw UsageError(fmt::format("{}: output is {} but the inputs give {}", op, typeString(setup.outputs[0]),
                                 typeString(expected)));
  }
  ReducePlan& plan = state->plan;
  for (size_t d = 0; d < rank; ++d) {
    if (x.shape[d] == 0) plan.empty_input = true;
    if (reduced[d]) plan.reduce_count *= x.shape[d];
  }
  plan.out_count = static_cast<int64_t>(expected.numElements());
  for (size_t d = 0; d < rank; ++d) {
    if (x.shape[d] == 1) continue;
    if (plan.rank > 0 && plan.reduced[plan.rank - 1] == reduced[d]) {
      plan.dims[plan.rank - 1] *= x.shape[d];
      continue;
    }
    plan.dims[plan.rank] = x.shape[d];
    plan.reduced[plan.rank] = reduced[d];
    ++plan.rank;
  }
  int64_t stride = 1;
  for (uint32_t d = plan.rank; d-- > 0;) {
    plan.out_strides[d] = plan.reduced[d] ? 0 : stride;
    if (!plan.reduced[d]) stride *= plan.dims[d];
  }
  switch (dtype) {
    case DType::kF32:
      state->loop = &reduceLoop<Op, float>;
      break;
    case DType::kF64:
      state->loop = &reduceLoop<Op, double>;
      break;
    case DType::kI32:
      if constexpr (Op::kIntegers) state->loop = &reduceLoop<Op, int32_t>;
      break;
    case DType::kBool:
      if constexpr (Op::kBools) state->loop = &reduceBoolLoop<Op>;
      break;
    default:
      if constexpr (Op::kIntegers) state->loop = &reduceLoop<Op, int64_t>;
      break;
  }
  return state;
}

void runReduce(const KernelCall& call) {
  const auto& state = static_cast<const ReduceState&>(*call.state);
  if (state.copy) {
    if (state.copy_bytes != 0 && call.inputs[0].data != call.outputs[0].data) {
      std::memcpy(call.outputs[0].data, call.inputs[0].data, state.copy_bytes);
    }
    return;
  }
  state.loop(state.plan, call.inputs[0].data, call.outputs[0].data);
}

// ---------------------------------------------------------- ArgMax, ArgMin

struct ArgState final : KernelState {
  using Loop = void (*)(const ArgState& state, const std::byte* x, int64_t* y);
  Loop loop = nullptr;
  int64_t outer = 1;
  int64_t axis_dim = 1;
  int64_t inner = 1;
  bool last_index = false;
};

// True when v should replace the current best b (strictly better, or equal
// with select_last_index). NaN counts as the largest value for ArgMax and the
// smallest for ArgMin, and the first NaN wins, as in numpy.
template <bool kMax, typename T>
inline bool better(T v, T b, bool last_index) {
  if constexpr (std::is_floating_point_v<T>) {
    if (b != b) return false;
    if (v != v) return true;
  }
  if (last_index) return kMax ? v >= b : v <= b;
  return kMax ? v > b : v < b;
}

template <bool kMax, typename T>
void argLoop(const ArgState& state, const std::byte* x_bytes, int64_t* y) {
  const T* x = reinterpret_cast<const T*>(x_bytes);
  const int64_t dim = state.axis_dim;
  const int64_t inner = state.inner;
  const bool last = state.last_index;
  for (int64_t o = 0; o < state.outer; ++o) {
    const T* block = x + o * dim * inner;
    int64_t* out = y + o * inner;
    if (inner == 1) {
      int64_t best = 0;
      for (int64_t r = 1; r < dim; ++r) {
        if (better<kMax>(block[r], block[best], last)) best = r;
      }
      out[0] = best;
      continue;
    }
    for (int64_t k = 0; k < inner; ++k) out[k] = 0;
    for (int64_t r = 1; r < dim; ++r) {
      const T* row = block + r * inner;
      for (int64_t k = 0; k < inner; ++k) {
        if (better<kMax>(row[k], block[out[k] * inner + k], last)) out[k] = r;
      }
    }
  }
}

template <bool kMax>
std::unique_ptr<KernelState> prepareArg(const KernelSetup& setup) {
  constexpr std::string_view op = kMax ? "ArgMax" : "ArgMin";
  if (setup.inputs.size() != 1) throw UsageError(fmt::format("{}: expects 1 inputs, got {}", op, setup.inputs.size()));
  if (setup.outputs.size() != 1) throw UsageError(fmt::format("{}: expects 1 output, got {}", op, setup.outputs.size()));
  const TensorInfo& x = setup.inputs[0];
  if (!x.isStatic()) throw UsageError(fmt::format("{}: needs static shapes, input 0 is {}", op, typeString(x)));
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  int64_t axis = setup.params.getInt("axis", 0);
  if (rank == 0 || axis < -rank || axis >= rank) {
    throw UsageError(fmt::format("{}: axis {} is out of range for rank {}", op, axis, rank));
  }
  if (axis < 0) axis += rank;
  const size_t a = static_cast<size_t>(axis);
  if (x.shape[a] == 0) throw UsageError(fmt::format("{}: cannot reduce the empty axis {} of {}", op, axis, typeString(x)));
  const bool keepdims = setup.params.getInt("keepdims", 1) != 0;
  std::vector<int64_t> out;
  for (size_t d = 0; d < x.shape.size(); ++d) {
    if (d != a) {
      out.push_back(x.shape[d]);
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  const TensorInfo expected{DType::kI64, out};
  if (setup.outputs[0] != expected) {
    throw UsageError(fmt::format("{}: output is {} but the inputs give {}", op, typeString(setup.outputs[0]),
                                 typeString(expected)));
  }
  auto state = std::make_unique<ArgState>();
  state->axis_dim = x.shape[a];
  if (x.numElements() == 0) {
    // An empty dimension beside the axis: nothing to write, however vast the
    // others (their product could overflow, and the loop over them hang).
    state->outer = 0;
  } else {
    for (size_t d = 0; d < a; ++d) state->outer *= x.shape[d];
    for (size_t d = a + 1; d < x.shape.size(); ++d) state->inner *= x.shape[d];
  }
  state->last_index = setup.params.getInt("select_last_index", 0) != 0;
  switch (x.dtype) {
    case DType::kF32:
      state->loop = &argLoop<kMax, float>;
      break;
    case DType::kF64:
      state->loop = &argLoop<kMax, double>;
      break;
    case DType::kI32:
      state->loop = &argLoop<kMax, int32_t>;
      break;
    case DType::kI64:
      state->loop = &argLoop<kMax, int64_t>;
      break;
    default:
      throw UsageError(
          fmt::format("{}: no kernel for {} inputs (supports f32, f64, i32, i64)", op, dtypeName(x.dtype)));
  }
  return state;
}

void runArg(const KernelCall& call) {
  const auto& state = static_cast<const ArgState&>(*call.state);
  state.loop(state, call.inputs[0].data, call.outputs[0].as<int64_t>());
}

template <typename Op>
void addReduce(KernelRegistry& registry) {
  registry.add(KernelDef{std::string(Op::kName), &prepareReduce<Op>, &runReduce});
}

}  // namespace

void registerReductionKernels(KernelRegistry& registry) {
  addReduce<Sum>(registry);
  addReduce<Mean>(registry);
  addReduce<Max>(registry);
  addReduce<Min>(registry);
  addReduce<Prod>(registry);
  addReduce<L1>(registry);
  addReduce<L2>(registry);
  addReduce<SumSquare>(registry);
  addReduce<LogSum>(registry);
  addReduce<LogSumExp>(registry);
  registry.add(KernelDef{"ArgMax", &prepareArg<true>, &runArg});
  registry.add(KernelDef{"ArgMin", &prepareArg<false>, &runArg});
}

}  // namespace kiln
