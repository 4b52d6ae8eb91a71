// Helpers shared by the op-family inference tests: build a graph with
// GraphBuilder, infer its types at an opset, read the types back as text.
#pragma once

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/graph_builder.h"
#include "ops/shape_inference.h"

namespace kiln::testing {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

// "f32[batch, 3, ?]" -> a ValueType; "f32[*]" has an unknown rank.
inline ValueType parseType(const std::string& text) {
  const size_t open = text.find('[');
  ValueType type{*dtypeFromName(text.substr(0, open)), std::nullopt};
  const std::string dims = text.substr(open + 1, text.size() - open - 2);
  if (dims == "*") return type;
  type.shape.emplace();
  std::istringstream in(dims);
  for (std::string dim; std::getline(in >> std::ws, dim, ',');) {
    if (dim == "?") {
      type.shape->push_back(Dim{});
    } else if (std::isdigit(static_cast<unsigned char>(dim[0]))) {
      type.shape->push_back(Dim::known(std::stoll(dim)));
    } else {
      type.shape->push_back(Dim::symbolic(dim));
    }
  }
  return type;
}

// Infers the graph's types at `opset` and returns those of `values`.
inline std::vector<std::string> inferredTypes(GraphBuilder& b, const std::vector<ValueId>& values, int64_t opset = 17) {
  GraphPtr graph = b.build();
  inferTypes(*graph, {{"", opset}});
  std::vector<std::string> types;
  for (ValueId value : values) types.push_back(graph->value(value).type.toString());
  return types;
}

inline std::string inferredType(GraphBuilder& b, ValueId value, int64_t opset = 17) {
  return inferredTypes(b, {value}, opset).front();
}

// Succeeds when inference fails with a message containing `part`.
inline AssertionResult failsWith(GraphBuilder& b, const std::string& part, int64_t opset = 17) {
  GraphPtr graph = b.build();
  try {
    inferTypes(*graph, {{"", opset}});
  } catch (const GraphError& e) {
    if (std::string(e.what()).find(part) != std::string::npos) return AssertionSuccess();
    return AssertionFailure() << "the error \"" << e.what() << "\" does not contain \"" << part << "\"";
  }
  return AssertionFailure() << "inference succeeded; expected an error containing \"" << part << "\"";
}

}  // namespace kiln::testing
