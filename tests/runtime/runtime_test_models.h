// Small models for the runtime tests, compiled into temporary packages, with
// plain C++ references to check results against.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/compiler.h"
#include "kiln/device.h"
#include "kiln/graph.h"
#include "tests/device/device_test_util.h"

namespace kiln::testing {

// The affine model the runtime tests serve: batches of 4 rows of 8 features.
constexpr int64_t kBatch = 4;
constexpr int64_t kFeatures = 8;

// `count` input rows of the affine model, distinct for each `start`.
inline std::vector<float> rows(size_t count, float start) {
  std::vector<float> x(count * kFeatures);
  for (size_t i = 0; i < x.size(); ++i) x[i] = start + 0.5f * static_cast<float>(i % 11);
  return x;
}

// Relative comparison: the references sum in another order than the kernels.
inline bool near(float got, float want) { return std::abs(got - want) <= 1e-5f * std::max(1.0f, std::abs(want)); }

// A package file removed when the object goes.
class TempPackage {
 public:
  explicit TempPackage(const std::string& name) {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("kiln_rt_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" + name + ".kiln");
  }
  ~TempPackage() { std::filesystem::remove(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline ConstantPtr floatConstant(const std::vector<int64_t>& shape, const std::vector<float>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return makeConstant(TensorInfo{DType::kF32, shape}, std::move(bytes));
}

// The weights of the affine model: w[i][j] = (i == j) * 2 + 0.01 * (i + j),
// b[j] = j.
inline std::vector<float> affineWeights(int64_t features) {
  std::vector<float> w(static_cast<size_t>(features * features));
  for (int64_t i = 0; i < features; ++i) {
    for (int64_t j = 0; j < features; ++j) w[i * features + j] = (i == j ? 2.0f : 0.0f) + 0.01f * static_cast<float>(i + j);
  }
  return w;
}
inline std::vector<float> affineBias(int64_t features) {
  std::vector<float> b(static_cast<size_t>(features));
  for (int64_t j = 0; j < features; ++j) b[j] = static_cast<float>(j);
  return b;
}

// y[batch, features] = x @ w + b: weights in TensorData (load anchors).
// `target`: the compile target ("cpu", which sim runs too, or "cuda").
inline void writeAffineModel(const std::filesystem::path& path, int64_t batch, int64_t features,
                             const std::string& target = "cpu") {
  Graph graph;
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {batch, features}));
  const ValueId w = graph.addInitializer("w", floatConstant({features, features}, affineWeights(features)));
  const ValueId b = graph.addInitializer("b", floatConstant({features}, affineBias(features)));
  const ValueId xw = graph.node(graph.addNode("MatMul", {x, w}, {"xw"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("Add", {xw, b}, {"y"})).outputs[0]);
  CompileOptions options;
  options.target = target;
  compile(graph, {{"", 17}}, path, options);
}

// The affine model's output rows for input rows `x` (any number of rows).
inline std::vector<float> affineReference(const std::vector<float>& x, int64_t features) {
  const std::vector<float> w = affineWeights(features);
  const std::vector<float> b = affineBias(features);
  const size_t rows = x.size() / static_cast<size_t>(features);
  std::vector<float> y(x.size());
  for (size_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < features; ++j) {
      float sum = 0;
      for (int64_t i = 0; i < features; ++i) sum += x[r * features + i] * w[i * features + j];
      y[r * features + j] = sum + b[j];
    }
  }
  return y;
}

// Whether `y` holds the affine model's output rows for input rows `x`.
inline bool matchesAffine(const std::vector<float>& y, const std::vector<float>& x) {
  const std::vector<float> want = affineReference(x, kFeatures);
  if (y.size() != want.size()) return false;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!near(y[i], want[i])) return false;
  }
  return true;
}

// y[outer, batch, inner] = x * 3 - 1: batching on a middle dimension.
inline void writeMiddleBatchModel(const std::filesystem::path& path, int64_t outer, int64_t batch, int64_t inner) {
  Graph graph;
  const ValueId x = graph.addInput("x", ValueType::tensor(DType::kF32, {outer, batch, inner}));
  const ValueId three = graph.addInitializer("three", floatConstant({}, {3.0f}));
  const ValueId one = graph.addInitializer("one", floatConstant({}, {1.0f}));
  const ValueId scaled = graph.node(graph.addNode("Mul", {x, three}, {"scaled"})).outputs[0];
  graph.addOutput(graph.node(graph.addNode("Sub", {scaled, one}, {"y"})).outputs[0]);
  compile(graph, {{"", 17}}, path);
}

// Two sub-models fused behind an If: y = select ? a * 2 : b + 10, with a and
// b of shape [4]; each branch reads only its own input.
inline void writeConditionalModel(const std::filesystem::path& path) {
  auto then_branch = std::make_shared<Graph>("model_a");
  {
    const ValueId a = then_branch->addOuterScopeValue("a");
    const ValueId two = then_branch->addInitializer("two", floatConstant({}, {2.0f}));
    then_branch->addOutput(then_branch->node(then_branch->addNode("Mul", {a, two}, {"ya"})).outputs[0]);
  }
  auto else_branch = std::make_shared<Graph>("model_b");
  {
    const ValueId b = else_branch->addOuterScopeValue("b");
    const ValueId ten = else_branch->addInitializer("ten", floatConstant({}, {10.0f}));
    else_branch->addOutput(else_branch->node(else_branch->addNode("Add", {b, ten}, {"yb"})).outputs[0]);
  }
  Graph graph;
  const ValueId select = graph.addInput("select", ValueType::tensor(DType::kBool, {}));
  graph.addInput("a", ValueType::tensor(DType::kF32, {4}));
  graph.addInput("b", ValueType::tensor(DType::kF32, {4}));
  const NodeId node = graph.addNode("If", {select}, {"y"},
                                    {{"then_branch", GraphPtr(then_branch)}, {"else_branch", GraphPtr(else_branch)}});
  graph.addOutput(graph.node(node).outputs[0]);
  compile(graph, {{"", 17}}, path);
}

// A Loop of 3 iterations over v [4]: body v_out = v_in * 0.5 + 1, and each
// iteration's v_out stacked into the scan output s [3, 4].
inline void writeLoopModel(const std::filesystem::path& path) {
  auto body = std::make_shared<Graph>("body");
  body->addInput("i", ValueType::tensor(DType::kI64, {}));
  const ValueId cond_in = body->addInput("cond_in", ValueType::tensor(DType::kBool, {}));
  const ValueId v_in = body->addInput("v_in", ValueType::tensor(DType::kF32, {4}));
  const ValueId half = body->addInitializer("half", floatConstant({}, {0.5f}));
  const ValueId one = body->addInitializer("one", floatConstant({}, {1.0f}));
  const ValueId scaled = body->node(body->addNode("Mul", {v_in, half}, {"scaled"})).outputs[0];
  const ValueId v_out = body->node(body->addNode("Add", {scaled, one}, {"v_out"})).outputs[0];
  const ValueId cond_out = body->node(body->addNode("Identity", {cond_in}, {"cond_out"})).outputs[0];
  const ValueId slice = body->node(body->addNode("Identity", {v_out}, {"slice"})).outputs[0];
  body->addOutput(cond_out);
  body->addOutput(v_out);
  body->addOutput(slice);
  Graph graph;
  const ValueId v0 = graph.addInput("v0", ValueType::tensor(DType::kF32, {4}));
  std::vector<std::byte> three(sizeof(int64_t));
  const int64_t iterations = 3;
  std::memcpy(three.data(), &iterations, sizeof(iterations));
  const ValueId m = graph.addInitializer("M", makeConstant(TensorInfo{DType::kI64, {}}, std::move(three)));
  const NodeId loop = graph.addNode("Loop", {m, kNoValue, v0}, {"v", "s"}, {{"body", GraphPtr(body)}});
  graph.addOutput(graph.node(loop).outputs[0]);
  graph.addOutput(graph.node(loop).outputs[1]);
  compile(graph, {{"", 17}}, path);
}

// Sim devices locked in a private directory (one per test process, removed
// at exit), so that parallel test processes never share them.
inline std::filesystem::path privateLockDir() {
  static const TempLockDir directory;
  return directory.path();
}

inline DeviceManagerOptions simOptions(uint32_t devices, SimDeviceConfig sim = {}) {
  DeviceManagerOptions options;
  options.sim_devices = devices;
  options.sim = std::move(sim);
  options.lock_dir = privateLockDir();
  return options;
}

}  // namespace kiln::testing
