#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstring>
#include <fstream>
#include <queue>
#include <set>

#include "frontend/onnx/contrib_expansion.h"
#include "frontend/onnx/flex_attention_expansion.h"
#include "frontend/onnx/onnx_tensor.h"
#include "kiln/error.h"
#include "kiln/onnx_import.h"

namespace kiln {

using onnx_import::constantFromTensorProto;
using onnx_import::dtypeFromOnnx;
using onnx_import::ModelSource;

namespace {

// "input 'x' dimension 0 ('batch')": dimension i of `type`, for messages.
std::string unfixedDimension(const std::string& input, const ValueType& type, size_t i) {
  const Dim& dim = (*type.shape)[i];
  return fmt::format("input '{}' dimension {}{}", input, i, dim.symbol.empty() ? "" : " ('" + dim.symbol + "')");
}

// Imports one GraphProto. Subgraph importers point at their parent so that
// names read from enclosing graphs resolve (and become outer-scope values).
class GraphImporter {
 public:
  GraphImporter(const ModelSource& source, const GraphImporter* parent) : source_(source), parent_(parent) {}

  GraphPtr importMain(const onnx::GraphProto& proto, const OnnxImportOptions& options) {
    graph_ = std::make_shared<Graph>(proto.name().empty() ? "main" : proto.name());
    addInitializers(proto);
    std::set<std::string> inputs;
    for (const onnx::ValueInfoProto& input : proto.input()) {
      if (!graph_->findValue(input.name())) inputs.insert(input.name());  // old models list initializers too
    }
    for (const auto& [name, dims] : options.input_shapes) {
      if (!inputs.contains(name)) {
        fail(fmt::format("--shape names '{}', which is not an input of the model (inputs: {})", name,
                         fmt::join(inputs, ", ")));
      }
    }
    for (const onnx::ValueInfoProto& input : proto.input()) {
      if (inputs.contains(input.name())) graph_->addInput(input.name(), fixInputShape(input, options));
    }
    addNodesAndOutputs(proto);
    return graph_;
  }

  // Subgraph (If branch, Loop/Scan body): its inputs keep their declared types.
  GraphPtr importSubgraph(const onnx::GraphProto& proto) {
    graph_ = std::make_shared<Graph>(proto.name().empty() ? "subgraph" : proto.name());
    addInitializers(proto);
    for (const onnx::ValueInfoProto& input : proto.input()) {
      if (!graph_->findValue(input.name())) graph_->addInput(input.name(), typeOf(input));
    }
    addNodesAndOutputs(proto);
    return graph_;
  }

 private:
  [[noreturn]] void fail(const std::string& problem) const {
    throw GraphError(fmt::format("{}: {}", source_.name, problem));
  }

  // Makes `name`, defined in an enclosing graph, readable in this one: every
  // graph between the definition and here captures it too, so that each
  // level's outer-scope values name a value of the level just above.
  ValueId capture(const std::string& name) const {
    if (auto id = graph_->findValue(name)) return *id;
    parent_->capture(name);
    return graph_->addOuterScopeValue(name);
  }

  bool defines(const std::string& name) const {
    return graph_->findValue(name).has_value() || (parent_ != nullptr && parent_->defines(name));
  }

  ValueType typeOf(const onnx::ValueInfoProto& info) const {
    // Exporters often write a type with nothing in it for values they did
    // not type (If branch outputs): that is an unknown tensor, for inference.
    if (!info.has_type() || info.type().value_case() == onnx::TypeProto::VALUE_NOT_SET) return ValueType::unknown();
    if (!info.type().has_tensor_type()) {
      fail(fmt::format("value '{}' is not a tensor (sequence, map and optional values are not supported yet)",
                       info.name()));
    }
    const auto& tensor = info.type().tensor_type();
    ValueType type;
    if (tensor.elem_type() != 0) type.dtype = dtypeFromOnnx(tensor.elem_type(), source_, "value '" + info.name() + "'");
    if (tensor.has_shape()) {
      type.shape.emplace();
      for (const auto& dim : tensor.shape().dim()) {
        if (dim.has_dim_value() && dim.dim_value() >= 0) {
          type.shape->push_back(Dim::known(dim.dim_value()));
        } else {
          type.shape->push_back(Dim::symbolic(dim.has_dim_param() ? dim.dim_param() : ""));
        }
      }
    }
    return type;
  }

  ValueType fixInputShape(const onnx::ValueInfoProto& input, const OnnxImportOptions& options) const {
    ValueType type = typeOf(input);
    const auto given = options.input_shapes.find(input.name());
    if (given != options.input_shapes.end()) {
      const std::vector<int64_t>& dims = given->second;
      if (type.shape && type.shape->size() != dims.size()) {
        fail(fmt::format("--shape {}:{} has rank {}, but the model's input has rank {} ({})", input.name(),
                         fmt::join(dims, "x"), dims.size(), type.shape->size(), type.toString()));
      }
      for (size_t i = 0; type.shape && i < dims.size(); ++i) {
        if ((*type.shape)[i].isKnown() && (*type.shape)[i].size != dims[i]) {
          fail(fmt::format("--shape {}:{} sets dimension {} to {}, but the model fixes it to {}", input.name(),
                           fmt::join(dims, "x"), i, dims[i], (*type.shape)[i].size));
        }
      }
      type.shape.emplace();
      for (int64_t dim : dims) type.shape->push_back(Dim::known(dim));
    } else if (options.batch && type.shape && !type.shape->empty() && !type.shape->front().isKnown()) {
      type.shape->front() = Dim::known(*options.batch);
    }
    if (options.require_static_inputs) {
      if (!type.shape) {
        fail(fmt::format("input '{}' has no shape in the model: give it with --shape {}:DIMS", input.name(),
                         input.name()));
      }
      for (size_t i = 0; i < type.shape->size(); ++i) {
        if ((*type.shape)[i].isKnown()) continue;
        fail(fmt::format("{} is not fixed: give it with --shape {}:DIMS{}, or compile with --dynamic to fix it at "
                         "run time",
                         unfixedDimension(input.name(), type, i), input.name(), i == 0 ? " or --batch N" : ""));
      }
    }
    return type;
  }

  void addInitializers(const onnx::GraphProto& proto) {
    for (const onnx::TensorProto& tensor : proto.initializer()) {
      if (tensor.name().empty()) fail("an initializer has no name");
      if (graph_->findValue(tensor.name())) fail(fmt::format("two initializers are named '{}'", tensor.name()));
      graph_->addInitializer(tensor.name(), constantFromTensorProto(tensor, source_));
    }
    if (proto.sparse_initializer_size() > 0) fail("sparse initializers are not supported");
  }

  // Names a node reads, its subgraphs included (they may read this graph's
  // values); used to order nodes by their dependencies.
  static void collectReads(const onnx::NodeProto& node, std::vector<std::string>& reads) {
    for (const std::string& input : node.input()) reads.push_back(input);
    for (const onnx::AttributeProto& attribute : node.attribute()) {
      std::vector<const onnx::GraphProto*> graphs;
      if (attribute.has_g()) graphs.push_back(&attribute.g());
      for (const onnx::GraphProto& g : attribute.graphs()) graphs.push_back(&g);
      for (const onnx::GraphProto* g : graphs) {
        for (const onnx::NodeProto& inner : g->node()) collectReads(inner, reads);
        for (const onnx::ValueInfoProto& output : g->output()) reads.push_back(output.name());
      }
    }
  }

  // Node indices ordered so that producers come first (stable otherwise).
  std::vector<int> sortNodes(const onnx::GraphProto& proto) const {
    const int count = proto.node_size();
    std::map<std::string, int> producer;
    for (int i = 0; i < count; ++i) {
      for (const std::string& output : proto.node(i).output()) {
        if (output.empty()) continue;
        if (!producer.emplace(output, i).second || graph_->findValue(output)) {
          fail(fmt::format("value '{}' is defined twice (the second time by node '{}' ({}))", output,
                           proto.node(i).name(), proto.node(i).op_type()));
        }
      }
    }
    std::vector<std::vector<int>> dependents(count);
    std::vector<int> pending(count, 0);
    for (int i = 0; i < count; ++i) {
      std::vector<std::string> reads;
      collectReads(proto.node(i), reads);
      std::set<int> sources;
      for (const std::string& name : reads) {
        const auto it = producer.find(name);
        if (it != producer.end() && it->second != i) sources.insert(it->second);
      }
      pending[i] = static_cast<int>(sources.size());
      for (int source : sources) dependents[source].push_back(i);
    }
    std::priority_queue<int, std::vector<int>, std::greater<>> ready;
    for (int i = 0; i < count; ++i) {
      if (pending[i] == 0) ready.push(i);
    }
    std::vector<int> order;
    while (!ready.empty()) {
      const int i = ready.top();
      ready.pop();
      order.push_back(i);
      for (int next : dependents[i]) {
        if (--pending[next] == 0) ready.push(next);
      }
    }
    if (static_cast<int>(order.size()) != count) {
      std::vector<std::string> stuck;
      for (int i = 0; i < count; ++i) {
        if (pending[i] > 0) stuck.push_back(fmt::format("'{}' ({})", proto.node(i).name(), proto.node(i).op_type()));
      }
      fail(fmt::format("graph '{}' has a cycle through nodes {}", proto.name(), fmt::join(stuck, ", ")));
    }
    return order;
  }

  ValueId resolve(const std::string& name, const onnx::NodeProto& reader) {
    if (auto id = graph_->findValue(name)) return *id;
    if (parent_ != nullptr && parent_->defines(name)) return capture(name);
    fail(fmt::format("node '{}' ({}) reads '{}', which no node, input or initializer defines", reader.name(),
                     reader.op_type(), name));
  }

  Attribute convertAttribute(const onnx::AttributeProto& a, const onnx::NodeProto& node) {
    using Proto = onnx::AttributeProto;
    if (!a.ref_attr_name().empty()) {
      fail(fmt::format("node '{}' attribute '{}' refers to a function attribute; functions are not supported",
                       node.name(), a.name()));
    }
    switch (a.type()) {
      case Proto::INT: return a.i();
      case Proto::FLOAT: return a.f();
      case Proto::STRING: return a.s();
      case Proto::TENSOR: return constantFromTensorProto(a.t(), source_);
      case Proto::GRAPH: return GraphImporter(source_, this).importSubgraph(a.g());
      case Proto::INTS: return std::vector<int64_t>(a.ints().begin(), a.ints().end());
      case Proto::FLOATS: return std::vector<float>(a.floats().begin(), a.floats().end());
      case Proto::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
      case Proto::TENSORS: {
        std::vector<ConstantPtr> tensors;
        for (const onnx::TensorProto& t : a.tensors()) tensors.push_back(constantFromTensorProto(t, source_));
        return tensors;
      }
      case Proto::GRAPHS: {
        std::vector<GraphPtr> graphs;
        for (const onnx::GraphProto& g : a.graphs()) graphs.push_back(GraphImporter(source_, this).importSubgraph(g));
        return graphs;
      }
      default:
        fail(fmt::format("node '{}' ({}) attribute '{}' has type {}, which kiln does not support", node.name(),
                         node.op_type(), a.name(), Proto::AttributeType_Name(a.type())));
    }
  }

  // A Constant node becomes an initializer, so that later stages see its
  // value (Reshape shapes, Slice bounds are usually Constant nodes).
  ConstantPtr constantNodeValue(const onnx::NodeProto& node) const {
    if (node.attribute_size() != 1 || node.output_size() != 1) {
      fail(fmt::format("Constant node '{}' needs exactly one value attribute and one output", node.name()));
    }
    const onnx::AttributeProto& a = node.attribute(0);
    auto scalarOrList = [](auto dtype, const auto& values, bool scalar) {
      using T = typename std::decay_t<decltype(values)>::value_type;
      std::vector<std::byte> bytes(values.size() * sizeof(T));
      if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
      TensorInfo info{dtype, scalar ? std::vector<int64_t>{} : std::vector<int64_t>{static_cast<int64_t>(values.size())}};
      return makeConstant(std::move(info), std::move(bytes));
    };
    if (a.name() == "value" && a.has_t()) return constantFromTensorProto(a.t(), source_);
    if (a.name() == "value_float") return scalarOrList(DType::kF32, std::vector<float>{a.f()}, true);
    if (a.name() == "value_floats") return scalarOrList(DType::kF32, std::vector<float>(a.floats().begin(), a.floats().end()), false);
    if (a.name() == "value_int") return scalarOrList(DType::kI64, std::vector<int64_t>{a.i()}, true);
    if (a.name() == "value_ints") return scalarOrList(DType::kI64, std::vector<int64_t>(a.ints().begin(), a.ints().end()), false);
    fail(fmt::format("Constant node '{}' uses attribute '{}', which kiln does not support (no sparse or string "
                     "tensors)", node.name(), a.name()));
  }

  void addNodesAndOutputs(const onnx::GraphProto& proto) {
    for (int index : sortNodes(proto)) {
      const onnx::NodeProto& node = proto.node(index);
      if (node.op_type().empty()) fail(fmt::format("node '{}' has no op type", node.name()));
      if (node.op_type() == "Constant" && (node.domain().empty() || node.domain() == "ai.onnx")) {
        ConstantPtr value = constantNodeValue(node);  // checks the output count first
        if (node.output(0).empty()) fail(fmt::format("Constant node '{}' has an unnamed output", node.name()));
        graph_->addInitializer(node.output(0), std::move(value));
        continue;
      }
      std::vector<ValueId> inputs;
      for (const std::string& input : node.input()) inputs.push_back(input.empty() ? kNoValue : resolve(input, node));
      Attributes attributes;
      for (const onnx::AttributeProto& attribute : node.attribute()) {
        if (!attributes.emplace(attribute.name(), convertAttribute(attribute, node)).second) {
          fail(fmt::format("node '{}' has two attributes named '{}'", node.name(), attribute.name()));
        }
      }
      const std::vector<std::string> outputs(node.output().begin(), node.output().end());
      const std::string domain = node.domain() == "ai.onnx" ? "" : node.domain();
      const NodeId id = graph_->addNode(node.op_type(), inputs, outputs, std::move(attributes), domain);
      if (!node.name().empty()) graph_->node(id).name = node.name();
    }
    for (const onnx::ValueInfoProto& info : proto.value_info()) {
      if (auto id = graph_->findValue(info.name()); id && graph_->value(*id).kind == ValueKind::kNodeOutput) {
        graph_->value(*id).type = typeOf(info);
      }
    }
    for (const onnx::ValueInfoProto& output : proto.output()) {
      const auto id = graph_->findValue(output.name());
      if (!id && !(parent_ != nullptr && parent_->defines(output.name()))) {
        fail(fmt::format("graph output '{}' is not defined by any node, input or initializer", output.name()));
      }
      const ValueId value = id ? *id : capture(output.name());
      if (graph_->value(value).kind == ValueKind::kNodeOutput || graph_->value(value).kind == ValueKind::kOuterScope) {
        if (output.has_type()) graph_->value(value).type = typeOf(output);
      }
      graph_->addOutput(value);
    }
  }

  const ModelSource& source_;
  const GraphImporter* parent_;
  GraphPtr graph_;
};

// The first node of `graph` or its subgraphs (at any depth) in the default
// ONNX domain, or nullptr.
const onnx::NodeProto* findDefaultDomainNode(const onnx::GraphProto& graph) {
  for (const onnx::NodeProto& node : graph.node()) {
    if (node.domain().empty() || node.domain() == "ai.onnx") return &node;
    for (const onnx::AttributeProto& attribute : node.attribute()) {
      if (attribute.has_g()) {
        if (const onnx::NodeProto* inner = findDefaultDomainNode(attribute.g())) return inner;
      }
      for (const onnx::GraphProto& g : attribute.graphs()) {
        if (const onnx::NodeProto* inner = findDefaultDomainNode(g)) return inner;
      }
    }
  }
  return nullptr;
}

OnnxModel importModel(const onnx::ModelProto& model, const ModelSource& source, const OnnxImportOptions& options) {
  OnnxModel result;
  result.ir_version = model.ir_version();
  result.producer = (model.producer_name() + " " + model.producer_version());
  for (const auto& opset : model.opset_import()) {
    const std::string domain = opset.domain() == "ai.onnx" ? "" : opset.domain();
    result.opsets[domain] = opset.version();
  }
  if (!model.has_graph()) throw GraphError(fmt::format("{}: the model has no graph", source.name));
  // A model may import only other domains (an ai.onnx.ml-only model); then
  // none of its nodes may be in the default domain.
  if (!result.opsets.contains("")) {
    if (const onnx::NodeProto* node = findDefaultDomainNode(model.graph())) {
      throw GraphError(fmt::format("{}: node '{}' ({}) is in the default ONNX domain, but the model imports no "
                                   "version of the default ONNX operator set",
                                   source.name, node->name(), node->op_type()));
    }
  }
  result.graph = GraphImporter(source, nullptr).importMain(model.graph(), options);
  expandFlexAttentionModifiers(*result.graph);  // ONNX defines them by inlining
  const auto default_opset = result.opsets.find("");
  expandContribOps(*result.graph, default_opset == result.opsets.end() ? 0 : default_opset->second);
  verifyGraph(*result.graph);
  return result;
}

}  // namespace

OnnxModel importOnnxFromMemory(std::span<const std::byte> bytes, const std::string& source_name,
                               const std::filesystem::path& base_directory, const OnnxImportOptions& options) {
  onnx::ModelProto model;
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    throw GraphError(fmt::format("{}: not a valid ONNX model (protobuf parsing failed after {} bytes)", source_name,
                                 bytes.size()));
  }
  return importModel(model, ModelSource{source_name, base_directory, {}}, options);
}

OnnxModel importOnnx(const std::filesystem::path& path, const OnnxImportOptions& options) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError("cannot open " + path.string(), errno);
  std::vector<std::byte> bytes(static_cast<size_t>(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!in) throw IoError("cannot read " + path.string(), errno);
  const std::filesystem::path directory = path.parent_path().empty() ? "." : path.parent_path();
  std::error_code error;
  const std::filesystem::path resolved = std::filesystem::canonical(path, error);
  onnx::ModelProto model;
  if (bytes.size() > static_cast<size_t>(INT32_MAX) ||
      !model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    throw GraphError(fmt::format("{}: not a valid ONNX model (protobuf parsing failed after {} bytes)", path.string(),
                                 bytes.size()));
  }
  return importModel(model, ModelSource{path.string(), directory, error ? std::filesystem::path() : resolved.parent_path()},
                     options);
}

std::string unfixedInputDimension(const Graph& graph) {
  for (ValueId id : graph.inputs()) {
    const Value& input = graph.value(id);
    if (!input.type.shape) return fmt::format("the shape of input '{}'", input.name);
    for (size_t i = 0; i < input.type.shape->size(); ++i) {
      if (!(*input.type.shape)[i].isKnown()) return unfixedDimension(input.name, input.type, i);
    }
  }
  return "";
}

std::vector<int64_t> parseDims(const std::string& text) {
  std::vector<int64_t> dims;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find('x', start), text.size());
    const std::string part = text.substr(start, end - start);
    size_t used = 0;
    int64_t dim = -1;
    try {
      dim = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (part.empty() || used != part.size() || dim < 0) {
      throw UsageError(fmt::format("'{}' is not a shape like 1x3x224x224", text));
    }
    dims.push_back(dim);
    start = end + 1;
  }
  return dims;
}

}  // namespace kiln
