#include "ops/shape_inference.h"

#include <fmt/ranges.h>

#include <set>

#include "ops/op_schema.h"

namespace kiln {
namespace {

int64_t opsetFor(const std::map<std::string, int64_t>& opsets, const std::string& domain) {
  const auto it = opsets.find(domain);
  return it == opsets.end() ? 1 : it->second;
}

void collectUnsupported(const Graph& graph, const std::map<std::string, int64_t>& opsets, std::set<std::string>& out) {
  for (NodeId id : graph.nodeIds()) {
    const Node& node = graph.node(id);
    const int64_t opset = opsetFor(opsets, node.domain);
    if (OpRegistry::global().find(node.domain, node.op_type, opset) == nullptr) {
      out.insert(fmt::format("{} ({}, opset {})", node.op_type, node.domain.empty() ? "ai.onnx" : node.domain, opset));
    }
    for (const Graph* subgraph : node.subgraphs()) collectUnsupported(*subgraph, opsets, out);
  }
}

}  // namespace

std::vector<std::string> findUnsupportedOps(const Graph& graph, const std::map<std::string, int64_t>& opsets) {
  std::set<std::string> unsupported;
  collectUnsupported(graph, opsets, unsupported);
  return {unsupported.begin(), unsupported.end()};
}

void inferTypes(Graph& graph, const std::map<std::string, int64_t>& opsets, const InferenceOptions& options) {
  if (const auto unsupported = findUnsupportedOps(graph, opsets); !unsupported.empty()) {
    throw GraphError(fmt::format("Unsupported: {} operator{} without a schema in kiln: {}", unsupported.size(),
                                 unsupported.size() == 1 ? "" : "s", fmt::join(unsupported, ", ")));
  }
  for (NodeId id : graph.topologicalOrder()) {
    const Node& node = graph.node(id);
    const OpSchema* schema = OpRegistry::global().find(node.domain, node.op_type, opsetFor(opsets, node.domain));
    InferenceContext context(graph, node, opsetFor(opsets, node.domain));
    if (node.inputs.size() < schema->min_inputs || node.inputs.size() > schema->max_inputs) {
      context.fail("takes {} to {} inputs, found {}", schema->min_inputs, schema->max_inputs, node.inputs.size());
    }
    if (node.outputs.size() < schema->min_outputs || node.outputs.size() > schema->max_outputs) {
      context.fail("has {} to {} outputs, found {}", schema->min_outputs, schema->max_outputs, node.outputs.size());
    }
    context.recordWantedConstants(options.wanted_values);
    context.setOpsets(&opsets, options.lenient);
    if (options.lenient) {
      try {
        schema->infer(context);
      } catch (const GraphError&) {
        continue;  // its outputs stay as they are: unknown until run time
      }
    } else {
      schema->infer(context);
    }
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      Value& output = graph.value(node.outputs[i]);
      const ValueType& inferred = context.output(i);
      if (output.type.dtype != DType::kUndefined && inferred.dtype != DType::kUndefined &&
          output.type.dtype != inferred.dtype) {
        context.fail("output '{}' is declared {} in the model but computes {}", output.name,
                     dtypeName(output.type.dtype), dtypeName(inferred.dtype));
      }
      // Keep what the model declared when inference knows less.
      if (inferred.dtype != DType::kUndefined) output.type.dtype = inferred.dtype;
      if (inferred.shape) output.type.shape = inferred.shape;
    }
  }
}

}  // namespace kiln
