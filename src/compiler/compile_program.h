// The compiler's in-memory half: a graph whose shapes are all known becomes
// a step program (ExecutableSpec) without writing a package. compile()
// writes its result into a package; DynamicExecutor (src/specialize/) runs
// it straight away, once per input signature of a graph package.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "format/executable_spec.h"
#include "kiln/compiler.h"
#include "kiln/graph.h"

namespace kiln {

struct CompiledProgram {
  ExecutableSpec spec;
  std::vector<ConstantPtr> constants;  // the data of spec.constants[i]
  CompileReport report;
};

// Weights kept as variables (CompileOptions::variables): during the passes
// each is a graph input, which nothing folds; lowering makes it the constant
// it was, with this data.
using Variables = std::map<std::string, ConstantPtr>;
// Training: graph output i (the last ones) is the new value of variable
// assignments[i]; lowering writes it over the variable (kiln.Assign) at the
// end of the program instead of into a caller's buffer.
using Assignments = std::map<size_t, std::string>;

// Infers types, runs the passes (docs/compiler.md) and lowers `graph`,
// which it changes.
// Throws GraphError when a shape is still unknown.
CompiledProgram compileProgram(Graph& graph, const std::map<std::string, int64_t>& opsets,
                               const CompileOptions& options, const Variables& variables = {},
                               const Assignments& assignments = {});

}  // namespace kiln
