// What fusing chains of elementwise ops into one kiln.FusedElementwise step
// saves, at the shapes of the benchmark models: each chain is timed as the
// unfused kernels the compiler would otherwise run one after the other, and
// as the one fused step (passes/elementwise_fusion.h).
//
//   BM_AttentionMask/{unfused,fused}   MiniLM's scores / sqrt(32) + mask:
//       [1, 12, 128, 128] with the mask [1, 1, 1, 128].
//   BM_LayerNormTail/{unfused,fused}   a LayerNorm written out, after its
//       reductions: (x - mean) / std * gamma + beta on [1, 128, 384].
//   BM_Swish/{unfused,fused}   x * sigmoid(x) on a YOLO-sized [1, 32, 160, 160].
//   BM_Chain/{unfused,fused}   the chain1000 model: 250 x (Add w, Mul w, Relu,
//       Sigmoid) on [1, 64], where dispatch is what costs.
//
// Usage: elementwise_fusion_bench [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "bench/kernel_steps.h"

namespace {

using kiln::ParamMap;
using kiln::bench::runAll;
using kiln::bench::scalar;
using kiln::bench::Step;
using kiln::bench::Tensor;
using kiln::bench::tensor;
using Steps = std::vector<std::unique_ptr<Step>>;

// The parameters of a fused program (core/elementwise_program.h).
ParamMap program(const std::string& ops, const std::vector<int64_t>& operands, const std::vector<double>& immediates) {
  ParamMap params;
  const size_t count = operands.size() / 2;
  params.set("ops", ops);
  params.set("operands", operands);
  params.set("alpha", std::vector<double>(count, 0.0));
  params.set("beta", std::vector<double>(count, 0.0));
  if (!immediates.empty()) params.set("immediates", immediates);
  return params;
}

const char* label(bool fused) { return fused ? "fused" : "unfused"; }

void BM_AttentionMask(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  Tensor scores = tensor({1, 12, 128, 128}, 1), mask = tensor({1, 1, 1, 128}, 2), scale = scalar(std::sqrt(32.0f));
  Tensor t = tensor({1, 12, 128, 128}, 0), y = tensor({1, 12, 128, 128}, 0);
  Steps steps;
  if (fused) {
    // Slots: scores 0, mask 1, sqrt(32) 2, results 3, 4.
    steps.push_back(std::make_unique<Step>("kiln.FusedElementwise", std::vector<Tensor*>{&scores, &mask}, &y,
                                           program("Div,Add", {0, 2, 3, 1}, {std::sqrt(32.0)})));
  } else {
    steps.push_back(std::make_unique<Step>("Div", std::vector<Tensor*>{&scores, &scale}, &t));
    steps.push_back(std::make_unique<Step>("Add", std::vector<Tensor*>{&t, &mask}, &y));
  }
  state.SetLabel(label(fused));
  runAll(state, steps);
}
BENCHMARK(BM_AttentionMask)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_LayerNormTail(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  Tensor centered = tensor({1, 128, 384}, 1), deviation = tensor({1, 128, 1}, 2);
  Tensor gamma = tensor({384}, 3, true), beta = tensor({384}, 4, true);
  Tensor t1 = tensor({1, 128, 384}, 0), t2 = tensor({1, 128, 384}, 0), y = tensor({1, 128, 384}, 0);
  Steps steps;
  if (fused) {
    steps.push_back(std::make_unique<Step>("kiln.FusedElementwise",
                                           std::vector<Tensor*>{&centered, &deviation, &gamma, &beta}, &y,
                                           program("Div,Mul,Add", {0, 1, 4, 2, 5, 3}, {})));
  } else {
    steps.push_back(std::make_unique<Step>("Div", std::vector<Tensor*>{&centered, &deviation}, &t1));
    steps.push_back(std::make_unique<Step>("Mul", std::vector<Tensor*>{&t1, &gamma}, &t2));
    steps.push_back(std::make_unique<Step>("Add", std::vector<Tensor*>{&t2, &beta}, &y));
  }
  state.SetLabel(label(fused));
  runAll(state, steps);
}
BENCHMARK(BM_LayerNormTail)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_Swish(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  Tensor x = tensor({1, 32, 160, 160}, 1), t = tensor({1, 32, 160, 160}, 0), y = tensor({1, 32, 160, 160}, 0);
  Steps steps;
  if (fused) {
    steps.push_back(std::make_unique<Step>("kiln.FusedElementwise", std::vector<Tensor*>{&x}, &y,
                                           program("Sigmoid,Mul", {0, -1, 0, 1}, {})));
  } else {
    steps.push_back(std::make_unique<Step>("Sigmoid", std::vector<Tensor*>{&x}, &t));
    steps.push_back(std::make_unique<Step>("Mul", std::vector<Tensor*>{&x, &t}, &y));
  }
  state.SetLabel(label(fused));
  runAll(state, steps);
}
BENCHMARK(BM_Swish)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_Chain(benchmark::State& state) {
  const bool fused = state.range(0) != 0;
  constexpr int kLinks = 250;
  Tensor x = tensor({1, 64}, 1), y = tensor({1, 64}, 0);
  std::vector<Tensor> weights;
  for (int i = 0; i < kLinks; ++i) weights.push_back(tensor({64}, 2 + i, true));
  std::vector<Tensor> t(2, tensor({1, 64}, 0));
  Steps steps;
  if (fused) {
    // Slots: x 0, w_i 1 + i, results from 1 + kLinks.
    std::vector<Tensor*> inputs = {&x};
    std::vector<int64_t> operands;
    std::string ops;
    int64_t h = 0;
    int64_t result = 1 + kLinks;
    for (int i = 0; i < kLinks; ++i) {
      inputs.push_back(&weights[i]);
      ops += std::string(i == 0 ? "" : ",") + "Add,Mul,Relu,Sigmoid";
      operands.insert(operands.end(), {h, 1 + i, result, 1 + i, result + 1, -1, result + 2, -1});
      h = result + 3;
      result += 4;
    }
    steps.push_back(std::make_unique<Step>("kiln.FusedElementwise", inputs, &y, program(ops, operands, {})));
  } else {
    Tensor* h = &x;
    for (int i = 0; i < kLinks; ++i) {
      Tensor* out = i + 1 == kLinks ? &y : &t[1];
      steps.push_back(std::make_unique<Step>("Add", std::vector<Tensor*>{h, &weights[i]}, &t[0]));
      steps.push_back(std::make_unique<Step>("Mul", std::vector<Tensor*>{&t[0], &weights[i]}, &t[1]));
      steps.push_back(std::make_unique<Step>("Relu", std::vector<Tensor*>{&t[1]}, &t[0]));
      steps.push_back(std::make_unique<Step>("Sigmoid", std::vector<Tensor*>{&t[0]}, out));
      h = out;
    }
  }
  state.SetLabel(label(fused));
  runAll(state, steps);
}
BENCHMARK(BM_Chain)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
