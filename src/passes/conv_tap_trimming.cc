#include "passes/conv_tap_trimming.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "passes/pass_helpers.h"

namespace kiln {
namespace {

// The taps [first, last] of one axis that read the input for some output
// position; nullopt when none does.
struct Taps {
  int64_t first, last;
};
std::optional<Taps> usedTaps(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t dilation, int64_t pad) {
  std::optional<Taps> used;
  for (int64_t k = 0; k < kernel; ++k) {
    // The first output position whose tap k is at or past the input's start.
    const int64_t offset = k * dilation - pad;  // position of tap k for o = 0
    const int64_t o = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
    if (o >= out || o * stride + offset > in - 1) continue;
    if (!used) used = Taps{k, k};
    used->last = k;
  }
  return used;
}

// w[..., first[a]:first[a] + dims[a], ...] over the spatial axes (from 2 on).
ConstantPtr sliceKernel(const Constant& w, const std::vector<int64_t>& dims, const std::vector<int64_t>& first) {
  const std::vector<int64_t>& old_dims = w.info.shape;
  const size_t rank = dims.size();
  const size_t element = dtypeSize(w.info.dtype);
  int64_t count = 1;
  for (int64_t d : dims) count *= d;
  std::vector<std::byte> bytes(static_cast<size_t>(count) * element);
  std::vector<int64_t> index(rank, 0);
  for (int64_t flat = 0; flat < count; ++flat) {
    int64_t from = 0;
    for (size_t a = 0; a < rank; ++a) from = from * old_dims[a] + index[a] + (a >= 2 ? first[a - 2] : 0);
    std::memcpy(bytes.data() + static_cast<size_t>(flat) * element,
                w.bytes.data() + static_cast<size_t>(from) * element, element);
    for (size_t a = rank; a-- > 0;) {
      if (++index[a] < dims[a]) break;
      index[a] = 0;
    }
  }
  return makeConstant(TensorInfo{w.info.dtype, dims}, std::move(bytes));
}

bool tryTrim(Graph& graph, NodeId id) {
  const Node& conv = graph.node(id);
  if (conv.op_type != "Conv" || !conv.domain.empty() || conv.inputs.size() < 2 || conv.outputs.size() != 1) {
    return false;
  }
  const Constant* w = initializerOf(graph, conv.inputs[1]);
  const auto x = staticShape(graph, conv.inputs[0]);
  const auto y = staticShape(graph, conv.outputs[0]);
  if (w == nullptr || !x || !y || x->size() < 3 || x->size() != y->size() || w->info.shape.size() != x->size()) {
    return false;
  }
  const std::string auto_pad = conv.stringAttribute("auto_pad", "NOTSET");
  if (auto_pad != "NOTSET" && auto_pad != "VALID") return false;
  const size_t spatial = x->size() - 2;
  const std::vector<int64_t> ones(spatial, 1);
  const std::vector<int64_t> strides = conv.intsAttribute("strides", ones);
  const std::vector<int64_t> dilations = conv.intsAttribute("dilations", ones);
  std::vector<int64_t> pads = auto_pad == "VALID" ? std::vector<int64_t>(2 * spatial, 0)
                                                  : conv.intsAttribute("pads", std::vector<int64_t>(2 * spatial, 0));
  if (strides.size() != spatial || dilations.size() != spatial || pads.size() != 2 * spatial) return false;

  std::vector<int64_t> dims = w->info.shape;
  std::vector<int64_t> first(spatial, 0);
  bool changed = false;
  for (size_t a = 0; a < spatial; ++a) {
    const int64_t in = (*x)[a + 2], out = (*y)[a + 2], kernel = dims[a + 2];
    const int64_t stride = strides[a], dilation = dilations[a], pad = pads[a];
    if (stride < 1 || dilation < 1 || kernel < 1) return false;
    const std::optional<Taps> used = usedTaps(in, out, kernel, stride, dilation, pad);
    if (!used || (used->first == 0 && used->last == kernel - 1)) continue;
    const int64_t new_kernel = used->last - used->first + 1;
    const int64_t new_pad = pad - used->first * dilation;
    // The end padding that keeps the output size: the last window's end.
    const int64_t new_end = (out - 1) * stride + (new_kernel - 1) * dilation + 1 - in - new_pad;
    if (new_pad < 0 || new_end < 0) continue;
    dims[a + 2] = new_kernel;
    first[a] = used->first;
    pads[a] = new_pad;
    pads[a + spatial] = new_end;
    changed = true;
  }
  if (!changed) return false;

  const std::string base = conv.name.empty() ? graph.value(conv.outputs[0]).name : conv.name;
  const ValueId trimmed = graph.addInitializer(uniqueName(graph, base + ":W_trimmed"), sliceKernel(*w, dims, first));
  graph.setNodeInput(id, 1, trimmed);
  Node& node = graph.node(id);
  node.attributes["kernel_shape"] = std::vector<int64_t>(dims.begin() + 2, dims.end());
  node.attributes["pads"] = pads;
  node.attributes.erase("auto_pad");
  return true;
}

}  // namespace

size_t trimPaddingTaps(Graph& graph) {
  size_t trimmed = 0;
  for (NodeId id : graph.topologicalOrder()) trimmed += tryTrim(graph, id) ? 1 : 0;
  return trimmed;
}

}  // namespace kiln
