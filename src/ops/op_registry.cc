#include <cstring>

#include "ops/op_families.h"
#include "ops/op_schema.h"
#include "ops/shape_inference.h"

namespace kiln {

// ------------------------------------------------------ InferenceContext

InferenceContext::InferenceContext(const Graph& graph, const Node& node, int64_t opset)
    : graph_(graph), node_(node), opset_(opset), outputs_(node.outputs.size()) {}

bool InferenceContext::hasInput(size_t index) const {
  return index < node_.inputs.size() && node_.inputs[index] != kNoValue;
}

const ValueType& InferenceContext::inputType(size_t index) const {
  if (!hasInput(index)) fail("input {} is required", index);
  return graph_.value(node_.inputs[index]).type;
}

const std::vector<Dim>& InferenceContext::inputShape(size_t index) const {
  const ValueType& type = inputType(index);
  if (!type.shape) fail("the shape of input {} ('{}') is unknown", index, graph_.value(node_.inputs[index]).name);
  return *type.shape;
}

ConstantPtr InferenceContext::inputConstant(size_t index) const {
  if (!hasInput(index)) return nullptr;
  const Value& value = graph_.value(node_.inputs[index]);
  if (!value.initializer && wanted_ != nullptr) wanted_->push_back(node_.inputs[index]);
  return value.initializer;
}

ConstantPtr InferenceContext::dataConstant(size_t index) const {
  return hasInput(index) ? graph_.value(node_.inputs[index]).initializer : nullptr;
}

std::optional<std::vector<int64_t>> InferenceContext::constantInts(size_t index) const {
  const ConstantPtr constant = inputConstant(index);
  if (!constant) return std::nullopt;
  const uint64_t count = constant->info.numElements();
  std::vector<int64_t> values(count);
  for (uint64_t i = 0; i < count; ++i) {
    if (constant->info.dtype == DType::kI64) {
      std::memcpy(&values[i], constant->bytes.data() + i * 8, 8);
    } else if (constant->info.dtype == DType::kI32) {
      int32_t v;
      std::memcpy(&v, constant->bytes.data() + i * 4, 4);
      values[i] = v;
    } else {
      fail("input {} must be an integer tensor, found {}", index, dtypeName(constant->info.dtype));
    }
  }
  return values;
}

std::vector<ValueType> InferenceContext::inferSubgraph(Graph& body, const std::vector<ValueType>& input_types) const {
  if (opsets_ == nullptr) fail("subgraphs can only be inferred within inferTypes()");
  if (input_types.size() != body.inputs().size()) {
    fail("subgraph '{}' takes {} inputs, the operator gives it {}", body.name(), body.inputs().size(), input_types.size());
  }
  for (size_t i = 0; i < input_types.size(); ++i) {
    ValueType& declared = body.value(body.inputs()[i]).type;
    if (declared.dtype != DType::kUndefined && input_types[i].dtype != DType::kUndefined &&
        declared.dtype != input_types[i].dtype) {
      fail("subgraph '{}' input '{}' is declared {} but receives {}", body.name(), body.value(body.inputs()[i]).name,
           dtypeName(declared.dtype), dtypeName(input_types[i].dtype));
    }
    declared = input_types[i];
  }
  for (ValueId id : body.outerScopeValues()) {
    Value& captured = body.value(id);
    const auto outer = graph_.findValue(captured.name);
    if (!outer) fail("subgraph '{}' reads '{}', which is not visible here", body.name(), captured.name);
    captured.type = graph_.value(*outer).type;
  }
  inferTypes(body, *opsets_, InferenceOptions{.lenient = lenient_});
  std::vector<ValueType> outputs;
  for (ValueId id : body.outputs()) outputs.push_back(body.value(id).type);
  return outputs;
}

void InferenceContext::failWith(const std::string& message) const {
  throw GraphError(fmt::format("node '{}' ({}): {}", node_.name, node_.op_type, message));
}

// ----------------------------------------------------------- OpRegistry

OpRegistry& OpRegistry::global() {
  static OpRegistry registry = [] {
    OpRegistry r;
    registerElementwiseOps(r);
    registerShapeOps(r);
    registerNnOps(r);
    registerReductionOps(r);
    registerIndexingOps(r);
    registerControlFlowOps(r);
    registerTransformerOps(r);
    registerLossOps(r);
    registerNormalizationOps(r);
    registerRecurrentOps(r);
    registerQuantizationOps(r);
    registerSignalOps(r);
    registerSamplingOps(r);
    registerLinearAttentionOps(r);
    registerFlexAttentionOps(r);
    registerSelectionOps(r);
    registerMlOps(r);
    registerPluginOps(r);
    return r;
  }();
  return registry;
}

void OpRegistry::add(OpSchema schema) {
  auto& versions = schemas_[{schema.domain, schema.op_type}];
  const int64_t since = schema.since_version;
  if (!versions.emplace(since, std::move(schema)).second) {
    throw UsageError(fmt::format("op schema registered twice: {} since opset {}", versions.at(since).op_type, since));
  }
}

const OpSchema* OpRegistry::find(const std::string& domain, const std::string& op_type, int64_t opset) const {
  const auto it = schemas_.find({domain, op_type});
  if (it == schemas_.end()) return nullptr;
  auto version = it->second.upper_bound(opset);  // first schema newer than the opset
  if (version == it->second.begin()) return nullptr;
  return &std::prev(version)->second;
}

std::vector<std::pair<std::string, std::string>> OpRegistry::operators() const {
  std::vector<std::pair<std::string, std::string>> names;
  for (const auto& [key, versions] : schemas_) names.push_back(key);
  return names;
}

}  // namespace kiln
