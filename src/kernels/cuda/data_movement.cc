// Data movement on cuda: kiln.Copy and Identity (one device-to-device
// copy), Transpose, Slice and Expand (strided copies, specialized by the
// runtime compiler: copy_codegen.h), Gather, Cast, Where, Concat and Split
// (one launch for up to 16 pieces; beyond, one 2-D copy per piece: `outer`
// rows of a contiguous run each). Kernels in data_movement_kernels.cu. Slice needs its positions
// as constants (a slice computed at run time is declined, as are dtypes the
// kernels lack): declined steps run on the host.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "kernels/cpu/resize_tables.h"
#include "kernels/cpu/setup_helpers.h"
#include "kernels/cuda/copy_codegen.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_queue.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/post_ops.h"
#include "kernels/cuda/runtime_compiler.h"
#include "kernels/slice_positions.h"

namespace kiln::cuda {
namespace {

static_assert(static_cast<int>(CastType::kF32) == static_cast<int>(DType::kF32) &&
              static_cast<int>(CastType::kU8) == static_cast<int>(DType::kU8) &&
              static_cast<int>(CastType::kI8) == static_cast<int>(DType::kI8) &&
              static_cast<int>(CastType::kI32) == static_cast<int>(DType::kI32) &&
              static_cast<int>(CastType::kI64) == static_cast<int>(DType::kI64) &&
              static_cast<int>(CastType::kBool) == static_cast<int>(DType::kBool) &&
              static_cast<int>(CastType::kF16) == static_cast<int>(DType::kF16) &&
              static_cast<int>(CastType::kBF16) == static_cast<int>(DType::kBF16) &&
              static_cast<int>(CastType::kF64) == static_cast<int>(DType::kF64));

using setup_helpers::normalizeAxis;
using setup_helpers::present;
using setup_helpers::product;
using setup_helpers::readInt;

[[noreturn]] void decline(std::string_view op, const std::string& why) {
  throw KernelUnsupported(fmt::format("{} on cuda: {}", op, why));
}

int elementBytes(std::string_view op, DType dtype) {
  const size_t size = dtypeSize(dtype);
  if (size != 1 && size != 2 && size != 4 && size != 8) decline(op, fmt::format("{} elements", dtypeName(dtype)));
  return static_cast<int>(size);
}

// ---------------------------------------------------------------- copies

struct CopyState final : KernelState {
  uint64_t bytes = 0;
};

std::unique_ptr<KernelState> prepareCopy(const KernelSetup& setup) {
  auto state = std::make_unique<CopyState>();
  state->bytes = setup.outputs[0].sizeInBytes();
  return state;
}

void runCopy(const KernelCall& call) {
  const auto& s = *static_cast<const CopyState*>(call.state);
  if (s.bytes == 0 || call.inputs[0].data == call.outputs[0].data) return;
  cudaMemcpyAsync(call.outputs[0].data, call.inputs[0].data, s.bytes, cudaMemcpyDeviceToDevice,
                  queueOf(call.queue).stream);
}

// --------------------------------------------------- strided copies

// Runs on a kernel the runtime compiler specialized to the copy
// (copy_codegen.h) where it could make one, else on the built-in kernel.
struct StridedState final : KernelState {
  StridedCopy copy;
  uint64_t elements = 0;
  int element_bytes = 0;
  cudaKernel_t scalar_kernel = nullptr;  // kiln_copy_v1
  cudaKernel_t vector_kernel = nullptr;  // kiln_copy_v4
};

// Compiles the specialized kernels for a prepared copy (nothing when the
// runtime compiler is off or fails: the built-in kernel runs).
std::unique_ptr<KernelState> specialize(std::unique_ptr<StridedState> state, const KernelSetup& setup) {
  if (!runtimeCompilerEnabled()) return state;
  const std::optional<CopySource> source = stridedCopySource(state->copy, state->elements, state->element_bytes);
  if (!source) return state;
  std::vector<const char*> names = {"kiln_copy_v1"};
  if (source->vector_width == 4) names.push_back("kiln_copy_v4");
  std::string error;
  const std::vector<cudaKernel_t> kernels =
      compileKernels(source->text, names, queueOf(setup.queue).compute_capability, &error);
  if (kernels.empty()) return state;
  state->scalar_kernel = kernels[0];
  if (kernels.size() > 1) state->vector_kernel = kernels[1];
  return state;
}

// The row-major strides of `dims`.
std::vector<int64_t> stridesOf(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) strides[d - 1] = strides[d] * dims[d];
  return strides;
}

std::unique_ptr<StridedState> stridedState(std::string_view op, const KernelSetup& setup) {
  const TensorInfo& y = setup.outputs[0];
  if (y.shape.size() > kMaxCopyDims) decline(op, fmt::format("more than {} dimensions", kMaxCopyDims));
  auto state = std::make_unique<StridedState>();
  state->copy.rank = static_cast<int>(y.shape.size());
  for (size_t d = 0; d < y.shape.size(); ++d) state->copy.dims[d] = y.shape[d];
  state->elements = y.numElements();
  state->element_bytes = elementBytes(op, y.dtype);
  return state;
}

std::unique_ptr<KernelState> prepareTranspose(const KernelSetup& setup) {
  const std::vector<int64_t>& x = setup.inputs[0].shape;
  std::vector<int64_t> perm = setup.params.getInts("perm", {});
  if (perm.empty()) {
    for (size_t d = x.size(); d-- > 0;) perm.push_back(static_cast<int64_t>(d));
  }
  auto state = stridedState("Transpose", setup);
  const std::vector<int64_t> in_strides = stridesOf(x);
  for (size_t d = 0; d < perm.size(); ++d) state->copy.strides[d] = in_strides[static_cast<size_t>(perm[d])];
  return specialize(std::move(state), setup);
}

std::unique_ptr<KernelState> prepareExpand(const KernelSetup& setup) {
  const std::vector<int64_t>& x = setup.inputs[0].shape;
  auto state = stridedState("Expand", setup);
  const std::vector<int64_t> in_strides = stridesOf(x);
  const int offset = state->copy.rank - static_cast<int>(x.size());
  for (size_t d = 0; d < x.size(); ++d) {
    state->copy.strides[d + offset] = x[d] == 1 ? 0 : in_strides[d];
  }
  return specialize(std::move(state), setup);
}

std::unique_ptr<KernelState> prepareSlice(const KernelSetup& setup) {
  constexpr std::string_view op = "Slice";
  for (size_t i = 1; i < setup.inputs.size(); ++i) {
    if (present(setup, i) && setup.constants[i] == nullptr) decline(op, "positions known only at run time");
  }
  const TensorInfo& x = setup.inputs[0];
  if (x.shape.size() > kMaxCopyDims) decline(op, "too many dimensions");
  const auto rank = static_cast<uint32_t>(x.shape.size());
  std::array<int64_t, kMaxRank> in_dims{}, first{}, step{}, size{};
  for (uint32_t d = 0; d < rank; ++d) in_dims[d] = x.shape[d];
  const uint64_t count = setup.inputs[1].numElements();
  auto get = [&](int input, uint64_t i) { return readInt(setup.constants[input], setup.inputs[input].dtype, i); };
  if (!resolveSlice(rank, in_dims, count, present(setup, 3), present(setup, 4), get, first, step, size)) {
    throw UsageError("Slice: an axis is out of range or repeated, or a step is 0");
  }
  auto state = stridedState(op, setup);
  const std::vector<int64_t> in_strides = stridesOf(x.shape);
  for (uint32_t d = 0; d < rank; ++d) {
    if (size[d] != setup.outputs[0].shape[d]) throw UsageError("Slice: the positions give another output shape");
    state->copy.strides[d] = in_strides[d] * step[d];
    state->copy.offset += in_strides[d] * first[d];
  }
  return specialize(std::move(state), setup);
}

void runStrided(const KernelCall& call) {
  const auto& s = *static_cast<const StridedState*>(call.state);
  if (s.scalar_kernel != nullptr) {
    CopyArgs args{call.inputs[0].data, call.outputs[0].data};
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    const bool vector = s.vector_kernel != nullptr && aligned(args.y) &&
                        aligned(static_cast<const std::byte*>(args.x) + s.copy.offset * s.element_bytes);
    const uint64_t threads = vector ? s.elements / 4 : s.elements;
    void* parameters[] = {&args};
    cudaLaunchKernel(reinterpret_cast<const void*>(vector ? s.vector_kernel : s.scalar_kernel),
                     dim3(static_cast<unsigned>((threads + kCopyBlock - 1) / kCopyBlock)), dim3(kCopyBlock),
                     parameters, 0, queueOf(call.queue).stream);
    return;
  }
  launchStridedCopy(call.inputs[0].data, call.outputs[0].data, s.copy, s.elements, s.element_bytes,
                    queueOf(call.queue).stream);
}

// ------------------------------------------------------------------ Gather

struct GatherState final : KernelState {
  int64_t outer = 0, axis = 0, count = 0, inner = 0;
  int element_bytes = 0;
  bool indices_are_i64 = true;
};

std::unique_ptr<KernelState> prepareGather(const KernelSetup& setup) {
  const TensorInfo& x = setup.inputs[0];
  const TensorInfo& indices = setup.inputs[1];
  if (indices.dtype != DType::kI64 && indices.dtype != DType::kI32) decline("Gather", "indices that are not i32 or i64");
  const auto axis = static_cast<size_t>(normalizeAxis("Gather", setup.params.getInt("axis", 0), x.shape.size()));
  auto state = std::make_unique<GatherState>();
  state->outer = product(x.shape, 0, axis);
  state->axis = x.shape[axis];
  state->count = static_cast<int64_t>(indices.numElements());
  state->inner = product(x.shape, axis + 1, x.shape.size());
  state->element_bytes = elementBytes("Gather", x.dtype);
  state->indices_are_i64 = indices.dtype == DType::kI64;
  return state;
}

void runGather(const KernelCall& call) {
  const auto& s = *static_cast<const GatherState*>(call.state);
  launchGather(call.inputs[0].data, call.inputs[1].data, s.indices_are_i64, call.outputs[0].data, s.outer, s.axis,
               s.count, s.inner, s.element_bytes, queueOf(call.queue).stream);
}

// -------------------------------------------------------------------- Cast

struct CastState final : KernelState {
  uint8_t from = 0, to = 0;
  uint64_t elements = 0;
};

std::unique_ptr<KernelState> prepareCast(const KernelSetup& setup) {
  const DType from = setup.inputs[0].dtype, to = setup.outputs[0].dtype;
  if (!castSupported(static_cast<uint8_t>(from), static_cast<uint8_t>(to))) {
    decline("Cast", fmt::format("{} to {}", dtypeName(from), dtypeName(to)));
  }
  auto state = std::make_unique<CastState>();
  state->from = static_cast<uint8_t>(from);
  state->to = static_cast<uint8_t>(to);
  state->elements = setup.outputs[0].numElements();
  return state;
}

void runCast(const KernelCall& call) {
  const auto& s = *static_cast<const CastState*>(call.state);
  if (s.from == s.to) {
    cudaMemcpyAsync(call.outputs[0].data, call.inputs[0].data, s.elements * dtypeSize(DType(s.from)),
                    cudaMemcpyDeviceToDevice, queueOf(call.queue).stream);
    return;
  }
  launchCast(call.inputs[0].data, s.from, call.outputs[0].data, s.to, s.elements, queueOf(call.queue).stream);
}

// ------------------------------------------------------------------- Where

struct WhereState final : KernelState {
  WhereIndexing indexing;
  uint64_t elements = 0;
  int element_bytes = 4;
};

// The broadcast strides of every input of `setup` against its output.
WhereIndexing broadcastIndexing(std::string_view op, const KernelSetup& setup) {
  const TensorInfo& y = setup.outputs[0];
  if (y.shape.size() > kMaxCopyDims) decline(op, "too many dimensions");
  WhereIndexing indexing;
  indexing.rank = static_cast<int>(y.shape.size());
  for (size_t d = 0; d < y.shape.size(); ++d) indexing.dims[d] = y.shape[d];
  for (size_t k = 0; k < setup.inputs.size() && k < 3; ++k) {
    const std::vector<int64_t>& x = setup.inputs[k].shape;
    const std::vector<int64_t> strides = stridesOf(x);
    const size_t offset = y.shape.size() - x.size();
    for (size_t d = 0; d < x.size(); ++d) indexing.strides[k][d + offset] = x[d] == 1 ? 0 : strides[d];
  }
  return indexing;
}

std::unique_ptr<KernelState> prepareWhere(const KernelSetup& setup) {
  const TensorInfo& y = setup.outputs[0];
  const bool values = floatStorageOf(y.dtype) && setup.inputs[1].dtype == y.dtype && setup.inputs[2].dtype == y.dtype;
  if (!values || setup.inputs[0].dtype != DType::kBool) decline("Where", "other than f32, f16 or bf16 values");
  auto state = std::make_unique<WhereState>();
  state->element_bytes = static_cast<int>(dtypeSize(y.dtype));
  state->indexing = broadcastIndexing("Where", setup);
  state->elements = y.numElements();
  return state;
}

// ------------------------------------------------- comparisons and logic

struct CompareState final : KernelState {
  WhereIndexing indexing;
  Compare op = Compare::kEqual;
  CastType element = CastType::kF32;
  uint64_t elements = 0;
};

template <Compare kOp>
std::unique_ptr<KernelState> prepareCompare(const KernelSetup& setup) {
  constexpr bool kLogic = kOp == Compare::kAnd || kOp == Compare::kOr || kOp == Compare::kXor || kOp == Compare::kNot;
  const DType type = setup.inputs[0].dtype;
  const bool supported = kLogic ? type == DType::kBool : (type == DType::kF32 || type == DType::kI64 || type == DType::kI32);
  if (!supported) decline("comparison", fmt::format("{} operands", dtypeName(type)));
  auto state = std::make_unique<CompareState>();
  state->indexing = broadcastIndexing("comparison", setup);
  state->op = kOp;
  state->element = static_cast<CastType>(type);
  state->elements = setup.outputs[0].numElements();
  return state;
}

void runCompare(const KernelCall& call) {
  const auto& s = *static_cast<const CompareState*>(call.state);
  const void* b = call.input_count > 1 ? call.inputs[1].data : call.inputs[0].data;
  launchCompare(call.inputs[0].data, b, call.outputs[0].as<bool>(), s.op, s.element, s.indexing, s.elements,
                queueOf(call.queue).stream);
}

void runWhere(const KernelCall& call) {
  const auto& s = *static_cast<const WhereState*>(call.state);
  launchWhere(call.inputs[0].as<const bool>(), call.inputs[1].data, call.inputs[2].data, call.outputs[0].data,
              s.element_bytes, s.indexing, s.elements, queueOf(call.queue).stream);
}

// ---------------------------------------------------------- Concat, Split

// `outer` rows; in each, piece i is a contiguous run of piece_bytes[i] at
// offset piece_offsets[i] of the whole row of whole_bytes.
struct PiecesState final : KernelState {
  uint64_t outer = 0;
  uint64_t whole_bytes = 0;
  std::vector<uint64_t> piece_bytes, piece_offsets;
};

std::unique_ptr<KernelState> preparePieces(std::string_view op, const TensorInfo& whole,
                                           std::span<const TensorInfo> pieces, int64_t axis_attribute) {
  const auto axis = static_cast<size_t>(normalizeAxis(op, axis_attribute, whole.shape.size()));
  auto state = std::make_unique<PiecesState>();
  const size_t element = dtypeSize(whole.dtype);
  state->outer = static_cast<uint64_t>(product(whole.shape, 0, axis));
  state->whole_bytes = static_cast<uint64_t>(product(whole.shape, axis, whole.shape.size())) * element;
  uint64_t offset = 0;
  for (const TensorInfo& piece : pieces) {
    const uint64_t bytes = static_cast<uint64_t>(product(piece.shape, axis, piece.shape.size())) * element;
    state->piece_bytes.push_back(bytes);
    state->piece_offsets.push_back(offset);
    offset += bytes;
  }
  return state;
}

std::unique_ptr<KernelState> prepareConcat(const KernelSetup& setup) {
  return preparePieces("Concat", setup.outputs[0], setup.inputs, setup.params.getInt("axis", 0));
}

std::unique_ptr<KernelState> prepareSplit(const KernelSetup& setup) {
  return preparePieces("Split", setup.inputs[0], setup.outputs, setup.params.getInt("axis", 0));
}

// Up to kMaxPieces non-empty pieces move in one launch; more, or none,
// as one 2-D copy per piece.
bool launchOne(const PiecesState& s, void* whole, std::span<const TensorView> views, bool split, cudaStream_t stream) {
  Pieces p;
  p.outer = s.outer;
  uint64_t common = s.whole_bytes | reinterpret_cast<uintptr_t>(whole);
  for (size_t i = 0; i < views.size(); ++i) {
    if (s.piece_bytes[i] == 0) continue;
    if (p.count == kMaxPieces) return false;
    common |= s.piece_bytes[i] | s.piece_offsets[i] | reinterpret_cast<uintptr_t>(views[i].data);
    p.piece[p.count] = views[i].data;
    p.piece_units[p.count] = s.piece_bytes[i];
    p.offset[p.count] = s.piece_offsets[i];
    ++p.count;
  }
  if (p.count == 0 || s.outer == 0) return true;
  p.unit_bytes = common % 16 == 0 ? 16 : common % 4 == 0 ? 4 : 1;
  p.whole_units = s.whole_bytes / static_cast<uint64_t>(p.unit_bytes);
  for (int k = 0; k < p.count; ++k) {
    p.piece_units[k] /= static_cast<uint64_t>(p.unit_bytes);
    p.offset[k] /= static_cast<uint64_t>(p.unit_bytes);
  }
  launchPieces(whole, p, split, stream);
  return true;
}

void runConcat(const KernelCall& call) {
  const auto& s = *static_cast<const PiecesState*>(call.state);
  if (launchOne(s, call.outputs[0].data, {call.inputs, call.input_count}, false, queueOf(call.queue).stream)) return;
  for (uint32_t i = 0; i < call.input_count; ++i) {
    if (s.piece_bytes[i] == 0 || s.outer == 0) continue;
    cudaMemcpy2DAsync(call.outputs[0].data + s.piece_offsets[i], s.whole_bytes, call.inputs[i].data, s.piece_bytes[i],
                      s.piece_bytes[i], s.outer, cudaMemcpyDeviceToDevice, queueOf(call.queue).stream);
  }
}

void runSplit(const KernelCall& call) {
  const auto& s = *static_cast<const PiecesState*>(call.state);
  if (launchOne(s, call.inputs[0].data, {call.outputs, call.output_count}, true, queueOf(call.queue).stream)) return;
  for (uint32_t i = 0; i < call.output_count; ++i) {
    if (s.piece_bytes[i] == 0 || s.outer == 0) continue;
    cudaMemcpy2DAsync(call.outputs[i].data, s.piece_bytes[i], call.inputs[0].data + s.piece_offsets[i], s.whole_bytes,
                      s.piece_bytes[i], s.outer, cudaMemcpyDeviceToDevice, queueOf(call.queue).stream);
  }
}

// ------------------------------------------------------------------ Resize

// The CPU kernel's index tables (resize_tables.h), uploaded once.
struct ResizeState final : KernelState {
  ResizeGeometry geometry;
  void* tables = nullptr;  // device memory: rows, cols (int64), then row_w, col_w (f32)
  const int64_t* rows = nullptr;
  const int64_t* cols = nullptr;
  const float* row_w = nullptr;
  const float* col_w = nullptr;
  ~ResizeState() override {
    if (tables != nullptr) cudaFree(tables);
  }
};

std::unique_ptr<KernelState> prepareResize(const KernelSetup& setup) {
  std::optional<ResizeTables> t = resizeTables(setup);
  if (!t) decline("Resize", "modes other than 2-D nearest and linear with constant scales");
  const std::optional<FloatStorage> storage = floatStorageOf(t->dtype);
  if (t->linear && !storage) decline("Resize", "linear resizing of other than f32, f16 and bf16");
  auto state = std::make_unique<ResizeState>();
  ResizeGeometry& g = state->geometry;
  g = {t->planes, t->in_h, t->in_w, t->out_h, t->out_w, t->linear, elementBytes("Resize", t->dtype),
       storage.value_or(FloatStorage::kF32)};
  std::vector<int64_t> indices = t->row0;
  indices.insert(indices.end(), t->row1.begin(), t->row1.end());
  indices.insert(indices.end(), t->col0.begin(), t->col0.end());
  indices.insert(indices.end(), t->col1.begin(), t->col1.end());
  std::vector<float> weights = t->row_w;
  weights.insert(weights.end(), t->col_w.begin(), t->col_w.end());
  const size_t index_bytes = indices.size() * sizeof(int64_t), weight_bytes = weights.size() * sizeof(float);
  check(cudaMalloc(&state->tables, std::max<size_t>(index_bytes + weight_bytes, 1)), "cudaMalloc (Resize tables)");
  auto* base = static_cast<std::byte*>(state->tables);
  check(cudaMemcpy(base, indices.data(), index_bytes, cudaMemcpyHostToDevice), "cudaMemcpy (Resize tables)");
  check(cudaMemcpy(base + index_bytes, weights.data(), weight_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  state->rows = reinterpret_cast<const int64_t*>(base);
  state->cols = state->rows + 2 * g.out_h;
  state->row_w = reinterpret_cast<const float*>(base + index_bytes);
  state->col_w = state->row_w + g.out_h;
  return state;
}

void runResize(const KernelCall& call) {
  const auto& s = *static_cast<const ResizeState*>(call.state);
  launchResize(call.inputs[0].data, call.outputs[0].data, s.geometry, s.rows, s.cols, s.row_w, s.col_w,
               queueOf(call.queue).stream);
}

}  // namespace

void registerCudaDataMovementKernels(KernelRegistry& registry) {
  registry.add(KernelDef{"Resize", &prepareResize, &runResize});
  registry.add(KernelDef{"Equal", &prepareCompare<Compare::kEqual>, &runCompare});
  registry.add(KernelDef{"Less", &prepareCompare<Compare::kLess>, &runCompare});
  registry.add(KernelDef{"Greater", &prepareCompare<Compare::kGreater>, &runCompare});
  registry.add(KernelDef{"LessOrEqual", &prepareCompare<Compare::kLessOrEqual>, &runCompare});
  registry.add(KernelDef{"GreaterOrEqual", &prepareCompare<Compare::kGreaterOrEqual>, &runCompare});
  registry.add(KernelDef{"And", &prepareCompare<Compare::kAnd>, &runCompare});
  registry.add(KernelDef{"Or", &prepareCompare<Compare::kOr>, &runCompare});
  registry.add(KernelDef{"Xor", &prepareCompare<Compare::kXor>, &runCompare});
  registry.add(KernelDef{"Not", &prepareCompare<Compare::kNot>, &runCompare});
  registry.add(KernelDef{"kiln.Copy", &prepareCopy, &runCopy});
  registry.add(KernelDef{"Identity", &prepareCopy, &runCopy});
  registry.add(KernelDef{"Transpose", &prepareTranspose, &runStrided});
  registry.add(KernelDef{"Expand", &prepareExpand, &runStrided});
  registry.add(KernelDef{"Slice", &prepareSlice, &runStrided});
  registry.add(KernelDef{"Gather", &prepareGather, &runGather});
  registry.add(KernelDef{"Cast", &prepareCast, &runCast});
  registry.add(KernelDef{"Where", &prepareWhere, &runWhere});
  registry.add(KernelDef{"Concat", &prepareConcat, &runConcat});
  registry.add(KernelDef{"Split", &prepareSplit, &runSplit});
}

}  // namespace kiln::cuda
