// What fusing a linear layer's bias, residual and activation into the oneDNN
// matmul saves, step by step, at the shapes of the benchmark models: each
// layer is timed as the unfused kernels the compiler would otherwise run one
// after the other, and as kiln.FusedMatMul / kiln.FusedGemm.
//
//   BM_Residual/{unfused,bias_fused,all_fused}   MiniLM's output projections:
//       [128, K] x [K, 384] + bias + residual (K = 384 and 1536). bias_fused
//       is FusedMatMul(bias) then an Add of the residual, all_fused adds the
//       residual as oneDNN's binary_add post-op.
//   BM_Gelu/{unfused,fused}   MiniLM's intermediate layer: [128, 384] x
//       [384, 1536] + bias, then the Erf Gelu (Div, Erf, Add, Mul, Mul).
//   BM_GemmRelu/{unfused,fused}   the MLP's first layer: Gemm(transB) [M, 784]
//       x [1024, 784]^T + bias, Relu, at M = 1 and 8.
//
// Usage: OMP_NUM_THREADS=2 matmul_fusion_bench [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
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

ParamMap activation(const std::string& name) {
  ParamMap params;
  params.set("activation", name);
  return params;
}

// 0: unfused, 1: bias fused, 2: bias and residual fused.
void BM_Residual(benchmark::State& state) {
  const int64_t m = 128, k = state.range(1), n = 384;
  Tensor a = tensor({1, m, k}, 1), w = tensor({k, n}, 2, true), bias = tensor({n}, 3, true);
  Tensor residual = tensor({1, m, n}, 4), t1 = tensor({1, m, n}, 0), t2 = tensor({1, m, n}, 0), y = tensor({1, m, n}, 0);
  std::vector<std::unique_ptr<Step>> steps;
  switch (state.range(0)) {
    case 0:
      steps.push_back(std::make_unique<Step>("MatMul", std::vector<Tensor*>{&a, &w}, &t1));
      steps.push_back(std::make_unique<Step>("Add", std::vector<Tensor*>{&t1, &bias}, &t2));
      steps.push_back(std::make_unique<Step>("Add", std::vector<Tensor*>{&t2, &residual}, &y));
      break;
    case 1:
      steps.push_back(std::make_unique<Step>("kiln.FusedMatMul", std::vector<Tensor*>{&a, &w, &bias}, &t1));
      steps.push_back(std::make_unique<Step>("Add", std::vector<Tensor*>{&t1, &residual}, &y));
      break;
    default:
      steps.push_back(std::make_unique<Step>("kiln.FusedMatMul", std::vector<Tensor*>{&a, &w, &bias, &residual}, &y));
  }
  state.SetLabel(state.range(0) == 0 ? "unfused" : state.range(0) == 1 ? "bias_fused" : "all_fused");
  runAll(state, steps);
}
BENCHMARK(BM_Residual)->ArgsProduct({{0, 1, 2}, {384, 1536}})->Unit(benchmark::kMicrosecond);

void BM_Gelu(benchmark::State& state) {
  const int64_t m = 128, k = 384, n = 1536;
  Tensor a = tensor({1, m, k}, 1), w = tensor({k, n}, 2, true), bias = tensor({n}, 3, true);
  Tensor sqrt2 = scalar(std::sqrt(2.0f)), one = scalar(1), half = scalar(0.5f);
  std::vector<Tensor> t(6, tensor({1, m, n}, 0));
  std::vector<std::unique_ptr<Step>> steps;
  if (state.range(0) == 0) {
    steps.push_back(std::make_unique<Step>("MatMul", std::vector<Tensor*>{&a, &w}, &t[0]));
    steps.push_back(std::make_unique<Step>("Add", std::vector<Tensor*>{&t[0], &bias}, &t[1]));
    steps.push_back(std::make_unique<Step>("Div", std::vector<Tensor*>{&t[1], &sqrt2}, &t[2]));
    steps.push_back(std::make_unique<Step>("Erf", std::vector<Tensor*>{&t[2]}, &t[3]));
    steps.push_back(std::make_unique<Step>("Add", std::vector<Tensor*>{&t[3], &one}, &t[4]));
    steps.push_back(std::make_unique<Step>("Mul", std::vector<Tensor*>{&t[1], &t[4]}, &t[5]));
    steps.push_back(std::make_unique<Step>("Mul", std::vector<Tensor*>{&t[5], &half}, &t[0]));
  } else {
    steps.push_back(
        std::make_unique<Step>("kiln.FusedMatMul", std::vector<Tensor*>{&a, &w, &bias}, &t[0], activation("Gelu")));
  }
  state.SetLabel(state.range(0) == 0 ? "unfused" : "fused");
  runAll(state, steps);
}
BENCHMARK(BM_Gelu)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

void BM_GemmRelu(benchmark::State& state) {
  const int64_t m = state.range(1), k = 784, n = 1024;
  Tensor a = tensor({m, k}, 1), w = tensor({n, k}, 2, true), bias = tensor({n}, 3, true);
  Tensor t = tensor({m, n}, 0), y = tensor({m, n}, 0);
  ParamMap params = state.range(0) == 0 ? ParamMap{} : activation("Relu");
  params.set("transB", int64_t{1});
  std::vector<std::unique_ptr<Step>> steps;
  if (state.range(0) == 0) {
    steps.push_back(std::make_unique<Step>("Gemm", std::vector<Tensor*>{&a, &w, &bias}, &t, params));
    steps.push_back(std::make_unique<Step>("Relu", std::vector<Tensor*>{&t}, &y));
  } else {
    steps.push_back(std::make_unique<Step>("kiln.FusedGemm", std::vector<Tensor*>{&a, &w, &bias}, &y, params));
  }
  state.SetLabel(state.range(0) == 0 ? "unfused" : "fused");
  runAll(state, steps);
}
BENCHMARK(BM_GemmRelu)->ArgsProduct({{0, 1}, {1, 8}})->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
