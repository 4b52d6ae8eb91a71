// Binding plugin ops: every node of a loaded plugin's op becomes a
// kiln.Plugin node, which the rest of the compiler treats like any other
// kiln op (its schema infers through the plugin: ops/plugin_ops.cc; its
// kernel calls it: kernels/cpu/plugin_kernel.cc).
//
// A node is bound when kiln has no schema of its own for its (domain,
// op_type) at the model's opset and a loaded plugin serves it at that
// opset: kiln's own ops always win. The node keeps its name, inputs and
// outputs; its attributes become one JSON object (scalars, strings and
// lists; tensor and graph attributes are refused with a GraphError), and it
// gains the parameters the kernel reads (plugin_domain, plugin_op,
// plugin_version, plugin_library, attributes, and the metadata
// plugin_stateless, plugin_inplace, plugin_elementwise).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

struct PluginLibrary;
struct PluginOp;

// Binds the plugin ops of `graph` and its subgraphs; returns the libraries
// they come from (each once), for the package to record.
std::vector<const PluginLibrary*> bindPluginOps(Graph& graph, const std::map<std::string, int64_t>& opsets);

// The attributes of a bound node of `op` whose own attributes are
// `attributes_json` (autodiff binds the gradient nodes it adds with them).
Attributes boundPluginAttributes(const PluginOp& op, const std::string& attributes_json);

// The libraries of the plugin ops `graph` (with its subgraphs) still holds.
std::vector<const PluginLibrary*> usedPluginLibraries(const Graph& graph);

// Whether `node` is a bound plugin op that declared itself stateless (only
// those may be folded on constants or merged with an equal node).
bool isStatelessPluginOp(const Node& node);
bool isPluginOp(const Node& node);

}  // namespace kiln
