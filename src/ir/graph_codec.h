// Graph codec: a Graph, with its subgraphs, as bytes and back.
//
// Packages whose shapes are only known at run time (symbolic dimensions,
// shapes read from input values) store the model's graph instead of a
// step list; the runtime specializes it per input signature
// (src/specialize/). Initializers can stay out of the encoding: `keep_out`
// picks those written elsewhere (as TensorData blobs), which decoding asks
// `resolve` for by name.
//
// Encoding (docs/format.md primitives): u32 version, then a graph:
//   string name; list<(string, type)> inputs; list<(string, type)> outer
//   scope values; list<(string, u8 kind, TensorInfo | bytes)> initializers
//   (kind 0: inline TensorInfo + u64 size + bytes, 1: by name);
//   list<node> in topological order; list<string> outputs
//   node = string op, string domain, string name, list<string> inputs ("" is
//   an omitted input), list<(string, type)> outputs, list<attribute>
//   type = u8 dtype, u8 has_shape, list<(i64 size, string symbol)>
//   attribute = string key, u8 kind (the Attribute variant index), value.
// Decoding checks every count and index and then verifyGraph(); a corrupt
// encoding is a FormatError naming `source`.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kiln/graph.h"

namespace kiln {

inline constexpr uint32_t kGraphCodecVersion = 1;

std::vector<std::byte> encodeGraph(const Graph& graph,
                                   const std::function<bool(const Value& initializer)>& keep_out = {});

Graph decodeGraph(std::span<const std::byte> bytes, const std::string& source,
                  const std::function<ConstantPtr(const std::string& name)>& resolve = {});

}  // namespace kiln
