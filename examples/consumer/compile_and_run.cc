// Builds y = x @ w + b with kiln's graph API, compiles it into a package
// with libkiln_compiler, loads and runs it with libkiln_runtime's
// Executor, and checks the answer against a plain loop.
//
// Usage: compile_and_run OUT.kiln   (prints the outputs; exit 1 on a mismatch)
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/executor.h"
#include "kiln/graph.h"
#include "kiln/version.h"

namespace {

constexpr int64_t kRows = 2, kIn = 3, kOut = 2;

kiln::ConstantPtr constant(std::vector<int64_t> shape, const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return kiln::makeConstant(kiln::TensorInfo{kiln::DType::kF32, std::move(shape)}, std::move(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.kiln\n", argv[0]);
    return 2;
  }
  const std::vector<float> w = {1, 2, 3, 4, 5, 6}, b = {0.5f, -0.5f};
  kiln::Graph graph;
  const kiln::ValueId x = graph.addInput("x", kiln::ValueType::tensor(kiln::DType::kF32, {kRows, kIn}));
  const kiln::ValueId wv = graph.addInitializer("w", constant({kIn, kOut}, w));
  const kiln::ValueId bv = graph.addInitializer("b", constant({kOut}, b));
  const kiln::ValueId xw = graph.node(graph.addNode("MatMul", {x, wv}, {"xw"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("Add", {xw, bv}, {"y"})).outputs[0]);
  kiln::compile(graph, {{"", 17}}, argv[1]);

  kiln::Executor executor(argv[1]);
  const std::vector<float> input = {1, 0, -1, 0.5f, 0.25f, 2};
  std::vector<float> y(kRows * kOut);
  const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(input.data())};
  std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data())};
  executor.run(inputs, outputs);

  int mismatches = 0;
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t j = 0; j < kOut; ++j) {
      float want = b[j];
      for (int64_t i = 0; i < kIn; ++i) want += input[r * kIn + i] * w[i * kOut + j];
      std::printf("y[%lld][%lld] = %g\n", static_cast<long long>(r), static_cast<long long>(j), y[r * kOut + j]);
      if (std::fabs(y[r * kOut + j] - want) > 1e-5f) ++mismatches;
    }
  }
  std::printf("kiln %s: %s\n", KILN_VERSION, mismatches == 0 ? "ok" : "MISMATCH");
  return mismatches == 0 ? 0 : 1;
}
