#include "plugins/plugin_instance.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr uint64_t kMaxWorkspaceBytes = uint64_t{1} << 40;

bool isKnownDType(int32_t code) { return code > 0 && code <= 255 && dtypeSize(static_cast<DType>(code)) > 0; }

}  // namespace

KilnTensorType pluginTypeOf(const TensorInfo& info) {
  KilnTensorType type{};
  type.dtype = static_cast<int32_t>(info.dtype);
  type.rank = static_cast<int32_t>(std::min(info.shape.size(), size_t{KILN_PLUGIN_MAX_RANK}));
  for (int32_t i = 0; i < type.rank; ++i) {
    type.dims[i] = info.shape[i] == kDynamicDim ? KILN_DIM_UNKNOWN : info.shape[i];
  }
  return type;
}

TensorInfo tensorInfoOf(const KilnTensorType& type) {
  TensorInfo info;
  info.dtype = static_cast<DType>(type.dtype);
  for (int32_t i = 0; i < type.rank; ++i) info.shape.push_back(type.dims[i] < 0 ? kDynamicDim : type.dims[i]);
  return info;
}

PluginInstance::PluginInstance(const PluginOp& op, const std::string& attributes_json) : op_(op) {
  if (op.abi.create == nullptr) {
    state_ = op.abi.op_data;  // not owned: destroy() is for what create made
    return;
  }
  char error[512] = {0};
  void* state = nullptr;
  if (op.abi.create(attributes_json.c_str(), &state, error, sizeof error) != 0) {
    fail("its attributes were refused: " + callbackMessage(error, sizeof error));
  }
  state_ = state;
}

PluginInstance::~PluginInstance() {
  if (op_.abi.create != nullptr && op_.abi.destroy != nullptr && state_ != nullptr) op_.abi.destroy(state_);
}

void PluginInstance::fail(const std::string& what) const { throw UsageError(op_.describe() + ": " + what); }

std::vector<TensorInfo> PluginInstance::infer(std::span<const TensorInfo> inputs, size_t output_count) const {
  const KilnOp& abi = op_.abi;
  if (inputs.size() < static_cast<size_t>(abi.min_inputs) || inputs.size() > static_cast<size_t>(abi.max_inputs)) {
    fail(fmt::format("takes {} to {} inputs, the node has {}", abi.min_inputs, abi.max_inputs, inputs.size()));
  }
  if (output_count < static_cast<size_t>(abi.min_outputs) || output_count > static_cast<size_t>(abi.max_outputs)) {
    fail(fmt::format("has {} to {} outputs, the node has {}", abi.min_outputs, abi.max_outputs, output_count));
  }
  std::vector<KilnTensorType> in;
  for (const TensorInfo& info : inputs) {
    if (info.shape.size() > KILN_PLUGIN_MAX_RANK) fail(fmt::format("an input of rank {}", info.shape.size()));
    in.push_back(pluginTypeOf(info));
  }
  std::vector<KilnTensorType> out(output_count);
  for (KilnTensorType& type : out) {
    type.dtype = KILN_DTYPE_UNDEFINED;
    type.rank = -1;
  }
  char error[512] = {0};
  if (abi.infer(state_, in.data(), static_cast<int32_t>(in.size()), out.data(), static_cast<int32_t>(out.size()),
                error, sizeof error) != 0) {
    fail("shape inference failed: " + callbackMessage(error, sizeof error));
  }
  std::vector<TensorInfo> result;
  for (size_t i = 0; i < out.size(); ++i) {
    const KilnTensorType& type = out[i];
    if (!isKnownDType(type.dtype)) fail(fmt::format("shape inference gave output {} the unknown dtype {}", i, type.dtype));
    if (type.rank < 0 || type.rank > KILN_PLUGIN_MAX_RANK) {
      fail(fmt::format("shape inference gave output {} rank {} (0 to {})", i, type.rank, KILN_PLUGIN_MAX_RANK));
    }
    for (int32_t d = 0; d < type.rank; ++d) {
      if (type.dims[d] < KILN_DIM_UNKNOWN) {
        fail(fmt::format("shape inference gave output {} the dimension {} at axis {}", i, type.dims[d], d));
      }
    }
    result.push_back(tensorInfoOf(type));
  }
  // The in-place outputs are their inputs, rewritten: same type and shape.
  for (uint32_t i = 0; i < abi.num_inplace; ++i) {
    if (result[i].dtype != inputs[i].dtype || result[i].shape != inputs[i].shape) {
      fail(fmt::format("output {} is in place over input {} ({} {}) but shape inference gave it {} {}", i, i,
                       dtypeName(inputs[i].dtype), inputs[i].shapeString(), dtypeName(result[i].dtype),
                       result[i].shapeString()));
    }
  }
  return result;
}

uint64_t PluginInstance::workspaceBytes(std::span<const TensorInfo> inputs, std::span<const TensorInfo> outputs) const {
  if (op_.abi.workspace_bytes == nullptr) return 0;
  std::vector<KilnTensorType> in, out;
  for (const TensorInfo& info : inputs) in.push_back(pluginTypeOf(info));
  for (const TensorInfo& info : outputs) out.push_back(pluginTypeOf(info));
  const uint64_t bytes = op_.abi.workspace_bytes(state_, in.data(), static_cast<int32_t>(in.size()), out.data(),
                                                 static_cast<int32_t>(out.size()));
  if (bytes > kMaxWorkspaceBytes) fail(fmt::format("asks for a workspace of {} bytes", bytes));
  return bytes;
}

std::vector<InputLayout> PluginInstance::inputLayouts(std::span<const TensorInfo> inputs) const {
  std::vector<InputLayout> layouts(inputs.size());
  if (op_.abi.input_layout == nullptr) return layouts;
  std::vector<KilnTensorType> types;
  for (const TensorInfo& info : inputs) types.push_back(pluginTypeOf(info));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype == DType::kUndefined) continue;
    KilnInputLayout layout{};
    char error[512] = {0};
    if (op_.abi.input_layout(state_, static_cast<int32_t>(i), types.data(), static_cast<int32_t>(types.size()),
                             &layout, error, sizeof error) != 0) {
      fail(fmt::format("its allocator hook failed for input {}: {}", i, callbackMessage(error, sizeof error)));
    }
    if (layout.alignment > KILN_PLUGIN_MAX_ALIGNMENT ||
        (layout.alignment > 1 && !std::has_single_bit(layout.alignment))) {
      fail(fmt::format("its allocator hook asks input {} for an alignment of {} bytes (a power of two up to {})", i,
                       layout.alignment, KILN_PLUGIN_MAX_ALIGNMENT));
    }
    if (layout.padding_bytes > KILN_PLUGIN_MAX_PADDING) {
      fail(fmt::format("its allocator hook asks input {} for {} bytes of padding (at most {})", i,
                       layout.padding_bytes, KILN_PLUGIN_MAX_PADDING));
    }
    layouts[i] = InputLayout{std::max<uint64_t>(layout.alignment, 1), layout.padding_bytes};
  }
  return layouts;
}

}  // namespace kiln
