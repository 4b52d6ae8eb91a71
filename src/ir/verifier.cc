// findGraphProblems / verifyGraph: checks the invariants stated in
// include/kiln/graph.h, recursively through subgraphs.
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "kiln/error.h"
#include "kiln/graph.h"

namespace kiln {
namespace {

class Verifier {
 public:
  Verifier(bool require_types, std::vector<std::string>& problems) : require_types_(require_types), problems_(problems) {}

  // `visible`: the names defined by the enclosing graphs.
  void check(const Graph& graph, const std::string& path, const std::set<std::string>& visible) {
    path_ = path;
    checkNodes(graph);
    checkUses(graph);
    checkDefinitions(graph, visible);
    try {
      (void)graph.topologicalOrder();
    } catch (const GraphError& e) {
      report("{}", e.what());
    }
    std::set<std::string> inner = visible;
    for (ValueId id = 0; id < graph.valueCount(); ++id) inner.insert(graph.value(id).name);
    for (NodeId id : graph.nodeIds()) {
      for (const Graph* subgraph : graph.node(id).subgraphs()) {
        check(*subgraph, path + "/" + graph.node(id).name + "/" + subgraph->name(), inner);
      }
    }
  }

 private:
  template <typename... Args>
  void report(fmt::format_string<Args...> format, Args&&... args) {
    problems_.push_back(fmt::format("{}: {}", path_, fmt::format(format, std::forward<Args>(args)...)));
  }

  void checkNodes(const Graph& graph) {
    for (NodeId id : graph.nodeIds()) {
      const Node& node = graph.node(id);
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        const ValueId input = node.inputs[i];
        if (input == kNoValue) continue;
        if (input >= graph.valueCount()) {
          report("node '{}' input {} is value id {}, which does not exist", node.name, i, input);
        } else if (const Value& v = graph.value(input); v.kind == ValueKind::kNodeOutput && graph.node(v.producer).removed) {
          report("node '{}' reads '{}', produced by removed node '{}'", node.name, v.name, graph.node(v.producer).name);
        }
      }
      for (uint32_t i = 0; i < node.outputs.size(); ++i) {
        const Value& v = graph.value(node.outputs[i]);
        if (v.kind != ValueKind::kNodeOutput || v.producer != id || v.output_index != i) {
          report("node '{}' output {} '{}' is not recorded as produced by it", node.name, i, v.name);
        }
        if (require_types_ && v.type.dtype == DType::kUndefined) report("value '{}' has no dtype", v.name);
      }
    }
  }

  // Each value's use list equals the reads of the live nodes.
  void checkUses(const Graph& graph) {
    std::vector<std::vector<Use>> expected(graph.valueCount());
    for (NodeId id : graph.nodeIds()) {
      const Node& node = graph.node(id);
      for (uint32_t i = 0; i < node.inputs.size(); ++i) {
        if (node.inputs[i] != kNoValue && node.inputs[i] < graph.valueCount()) expected[node.inputs[i]].push_back({id, i});
      }
    }
    auto key = [](const Use& u) { return std::pair(u.node, u.input_index); };
    for (ValueId id = 0; id < graph.valueCount(); ++id) {
      std::vector<Use> actual = graph.value(id).users;
      auto less = [&](const Use& a, const Use& b) { return key(a) < key(b); };
      std::sort(actual.begin(), actual.end(), less);
      std::sort(expected[id].begin(), expected[id].end(), less);
      if (actual != expected[id]) report("use list of '{}' disagrees with the nodes that read it", graph.value(id).name);
    }
  }

  void checkDefinitions(const Graph& graph, const std::set<std::string>& visible) {
    for (ValueId id : graph.outputs()) {
      if (id >= graph.valueCount()) {
        report("graph output is value id {}, which does not exist", id);
      } else if (const Value& v = graph.value(id); v.kind == ValueKind::kNodeOutput && graph.node(v.producer).removed) {
        report("graph output '{}' is produced by removed node '{}'", v.name, graph.node(v.producer).name);
      }
    }
    for (ValueId id : graph.initializers()) {
      const Value& v = graph.value(id);
      if (!v.initializer || v.type.tensorInfo() != v.initializer->info) {
        report("initializer '{}' has no data or data that disagrees with its type {}", v.name, v.type.toString());
      }
    }
    for (ValueId id : graph.outerScopeValues()) {
      if (!visible.contains(graph.value(id).name)) {
        report("'{}' is read from an enclosing graph, but no enclosing graph defines it", graph.value(id).name);
      }
    }
    if (require_types_) {
      for (ValueId id : graph.inputs()) {
        if (graph.value(id).type.dtype == DType::kUndefined) report("input '{}' has no dtype", graph.value(id).name);
      }
    }
  }

  bool require_types_;
  std::vector<std::string>& problems_;
  std::string path_;
};

}  // namespace

std::vector<std::string> findGraphProblems(const Graph& graph, bool require_types) {
  std::vector<std::string> problems;
  Verifier(require_types, problems).check(graph, graph.name(), {});
  return problems;
}

void verifyGraph(const Graph& graph, bool require_types) {
  const std::vector<std::string> problems = findGraphProblems(graph, require_types);
  if (problems.empty()) return;
  throw GraphError(fmt::format("invalid graph ({} problems):\n  {}\n{}", problems.size(), fmt::join(problems, "\n  "),
                               graph.toString()));
}

}  // namespace kiln
