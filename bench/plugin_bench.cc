// A plugin op against a built-in op of the same work, through the same
// Executor: y = 2x as the test plugin's com.test.DoubleStateful (a plain C
// loop behind the ABI) and as kiln's Add(x, x), one step each, at three
// sizes. Prints the time per call of each (best of 7 repetitions, one thread)
// and their ratio (plugin / built-in; 1.00 or below: the plugin costs no
// more). The small size shows the cost of the call itself (kiln builds the
// ABI's tensors on the stack and calls through a pointer); the large ones
// the kernels' loops (kiln's Add is AVX-512 code, the plugin's whatever its
// compiler made of the loop).
//
//   build/release/bench/plugin_bench [libkiln_test_plugin.so]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/executor.h"
#include "kiln/graph.h"
#include "kiln/plugins.h"

namespace {

using namespace kiln;

std::filesystem::path writeModel(const std::string& op, int64_t n) {
  Graph g;
  const ValueId x = g.addInput("x", ValueType::tensor(DType::kF32, {n}));
  const bool plugin = op != "Add";
  const std::vector<ValueId> inputs = plugin ? std::vector<ValueId>{x} : std::vector<ValueId>{x, x};
  g.addOutput(g.node(g.addNode(op, inputs, {"y"}, {}, plugin ? "com.test" : "")).outputs[0]);
  const auto path = std::filesystem::temp_directory_path() / ("kiln_plugin_bench_" + op + std::to_string(n) + ".kiln");
  compile(g, {{"", 17}, {"com.test", 1}}, path);
  return path;
}

// Nanoseconds per call: best of 7 repetitions of `calls` calls.
double timeCalls(const std::filesystem::path& package, int64_t n, int calls) {
  ExecutorOptions options;
  options.threads = 1;
  Executor executor(package, "", options);
  std::vector<float> x(static_cast<size_t>(n), 1.5f), y(static_cast<size_t>(n));
  const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(x.data())};
  std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data())};
  for (int i = 0; i < 100; ++i) executor.run(inputs, outputs);
  double best = 1e30;
  for (int rep = 0; rep < 7; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) executor.run(inputs, outputs);
    const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, ns / calls);
  }
  if (y[0] != 3.0f) std::fprintf(stderr, "wrong result: %g\n", static_cast<double>(y[0]));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string library = argc > 1 ? argv[1] : KILN_TEST_PLUGIN;
  loadPlugin(library);
  std::printf("| elements | plugin DoubleStateful (ns/call) | built-in Add(x, x) (ns/call) | plugin / built-in |\n");
  std::printf("|---:|---:|---:|---:|\n");
  for (const int64_t n : {16, 4096, 262144}) {
    const int calls = n <= 4096 ? 200000 : 2000;
    const auto plugin = writeModel("DoubleStateful", n);
    const auto builtin = writeModel("Add", n);
    const double p = timeCalls(plugin, n, calls);
    const double b = timeCalls(builtin, n, calls);
    std::printf("| %lld | %.1f | %.1f | %.2f |\n", static_cast<long long>(n), p, b, p / b);
    std::filesystem::remove(plugin);
    std::filesystem::remove(builtin);
  }
  return 0;
}
