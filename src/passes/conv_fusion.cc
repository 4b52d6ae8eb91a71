#include "passes/conv_fusion.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/fused_activation.h"
#include "passes/activation_match.h"
#include "passes/pass_helpers.h"

namespace kiln {
namespace {

struct Chain {
  std::vector<std::string> kinds;
  std::vector<float> alphas;
  std::vector<float> betas;
  ValueId residual = kNoValue;
  ValueId output = kNoValue;   // the last value of the chain
  std::vector<NodeId> nodes;   // in graph order
};

// An Add reading `value` (its only reader) and another tensor of the same
// static type: the residual Add.
bool matchResidualAdd(const Graph& graph, const std::set<ValueId>& pinned, ValueId value, Chain& chain) {
  if (chain.residual != kNoValue) return false;
  const std::optional<NodeId> add_id = onlyReader(graph, pinned, value, "Add");
  if (!add_id) return false;
  const Node& add = graph.node(*add_id);
  const ValueId other = otherOperand(graph, *add_id, value);
  if (other == kNoValue) return false;
  const ValueType& other_type = graph.value(other).type;
  if (other_type != graph.value(value).type || !other_type.hasStaticShape()) return false;
  chain.kinds.push_back("Add");
  chain.alphas.push_back(0);
  chain.betas.push_back(0);
  chain.residual = other;
  chain.nodes.push_back(*add_id);
  chain.output = add.outputs[0];
  return true;
}

Chain followChain(const Graph& graph, const std::set<ValueId>& pinned, ValueId start) {
  Chain chain;
  chain.output = start;
  while (chain.kinds.size() < kMaxPostOps) {
    if (const auto activation = matchActivation(graph, pinned, chain.output)) {
      chain.kinds.emplace_back(fusedActivationName(activation->kind));
      chain.alphas.push_back(activation->alpha);
      chain.betas.push_back(activation->beta);
      chain.nodes.insert(chain.nodes.end(), activation->nodes.begin(), activation->nodes.end());
      chain.output = activation->end;
      continue;
    }
    if (!matchResidualAdd(graph, pinned, chain.output, chain)) break;
  }
  return chain;
}

std::string joined(const std::vector<std::string>& kinds) {
  std::string text;
  for (const std::string& kind : kinds) text += (text.empty() ? "" : ",") + kind;
  return text;
}

}  // namespace

size_t fuseConvPostOps(Graph& graph) {
  const std::set<ValueId> pinned = pinnedValues(graph);
  size_t fused = 0;
  for (NodeId id : graph.nodeIds()) {
    const Node& conv = graph.node(id);
    if (conv.removed || conv.op_type != "NhwcConv" || conv.domain != "kiln" || conv.outputs.size() != 1) continue;
    if (conv.hasAttribute("post_ops")) continue;
    const ValueId conv_out = conv.outputs[0];
    const Chain chain = followChain(graph, pinned, conv_out);
    if (chain.kinds.empty()) continue;

    // The chain's last value keeps its name and readers (graph outputs
    // included); the Conv now produces it.
    const std::string name = graph.value(chain.output).name;
    graph.replaceAllUses(chain.output, conv_out);
    for (auto it = chain.nodes.rbegin(); it != chain.nodes.rend(); ++it) graph.removeNode(*it);
    graph.renameValue(chain.output, uniqueName(graph, name + "/fused"));
    graph.renameValue(conv_out, name);

    Node& node = graph.node(id);
    node.attributes["post_ops"] = joined(chain.kinds);
    node.attributes["post_op_alpha"] = chain.alphas;
    node.attributes["post_op_beta"] = chain.betas;
    if (chain.residual != kNoValue) {
      node.inputs.resize(4, kNoValue);  // an omitted bias stays kNoValue
      graph.setNodeInput(id, 3, chain.residual);
    }
    fused += chain.kinds.size();
  }
  return fused;
}

}  // namespace kiln
