// Graphs whose shapes are known only at run time.
//
// analyzeRuntimeShapes tells whether a graph can be planned ahead of time
// and, if not, which model inputs' values its shapes depend on (the shape
// inputs: a Reshape's target, a sample rate that picks an If branch). A
// graph package is specialized per input signature (DynamicExecutor), the
// shape inputs' values being part of the signature.
//
// Some shapes depend on values the model computes: how many steps a Loop ran
// before its condition stopped it, how many boxes survived NonZero. No input
// signature fixes them. splitAtUnknownShapes cuts such a graph in two: the
// prefix (every node whose shapes are known, and that reads only what such
// nodes give) runs first, and the rest, whose inputs are the prefix's
// results, is specialized on them like a model of its own (its shape inputs
// being the small values it reads, such as the Loop's step count).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/graph.h"

namespace kiln {

struct RuntimeShapes {
  bool dynamic = false;
  std::vector<std::string> shape_inputs;
  std::string reason;  // why, in a few words, for the compile's notice
};

// A value's type as an anchor declares it: unknown dimensions are
// kDynamicDim, an unknown rank an empty shape.
TensorInfo anchorInfo(const ValueType& type);

// Infers what can be inferred and folds what can be folded (changing
// `graph`), then answers.
RuntimeShapes analyzeRuntimeShapes(Graph& graph, const std::map<std::string, int64_t>& opsets,
                                   const CompileOptions& options);

struct StagedGraph {
  Graph prefix;  // inputs: the model's; outputs: what the rest reads
  Graph rest;    // inputs: the prefix's outputs and the model inputs it reads; outputs: the model's
};

// `graph` (inferred and folded by analyzeRuntimeShapes) cut before its first
// values of unknown shape; nullopt when it has none, or when no node can run
// before them. A node with a subgraph whose shapes are not all static (a
// Loop body that slices by the step count) counts as one of unknown shape.
std::optional<StagedGraph> splitAtUnknownShapes(const Graph& graph);

// A Loop whose body's shapes change from one iteration to the next cannot
// be compiled as one program: it runs on the host, iteration by iteration,
// its body a model of its own specialized on what each iteration reads
// (DynamicExecutor). The Loop reads only the graph's inputs and initializers
// (staging has run what comes before it).
struct LoopStage {
  // The body as a model: inputs are the body's (iteration number,
  // condition, carried values), then the values it reads from enclosing
  // graphs, under their names; outputs are the body's (condition, carried
  // values, scan outputs).
  Graph body;
  std::vector<std::string> loop_inputs;   // the Loop's inputs by name ("" when absent)
  std::vector<std::string> captures;      // the enclosing graph's values the body reads
  // Per carried value: whether the body gives it back unchanged (weights
  // handed through the loop), so that the host keeps its buffer; `body`
  // does not output those. body_outputs: the index among the Loop body's
  // outputs of each output of `body`.
  std::vector<bool> unchanged;
  std::vector<size_t> body_outputs;
  std::vector<std::string> loop_outputs;  // the Loop's outputs by name
  Graph after;  // inputs: the Loop's outputs and the graph inputs it reads; outputs: the graph's
};

// `graph` cut around its first Loop with a body of unknown shapes (or
// outputs of unknown shape: carried values that grow) whose reads are all
// graph inputs or initializers; nullopt when there is none.
std::optional<LoopStage> splitAtDynamicLoop(const Graph& graph);

// Whether every value of `node`'s subgraphs (and theirs) has a static shape.
bool hasStaticSubgraphs(const Node& node);

// A node whose output shapes depend on values only known while the model
// runs (a Slice to a step count inside a Loop body), when nothing before it
// is left to run: it is evaluated on the host, on the values it reads, and
// what follows is specialized on the shapes it gave, not on those values
// (which change at every iteration).
struct NodeStage {
  std::string op_type, domain;
  Attributes attributes;
  std::vector<std::string> inputs;   // by name ("" when absent)
  std::vector<std::string> outputs;  // by name
  Graph after;  // inputs: the node's outputs and the graph inputs it reads; outputs: the graph's
};

// `graph` cut after its first node without subgraphs whose outputs have
// unknown shapes and whose inputs are all graph inputs or initializers;
// with `selections_only`, the first such node that is a selection (NonZero,
// NonMaxSuppression, Compress, Unique: ops whose output size is the point
// of their values);
// nullopt when there is none.
std::optional<NodeStage> splitAtUnknownNode(const Graph& graph, bool selections_only = false);

// Whether `node` is a selection whose output size depends on the values
// it reads by definition (NonZero, NonMaxSuppression, Compress, Unique).
bool isSelection(const Node& node);

// Evaluates a node of `op_type` on constant `inputs` (nullptr: absent): its
// output types inferred from them, its values computed by constant folding
// or its CPU kernel (options.evaluate_kernel). UsageError when it cannot.
std::vector<ConstantPtr> evaluateNode(const std::string& op_type, const std::string& domain,
                                      const Attributes& attributes, size_t output_count,
                                      const std::vector<ConstantPtr>& inputs,
                                      const std::map<std::string, int64_t>& opsets, const CompileOptions& options);

}  // namespace kiln
