// Kernels as steps for the benchmarks that time fused against unfused
// kernels (matmul_fusion_bench.cc, elementwise_fusion_bench.cc): tensors with
// their values, one prepared step over them, and a loop running a list of
// steps as the executor would.
#pragma once

#include <benchmark/benchmark.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernel.h"

namespace kiln::bench {

// A tensor with its bytes; `constant` tells prepare it is a weight.
struct Tensor {
  TensorInfo info;
  std::vector<float> values;
  bool constant = false;
};

inline Tensor tensor(std::vector<int64_t> shape, uint32_t seed, bool constant = false) {
  Tensor t{TensorInfo{DType::kF32, std::move(shape)}, {}, constant};
  t.values.resize(t.info.numElements());
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float& v : t.values) v = dist(random) / 8;
  return t;
}

inline Tensor scalar(float value) { return Tensor{TensorInfo{DType::kF32, {}}, {value}, true}; }

// One prepared step over tensors that outlive it.
class Step {
 public:
  Step(const std::string& op, std::vector<Tensor*> inputs, Tensor* output, const ParamMap& params = {}) {
    def_ = KernelRegistry::cpu().find(op);
    std::vector<TensorInfo> infos;
    std::vector<const std::byte*> constants;
    for (Tensor* input : inputs) {
      infos.push_back(input->info);
      constants.push_back(input->constant ? reinterpret_cast<const std::byte*>(input->values.data()) : nullptr);
      views_.push_back(kiln::viewOf(input->info, reinterpret_cast<std::byte*>(input->values.data())));
    }
    const std::vector<TensorInfo> outputs = {output->info};
    state_ = def_->prepare(kiln::KernelSetup{params, infos, outputs, constants});
    out_ = kiln::viewOf(output->info, reinterpret_cast<std::byte*>(output->values.data()));
  }
  void run() const {
    def_->run(kiln::KernelCall{views_.data(), static_cast<uint32_t>(views_.size()), &out_, 1, state_.get()});
  }

 private:
  const kiln::KernelDef* def_;
  std::unique_ptr<kiln::KernelState> state_;
  std::vector<kiln::TensorView> views_;
  mutable kiln::TensorView out_;
};

inline void runAll(benchmark::State& state, const std::vector<std::unique_ptr<Step>>& steps) {
  for (auto _ : state) {
    for (const auto& step : steps) step->run();
    benchmark::ClobberMemory();
  }
}

}  // namespace kiln::bench
