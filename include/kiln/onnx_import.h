// ONNX import: reads an ONNX model file into a kiln Graph.
//
// Handles initializers (raw, typed and external data), opset imports, value
// infos, attributes of every ONNX kind used by operators (scalars, lists,
// tensors, subgraphs), and the bodies of If/Loop/Scan, whose reads of
// enclosing values become outer-scope values. Nodes may come in any order;
// they are sorted by their data dependencies.
//
// Dynamic input dimensions are fixed at import with `input_shapes`
// (`kiln compile --shape x:1x3x224x224`) or `batch` (`--batch N`, which sets
// every unknown leading dimension). With `require_static_inputs`, an input
// dimension left unknown is an error naming the input and the dimension;
// without it the dimension stays symbolic, and the compiled package fixes it
// at run time (`kiln compile` and `kiln.compile` say so in a notice).
//
// Every problem in the model is a GraphError that names the file and what
// was expected and found. Thread safety: the functions are reentrant.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

struct OnnxImportOptions {
  std::map<std::string, std::vector<int64_t>> input_shapes;
  std::optional<int64_t> batch;
  bool require_static_inputs = true;
};

struct OnnxModel {
  GraphPtr graph;
  int64_t ir_version = 0;
  std::map<std::string, int64_t> opsets;  // domain ("" = ai.onnx) -> version
  std::string producer;                    // producer_name and version
};

OnnxModel importOnnx(const std::filesystem::path& path, const OnnxImportOptions& options = {});

// Imports a model held in memory. External data files are looked up in
// `base_directory`; an empty path refuses external data.
OnnxModel importOnnxFromMemory(std::span<const std::byte> bytes, const std::string& source_name,
                               const std::filesystem::path& base_directory, const OnnxImportOptions& options = {});

// The first graph input dimension that is not fixed, as "input 'x'
// dimension 0 ('batch')" (or "the shape of input 'x'"); empty when every
// input's shape is static.
std::string unfixedInputDimension(const Graph& graph);

// Parses "1x3x224x224" (the --shape syntax); throws UsageError.
std::vector<int64_t> parseDims(const std::string& text);

}  // namespace kiln
