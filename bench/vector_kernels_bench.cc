// Vector kernels benchmark: elements per second of each math function and a
// few row helpers on every instruction set this CPU runs, next to the scalar
// std:: loop they replace (src/kernels/cpu/vector_kernels.h).
//
//   BM_Unary/<op>/<isa>   y = f(x) over 64K floats in [-5, 5] (in cache)
//   BM_StdLoop/<op>       the same with std::exp, std::erf, ... per element
//   BM_ExpSum/<isa>       Softmax's exp-and-sum over rows of 128
//
// Usage: vector_kernels_bench [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/vector_kernels.h"

namespace {

using kiln::vec::Isa;
using kiln::vec::Unary;

constexpr int64_t kElements = 1 << 16;

std::vector<float> inputs() {
  std::mt19937 random(1);
  std::uniform_real_distribution<float> dist(-5, 5);
  std::vector<float> x(kElements);
  for (float& v : x) v = dist(random);
  return x;
}

void BM_Unary(benchmark::State& state, const kiln::vec::VectorKernels* table, Unary op) {
  const std::vector<float> x = inputs();
  std::vector<float> y(x.size());
  for (auto _ : state) {
    table->unaryFn(op)(x.data(), y.data(), kElements, 0.5f, 0.5f);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

template <float (*kF)(float)>
void BM_StdLoop(benchmark::State& state) {
  const std::vector<float> x = inputs();
  std::vector<float> y(x.size());
  for (auto _ : state) {
    for (size_t i = 0; i < x.size(); ++i) y[i] = kF(x[i]);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}
float stdExp(float x) { return std::exp(x); }
float stdErf(float x) { return std::erf(x); }
float stdTanh(float x) { return std::tanh(x); }
float stdSigmoid(float x) { return 1 / (1 + std::exp(-x)); }
BENCHMARK(BM_StdLoop<stdExp>)->Name("BM_StdLoop/Exp");
BENCHMARK(BM_StdLoop<stdErf>)->Name("BM_StdLoop/Erf");
BENCHMARK(BM_StdLoop<stdTanh>)->Name("BM_StdLoop/Tanh");
BENCHMARK(BM_StdLoop<stdSigmoid>)->Name("BM_StdLoop/Sigmoid");

void BM_ExpSum(benchmark::State& state, const kiln::vec::VectorKernels* table) {
  const std::vector<float> x = inputs();
  std::vector<float> y(x.size());
  for (auto _ : state) {
    for (int64_t row = 0; row < kElements; row += 128) {
      benchmark::DoNotOptimize(table->expSum(x.data() + row, y.data() + row, 128, 5.0f));
    }
  }
  state.SetItemsProcessed(state.iterations() * kElements);
}

const struct Registrar {
  Registrar() {
    const std::pair<Unary, const char*> ops[] = {
        {Unary::kExp, "Exp"},   {Unary::kLog, "Log"},           {Unary::kErf, "Erf"},
        {Unary::kTanh, "Tanh"}, {Unary::kSigmoid, "Sigmoid"},   {Unary::kGelu, "Gelu"},
        {Unary::kGeluTanh, "GeluTanh"}, {Unary::kSoftplus, "Softplus"}, {Unary::kRelu, "Relu"},
    };
    for (Isa isa : kiln::vec::kAllIsas) {
      const kiln::vec::VectorKernels* table = kiln::vec::vectorKernelsFor(isa);
      if (table == nullptr) continue;
      const std::string suffix = "/" + std::string(kiln::vec::isaName(isa));
      for (const auto& [op, name] : ops) {
        benchmark::RegisterBenchmark(("BM_Unary/" + std::string(name) + suffix).c_str(), BM_Unary, table, op);
      }
      benchmark::RegisterBenchmark(("BM_ExpSum" + suffix).c_str(), BM_ExpSum, table);
    }
  }
} registrar;

}  // namespace

BENCHMARK_MAIN();
