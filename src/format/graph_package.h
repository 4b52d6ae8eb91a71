// Graph packages: models whose shapes are only known at run time.
//
// When some shape depends on the inputs (a symbolic batch or sequence
// dimension, or a Reshape/Expand/Range... whose shape operand is a model
// input), the compiler cannot plan one step list ahead of time. It then
// stores the model's graph (src/ir/graph_codec.h) in the Executable blob and
// marks the Metadata with option `executable.format` = `kiln-graph`; large
// initializers stay TensorData blobs. DynamicExecutor (src/specialize/)
// compiles the graph for each input signature it meets and caches the
// results. Option `shape_inputs` lists, comma separated, the inputs whose
// *values* shapes depend on: their contents are part of the signature. The
// metadata's target says where the specializations run (cpu or cuda).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/metadata.h"

namespace kiln {

inline constexpr std::string_view kExecutableFormatOption = "executable.format";
inline constexpr std::string_view kGraphExecutableFormat = "kiln-graph";
inline constexpr std::string_view kShapeInputsOption = "shape_inputs";
// Precision flags of a cuda package (CompileOptions::tf32, fp16, bf16), "1" when
// set: each specialization is compiled with them.
inline constexpr std::string_view kCudaTf32Option = "cuda.tf32";
inline constexpr std::string_view kCudaFp16Option = "cuda.fp16";
inline constexpr std::string_view kCudaBf16Option = "cuda.bf16";

inline bool isGraphPackage(const Metadata& metadata) {
  const auto it = metadata.options.find(std::string(kExecutableFormatOption));
  return it != metadata.options.end() && it->second == kGraphExecutableFormat;
}

// The names in option `shape_inputs`.
inline std::vector<std::string> shapeInputsOf(const Metadata& metadata) {
  std::vector<std::string> names;
  const auto it = metadata.options.find(std::string(kShapeInputsOption));
  if (it == metadata.options.end()) return names;
  std::string_view rest = it->second;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    names.emplace_back(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return names;
}

}  // namespace kiln
