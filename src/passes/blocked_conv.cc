#include "passes/blocked_conv.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

constexpr int64_t kBlock = 16;
// Measured on a Sapphire Rapids Xeon, 2 threads, 3x3 Conv + Relu between two
// 1x1 Convs, p50 (Winograd with its Transposes -> direct NHWC): 64 -> 16
// channels at 160x160 6.2-6.6 -> 4.4-4.6 ms, 64 -> 32 8.8-9.0 -> 7.7-7.8,
// 32 -> 32 5.5-5.6 -> 4.4, 16 -> 16 at 320x320 7.5 -> 5.3-6.2; from 64
// channels in and out Winograd wins or ties (64 -> 64 at 80x80 2.8-3.8 ->
// 3.7-3.8, 128 -> 128 at 28x28 1.1-1.3 -> 1.4-1.7, 256 -> 256 at 14x14 1.0-1.1
// -> 1.4-1.5).
constexpr int64_t kMinChannels = 64;

bool allEqual(const std::vector<int64_t>& values, int64_t expected) {
  for (int64_t v : values) {
    if (v != expected) return false;
  }
  return true;
}

class BlockedConvs {
 public:
  explicit BlockedConvs(Graph& graph) : graph_(graph) {}

  size_t run() {
    size_t moved = 0;
    for (NodeId id : graph_.topologicalOrder()) {
      if (isEligible(graph_.node(id))) {
        move(id);
        ++moved;
      }
    }
    return moved;
  }

 private:
  bool isEligible(const Node& node) const {
    if (node.domain != "kiln" || node.op_type != "NhwcConv" || node.inputs.size() < 2) return false;
    // oneDNN 2.6's Winograd kernels take a Relu post-op, no other.
    const std::string post_ops = node.stringAttribute("post_ops", "");
    if (!post_ops.empty() && post_ops != "Relu") return false;
    const ValueType& x = graph_.value(node.inputs[0]).type;
    if (!x.hasStaticShape() || x.shape->size() != 4) return false;
    const ConstantPtr& w = graph_.value(node.inputs[1]).initializer;
    if (!w || w->info.dtype != DType::kF32 || w->info.shape.size() != 4) return false;
    const std::vector<int64_t>& wd = w->info.shape;
    if (wd[0] % kBlock != 0 || wd[1] % kBlock != 0 || wd[2] != 3 || wd[3] != 3) return false;
    // Narrow convolutions lose: the layout Transposes cost as much as the
    // product, and oneDNN's direct NHWC kernel wins anyway (kMinChannels).
    if (wd[0] < kMinChannels || wd[1] < kMinChannels) return false;
    if ((*x.shape)[3].size != wd[1]) return false;
    if (node.intAttribute("group", 1) != 1) return false;
    if (!allEqual(node.intsAttribute("strides", {1, 1}), 1) || !allEqual(node.intsAttribute("dilations", {1, 1}), 1)) {
      return false;
    }
    const std::string auto_pad = node.stringAttribute("auto_pad", "NOTSET");
    if (auto_pad == "VALID") return false;
    for (int64_t pad : node.intsAttribute("pads", {0, 0, 0, 0})) {
      if (pad > 1) return false;
    }
    return true;
  }

  ValueId shapeConstant(const std::string& base, const std::vector<int64_t>& dims) {
    std::vector<std::byte> bytes(dims.size() * sizeof(int64_t));
    std::memcpy(bytes.data(), dims.data(), bytes.size());
    return graph_.addInitializer(uniqueName(graph_, base),
                                 makeConstant(TensorInfo{DType::kI64, {static_cast<int64_t>(dims.size())}}, std::move(bytes)));
  }

  ValueId addNode(const std::string& op, const std::vector<ValueId>& inputs, const std::string& name, Attributes attributes,
                  const std::vector<int64_t>& dims) {
    const NodeId id = graph_.addNode(op, inputs, {name}, std::move(attributes));
    const ValueId output = graph_.node(id).outputs[0];
    graph_.value(output).type = ValueType::tensor(DType::kF32, dims);
    return output;
  }

  // `x` [N, H, W, C] as [N, C/16, H, W, 16].
  ValueId toBlocked(ValueId x) {
    if (const auto it = blocked_of_.find(x); it != blocked_of_.end()) return it->second;
    const std::vector<int64_t> d = graph_.value(x).type.tensorInfo()->shape;
    const std::string name = graph_.value(x).name;  // a copy: adding values moves them
    const ValueId split =
        addNode("Reshape", {x, shapeConstant(name + "/blocks_shape", {d[0], d[1], d[2], d[3] / kBlock, kBlock})},
                uniqueName(graph_, name + "/blocks"), {}, {d[0], d[1], d[2], d[3] / kBlock, kBlock});
    const ValueId blocked = addNode("Transpose", {split}, uniqueName(graph_, name + "/blocked"),
                                    {{"perm", std::vector<int64_t>{0, 3, 1, 2, 4}}},
                                    {d[0], d[3] / kBlock, d[1], d[2], kBlock});
    blocked_of_[x] = blocked;
    return blocked;
  }

  void move(NodeId id) {
    const ValueId x = graph_.node(id).inputs[0];
    graph_.setNodeInput(id, 0, toBlocked(x));
    Node& node = graph_.node(id);
    node.op_type = "Blocked16Conv";

    // The output keeps its value; its readers and graph-output slots move to
    // the NHWC copy, which takes its name.
    const ValueId y = node.outputs[0];
    const std::vector<int64_t> d = graph_.value(y).type.tensorInfo()->shape;  // [N, H, W, M]
    const std::string name = graph_.value(y).name;
    const std::vector<Use> readers = graph_.value(y).users;
    graph_.renameValue(y, uniqueName(graph_, name + "/blocked"));
    graph_.value(y).type = ValueType::tensor(DType::kF32, {d[0], d[3] / kBlock, d[1], d[2], kBlock});
    const ValueId pixels = addNode("Transpose", {y}, uniqueName(graph_, name + "/unblocked"),
                                   {{"perm", std::vector<int64_t>{0, 2, 3, 1, 4}}},
                                   {d[0], d[1], d[2], d[3] / kBlock, kBlock});
    const ValueId nhwc = addNode("Reshape", {pixels, shapeConstant(name + "/shape", d)}, name, {}, d);
    for (const Use& use : readers) graph_.setNodeInput(use.node, use.input_index, nhwc);
    for (size_t i = 0; i < graph_.outputs().size(); ++i) {
      if (graph_.outputs()[i] == y) graph_.setOutput(i, nhwc);
    }
    blocked_of_[nhwc] = y;  // a following blocked Conv reads y itself
  }

  Graph& graph_;
  std::map<ValueId, ValueId> blocked_of_;  // NHWC value -> the same data blocked
};

}  // namespace

size_t useBlockedConvs(Graph& graph) { return BlockedConvs(graph).run(); }

}  // namespace kiln
