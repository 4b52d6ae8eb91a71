#include "passes/float16_storage.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/float_formats.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr int64_t kOnnxFloat = 1;
constexpr int64_t kOnnxFloat16 = 10;
constexpr int64_t kOnnxBFloat16 = 16;
constexpr float kLargestHalf = 65504.0f;

// The kernels of src/kernels/cuda that read and write f16 tensors.
constexpr std::array<std::string_view, 50> kFloat16Ops = {
    "MatMul", "Gemm", "kiln.FusedMatMul", "kiln.FusedGemm", "Conv", "ConvTranspose", "kiln.FusedConv",
    "kiln.FusedElementwise", "Relu", "LeakyRelu", "Elu", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus", "Tanh",
    "Exp", "Log", "Sqrt", "Erf", "Abs", "Neg", "Reciprocal", "Floor", "Ceil", "Add", "Sub", "Mul", "Div", "Max", "Min",
    "Gelu", "Clip", "Softmax", "LogSoftmax", "LayerNormalization", "MaxPool", "AveragePool", "GlobalMaxPool",
    "GlobalAveragePool", "Transpose", "Slice", "Expand", "Concat", "Split", "Gather", "Resize", "Where", "Attention",
    "kiln.Attention"};
constexpr std::array<std::string_view, 4> kProducts = {"MatMul", "Gemm", "kiln.FusedMatMul", "kiln.FusedGemm"};
// Steps that always convert, casting what they read: the products and
// convolutions (the work f16 is for), and the normalizations and attention,
// whose f32 arithmetic takes any input that f16 can hold.
constexpr std::array<std::string_view, 12> kAlwaysConverted = {
    "MatMul", "Gemm", "kiln.FusedMatMul", "kiln.FusedGemm", "Conv", "ConvTranspose", "kiln.FusedConv",
    "Softmax", "LogSoftmax", "LayerNormalization", "Attention", "kiln.Attention"};
// Views: they change no element, whatever the type.
constexpr std::array<std::string_view, 5> kViewOps = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"};

std::string kernelName(const Node& node) { return node.domain.empty() ? node.op_type : node.domain + "." + node.op_type; }

std::string freshName(const Graph& graph, std::string base) {
  while (graph.findValue(base)) base += "'";
  return base;
}

bool isFloat32(const Graph& graph, ValueId id) { return id != kNoValue && graph.value(id).type.dtype == DType::kF32; }

// Whether input `index` of `name` holds elements (converted with the step)
// rather than parameters: Resize's roi and scales stay f32, and so does
// Attention's mask (its -1e9s and -3.4e38s would become -inf in f16), which
// the kernel reads in any float type.
bool isDataInput(const std::string& name, size_t index) {
  if (name == "Resize") return index == 0;
  if (name == "Attention" || name == "kiln.Attention") return index != 3;
  return true;
}

template <size_t N>
bool contains(const std::array<std::string_view, N>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

// Whether value `id` was computed in f32 from floats by a step that stays
// f32 (a reduction, a host step): its range is unknown and may
// exceed f16's (magika's sum of squares reaches 1.3e5), so under f16 the
// elementwise work that reads it stays f32 too (bf16 has f32's range). Model inputs, initializers and Casts
// from integers or bools (one-hot encodings) are not.
bool computedInF32(const Graph& graph, ValueId id, const std::vector<bool>& converted) {
  const Value& value = graph.value(id);
  if (value.kind != ValueKind::kNodeOutput || value.producer == kNoNode || value.type.dtype != DType::kF32) {
    return false;
  }
  if (converted[value.producer]) return false;
  const Node& producer = graph.node(value.producer);
  if (contains(kViewOps, kernelName(producer)) && !producer.inputs.empty() && producer.inputs[0] != kNoValue) {
    return computedInF32(graph, producer.inputs[0], converted);  // a view has its input's values
  }
  if (producer.domain.empty() && producer.op_type == "Cast" && !producer.inputs.empty()) {
    const DType from = graph.value(producer.inputs[0]).type.dtype;
    return from == DType::kF32 || from == DType::kF64 || from == DType::kF16 || from == DType::kBF16;
  }
  return true;
}

// f16 tensor cores read rows of 16-byte multiples: a product whose K or N
// is not a multiple of 8 runs on slower f16 kernels than its f32 form
// (magika's K = 257 one-hot product: 0.27 ms in f32, 0.44 ms with f16
// storage), so it stays f32.
bool alignedProduct(const Graph& graph, const Node& node, const std::string& name) {
  if (node.inputs.size() < 2 || node.inputs[0] == kNoValue || node.inputs[1] == kNoValue) return false;
  const std::optional<TensorInfo> a_info = graph.value(node.inputs[0]).type.tensorInfo();
  const std::optional<TensorInfo> b_info = graph.value(node.inputs[1]).type.tensorInfo();
  if (!a_info || !b_info || a_info->shape.size() < 2 || b_info->shape.size() < 2) return false;
  const std::vector<int64_t>& a = a_info->shape;
  const std::vector<int64_t>& b = b_info->shape;
  const bool gemm = name == "Gemm" || name == "kiln.FusedGemm";
  const bool trans_a = gemm && node.intAttribute("transA", 0) != 0;
  const bool trans_b = gemm && node.intAttribute("transB", 0) != 0;
  const int64_t k = trans_a ? a[a.size() - 2] : a.back();
  const int64_t n = trans_b ? b[b.size() - 2] : b.back();
  return k > 0 && n > 0 && k % 8 == 0 && n % 8 == 0;
}

// Whether `node` may compute on f16 tensors: a kernel that takes them, every
// float input and output f32 now, and at least one f32 output. Gather's
// indices and the shape inputs of the views are integers and stay. A view
// converts only when what it views is f16 already (else it would cost two
// Casts and save nothing); elementwise work and data movement not when a
// float input was computed in f32 (computedInF32). `converted` says which
// steps are, so far (the walk is in topological order).
bool convertible(const Graph& graph, const Node& node, const std::vector<bool>& converted, bool range_limited) {
  const std::string name = kernelName(node);
  if (contains(kViewOps, name)) {
    if (node.inputs.empty() || node.inputs[0] == kNoValue) return false;
    const NodeId producer = graph.value(node.inputs[0]).producer;
    if (graph.value(node.inputs[0]).kind != ValueKind::kNodeOutput || producer == kNoNode || !converted[producer]) {
      return false;
    }
  } else if (!contains(kFloat16Ops, name)) {
    return false;
  } else if (contains(kProducts, name) && !alignedProduct(graph, node, name)) {
    return false;
  } else if (range_limited && !contains(kAlwaysConverted, name)) {
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const ValueId input = node.inputs[i];
      if (input != kNoValue && isDataInput(name, i) && computedInF32(graph, input, converted)) return false;
    }
  }
  // MaxPool's Indices and LayerNormalization's Mean and InvStdDev outputs
  // are not computed by the f16 kernels.
  if ((name == "MaxPool" || name == "LayerNormalization") && node.outputs.size() > 1) return false;
  bool any = false;
  for (ValueId output : node.outputs) {
    if (output == kNoValue) continue;
    if (!isFloat32(graph, output)) return false;
    any = true;
  }
  for (ValueId input : node.inputs) {
    if (input == kNoValue) continue;
    const DType dtype = graph.value(input).type.dtype;
    if (dtype == DType::kF64 || dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kUndefined) return false;
  }
  return any;
}

// An f32 constant as `storage` (f16: magnitudes past 65504 clamped to it).
ConstantPtr toStorage(const Constant& single, DType storage) {
  const uint64_t count = single.info.numElements();
  std::vector<std::byte> bytes(count * 2);
  for (uint64_t i = 0; i < count; ++i) {
    float value;
    std::memcpy(&value, single.bytes.data() + i * sizeof(float), sizeof value);
    uint16_t bits;
    if (storage == DType::kF16) {
      if (std::isfinite(value)) value = std::clamp(value, -kLargestHalf, kLargestHalf);
      bits = floatToHalf(value);
    } else {
      bits = floatToBfloat16(value);
    }
    std::memcpy(bytes.data() + i * 2, &bits, 2);
  }
  return makeConstant(TensorInfo{storage, single.info.shape}, std::move(bytes));
}

ValueId addCast(Graph& graph, ValueId value, DType to, const std::string& suffix) {
  const std::string name = freshName(graph, graph.value(value).name + suffix);
  const int64_t onnx_type = to == DType::kF16 ? kOnnxFloat16 : to == DType::kBF16 ? kOnnxBFloat16 : kOnnxFloat;
  const NodeId cast = graph.addNode("Cast", {value}, {name}, Attributes{{"to", onnx_type}});
  const ValueId result = graph.node(cast).outputs[0];
  graph.value(result).type = graph.value(value).type;
  graph.value(result).type.dtype = to;
  return result;
}

}  // namespace

size_t storeInFloat16(Graph& graph, DType storage) {
  if (storage != DType::kF16 && storage != DType::kBF16) {
    throw UsageError(fmt::format("16-bit storage is f16 or bf16, not {}", dtypeName(storage)));
  }
  const std::string suffix = storage == DType::kF16 ? ":f16" : ":bf16";
  std::vector<NodeId> converted;
  std::vector<bool> is_converted(graph.nodeCount(), false);
  for (NodeId id : graph.topologicalOrder()) {
    if (graph.node(id).removed ||
        !convertible(graph, graph.node(id), is_converted, /*range_limited=*/storage == DType::kF16)) {
      continue;
    }
    converted.push_back(id);
    is_converted[id] = true;
  }
  if (converted.empty()) return 0;

  // The outputs first, so that a converted step reading another's output
  // sees it f16 already.
  std::vector<ValueId> halved;
  for (NodeId id : converted) {
    for (ValueId output : graph.node(id).outputs) {
      if (output == kNoValue) continue;
      graph.value(output).type.dtype = storage;
      halved.push_back(output);
    }
  }
  // f32 inputs of converted steps: an f16 copy of an initializer, or a Cast
  // (one per value, shared by its readers).
  std::map<ValueId, ValueId> half_of;
  for (NodeId id : converted) {
    const std::vector<ValueId> inputs = graph.node(id).inputs;
    const std::string name = kernelName(graph.node(id));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const ValueId input = inputs[i];
      if (!isFloat32(graph, input) || !isDataInput(name, i)) continue;
      auto found = half_of.find(input);
      if (found == half_of.end()) {
        const Value& value = graph.value(input);
        ValueId half;
        if (value.initializer) {
          half = graph.addInitializer(freshName(graph, value.name + suffix), toStorage(*value.initializer, storage));
        } else {
          half = addCast(graph, input, storage, suffix);
        }
        found = half_of.emplace(input, half).first;
      }
      graph.setNodeInput(id, static_cast<uint32_t>(i), found->second);
    }
  }
  // Readers that stay f32 (and the model's outputs) read a Cast back.
  for (ValueId value : halved) {
    ValueId single = kNoValue;
    auto f32 = [&] {
      if (single == kNoValue) single = addCast(graph, value, DType::kF32, ":f32");
      return single;
    };
    const std::vector<Use> users = graph.value(value).users;
    for (const Use& use : users) {
      if (use.node < is_converted.size() && is_converted[use.node] &&
          isDataInput(kernelName(graph.node(use.node)), use.input_index)) {
        continue;
      }
      graph.setNodeInput(use.node, use.input_index, f32());
    }
    for (size_t i = 0; i < graph.outputs().size(); ++i) {
      if (graph.outputs()[i] == value) graph.setOutput(i, f32());
    }
  }
  return converted.size();
}

}  // namespace kiln
