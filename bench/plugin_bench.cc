// A plugin op against a built-in op of the same work, through the same
// Executor, one step each, at three sizes; the time per call of each (best
// of 7 repetitions, one thread) and their ratio (plugin / built-in; 1.00 or
// below: the plugin costs no more):
//   copy: the test plugin's com.test.Copy (memcpy behind the ABI) against
//         kiln's copy step (an Identity that is the model's output, which
//         kiln runs as a memcpy): the same work exactly, so the ratio is
//         the plugin call's own cost (kiln builds the ABI's tensors on the
//         stack and calls through a pointer);
//   2x:   com.test.DoubleStateful (a plain C loop) against kiln's Add(x, x)
//         (AVX-512 code): what separates them at size is the kernels' code,
//         the plugin's as its compiler made it.
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
  const bool plugin = op != "Add" && op != "Identity";
  const std::vector<ValueId> inputs = op == "Add" ? std::vector<ValueId>{x, x} : std::vector<ValueId>{x};
  g.addOutput(g.node(g.addNode(op, inputs, {"y"}, {}, plugin ? "com.test" : "")).outputs[0]);
  const auto path = std::filesystem::temp_directory_path() / ("kiln_plugin_bench_" + op + std::to_string(n) + ".kiln");
  compile(g, {{"", 17}, {"com.test", 1}}, path);
  return path;
}

// Nanoseconds per call: best of 7 repetitions of `calls` calls; `want` is
// y[0] for x = 1.5.
double timeCalls(const std::filesystem::path& package, int64_t n, int calls, float want) {
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
  if (y[0] != want) std::fprintf(stderr, "wrong result: %g\n", static_cast<double>(y[0]));
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string library = argc > 1 ? argv[1] : KILN_TEST_PLUGIN;
  loadPlugin(library);
  std::printf("| work | elements | plugin (ns/call) | built-in (ns/call) | plugin / built-in |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  struct Pair {
    const char* work;
    const char* plugin;
    const char* builtin;
    float want;
  };
  for (const Pair pair : {Pair{"copy", "Copy", "Identity", 1.5f}, Pair{"2x", "DoubleStateful", "Add", 3.0f}}) {
    for (const int64_t n : {16, 4096, 262144}) {
      const int calls = n <= 4096 ? 200000 : 2000;
      const auto plugin = writeModel(pair.plugin, n);
      const auto builtin = writeModel(pair.builtin, n);
      const double p = timeCalls(plugin, n, calls, pair.want);
      const double b = timeCalls(builtin, n, calls, pair.want);
      std::printf("| %s | %lld | %.1f | %.1f | %.2f |\n", pair.work, static_cast<long long>(n), p, b, p / b);
      std::filesystem::remove(plugin);
      std::filesystem::remove(builtin);
    }
  }
  return 0;
}
