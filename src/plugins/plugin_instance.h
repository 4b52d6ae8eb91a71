// One node's use of a plugin op: the op, and the state its create() built
// from the node's attributes (destroyed with the instance). The compiler
// (shape inference, workspace sizes) and the kernel (compute) both go
// through it, so every call into the plugin is checked the same way and
// every failure becomes a kiln::Error naming the plugin and the op.
//
// Thread safety: after construction, infer, workspaceBytes and the state
// are read-only; compute may run concurrently.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/plugin.h"
#include "kiln/tensor_info.h"
#include "plugins/plugin_registry.h"

namespace kiln {

// kiln's types across the ABI: kDynamicDim <-> KILN_DIM_UNKNOWN.
KilnTensorType pluginTypeOf(const TensorInfo& info);
TensorInfo tensorInfoOf(const KilnTensorType& type);

// How an input must lie in memory (KilnInputLayout, normalised): its
// address a multiple of `alignment` (a power of two, 1: any), and
// `padding_bytes` readable bytes after its last element.
struct InputLayout {
  uint64_t alignment = 1;
  uint64_t padding_bytes = 0;
  bool isDefault() const { return alignment == 1 && padding_bytes == 0; }
  friend bool operator==(const InputLayout&, const InputLayout&) = default;
};

class PluginInstance {
 public:
  // Calls the op's create() with `attributes_json`; UsageError when it fails.
  PluginInstance(const PluginOp& op, const std::string& attributes_json);
  ~PluginInstance();
  PluginInstance(const PluginInstance&) = delete;
  PluginInstance& operator=(const PluginInstance&) = delete;

  const PluginOp& op() const { return op_; }
  const void* state() const { return state_; }

  // The op's outputs' types for these inputs (input and output counts
  // checked against the op's ranges first). Refuses, with UsageError, a
  // failing infer and any output without a valid dtype, with a rank outside
  // 0..kMaxRank or a dimension below -1.
  std::vector<TensorInfo> infer(std::span<const TensorInfo> inputs, size_t output_count) const;

  // The scratch bytes compute needs for these static types (0 without a
  // workspace_bytes callback); UsageError above 2^40.
  uint64_t workspaceBytes(std::span<const TensorInfo> inputs, std::span<const TensorInfo> outputs) const;

  // What the allocator hook (KilnOp.input_layout) asks of each input, one
  // entry per input (an omitted one, dtype kUndefined, gets none); all
  // {1, 0} without a hook. Refuses, with UsageError, a failing hook, an
  // alignment that is not a power of two up to KILN_PLUGIN_MAX_ALIGNMENT and
  // padding above KILN_PLUGIN_MAX_PADDING.
  std::vector<InputLayout> inputLayouts(std::span<const TensorInfo> inputs) const;

  // "com.example.Rotate (plugin libmy_ops.so): <what>"
  [[noreturn]] void fail(const std::string& what) const;

 private:
  const PluginOp& op_;
  void* state_ = nullptr;
};

}  // namespace kiln
