// The vertical slice: an ONNX model file is imported, compiled into a .kiln
// package, loaded by the executor and run; results are checked against a
// reference computed here, and the steady state is checked to allocate
// nothing.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>

#include "kernels/kernel.h"
#include "kiln/compiler.h"
#include "kiln/executor.h"
#include "kiln/graph_builder.h"
#include "kiln/onnx_import.h"
#include "kiln/package_reader.h"
#include "tests/format/test_package.h"
#include "tests/support/allocation_counter.h"

namespace kiln {
namespace {

using testing::TempDir;

onnx::TensorProto floatTensor(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t.add_dims(d);
  t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  return t;
}

void addNode(onnx::GraphProto& g, const std::string& op, const std::vector<std::string>& in,
             const std::vector<std::string>& out) {
  onnx::NodeProto* node = g.add_node();
  node->set_op_type(op);
  for (const auto& i : in) node->add_input(i);
  for (const auto& o : out) node->add_output(o);
}

std::vector<float> randomFloats(size_t count, unsigned seed) {
  std::mt19937 random(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = dist(random);
  return values;
}

// y = Relu(Reshape(x) @ W1 + b1) @ W2 + b2, with a Sigmoid side output.
struct Mlp {
  static constexpr int64_t kBatch = 3, kIn = 8, kHidden = 16, kOut = 4;
  std::vector<float> w1 = randomFloats(kIn * kHidden, 1), b1 = randomFloats(kHidden, 2);
  std::vector<float> w2 = randomFloats(kHidden * kOut, 3), b2 = randomFloats(kOut, 4);

  std::filesystem::path write(const std::filesystem::path& path) const {
    onnx::ModelProto model;
    model.set_ir_version(8);
    auto* opset = model.add_opset_import();
    opset->set_version(17);
    onnx::GraphProto& g = *model.mutable_graph();
    g.set_name("mlp");
    auto* input = g.add_input();
    input->set_name("x");
    auto* type = input->mutable_type()->mutable_tensor_type();
    type->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : {kBatch, int64_t{2}, kIn / 2}) type->mutable_shape()->add_dim()->set_dim_value(d);
    *g.add_initializer() = floatTensor("W1", {kIn, kHidden}, w1);
    *g.add_initializer() = floatTensor("b1", {kHidden}, b1);
    *g.add_initializer() = floatTensor("W2", {kHidden, kOut}, w2);
    *g.add_initializer() = floatTensor("b2", {kOut}, b2);
    onnx::TensorProto shape;
    shape.set_name("flat");
    shape.set_data_type(onnx::TensorProto::INT64);
    shape.add_dims(2);
    shape.add_int64_data(0);
    shape.add_int64_data(-1);
    *g.add_initializer() = shape;
    addNode(g, "Reshape", {"x", "flat"}, {"x2"});
    addNode(g, "MatMul", {"x2", "W1"}, {"h"});
    addNode(g, "Add", {"h", "b1"}, {"hb"});
    addNode(g, "Relu", {"hb"}, {"a"});
    addNode(g, "MatMul", {"a", "W2"}, {"o"});
    addNode(g, "Add", {"o", "b2"}, {"y"});
    addNode(g, "Sigmoid", {"y"}, {"p"});
    addNode(g, "Exp", {"a"}, {"unused"});  // dead code
    g.add_output()->set_name("y");
    g.add_output()->set_name("p");
    std::ofstream out(path, std::ios::binary);
    model.SerializeToOstream(&out);
    return path;
  }

  // Reference in double precision.
  void reference(const std::vector<float>& x, std::vector<double>& y, std::vector<double>& p) const {
    y.assign(kBatch * kOut, 0.0);
    p.assign(kBatch * kOut, 0.0);
    for (int64_t n = 0; n < kBatch; ++n) {
      std::vector<double> a(kHidden);
      for (int64_t j = 0; j < kHidden; ++j) {
        double sum = b1[j];
        for (int64_t i = 0; i < kIn; ++i) sum += double{x[n * kIn + i]} * w1[i * kHidden + j];
        a[j] = std::max(sum, 0.0);
      }
      for (int64_t k = 0; k < kOut; ++k) {
        double sum = b2[k];
        for (int64_t j = 0; j < kHidden; ++j) sum += a[j] * w2[j * kOut + k];
        y[n * kOut + k] = sum;
        p[n * kOut + k] = 1.0 / (1.0 + std::exp(-sum));
      }
    }
  }
};

class EndToEnd : public ::testing::Test {
 protected:
  void SetUp() override {
    OnnxModel model = importOnnx(mlp_.write(dir_ / "mlp.onnx"));
    CompileOptions options;
    options.model_name = "mlp";
    options.has_kernel = [](const std::string& name) { return KernelRegistry::cpu().find(name) != nullptr; };
    report_ = compile(*model.graph, model.opsets, dir_ / "mlp.kiln", options);
  }

  TempDir dir_;
  Mlp mlp_;
  CompileReport report_;
};

TEST_F(EndToEnd, CompilesRunsAndMatchesTheReference) {
  // FusedMatMul (MatMul, Add, Relu), FusedMatMul (MatMul, Add), Sigmoid:
  // Reshape is a view, Exp is dead.
  EXPECT_EQ(report_.steps, 3u);
  EXPECT_EQ(report_.views, 1u);
  EXPECT_EQ(report_.constants, 4u);  // the Reshape shape is not needed at run time
  EXPECT_GE(report_.arena_bytes, report_.lower_bound_bytes);

  Executor executor(dir_ / "mlp.kiln");
  ASSERT_EQ(executor.inputs().size(), 1u);
  EXPECT_EQ(executor.inputs()[0].info, (TensorInfo{DType::kF32, {3, 2, 4}}));
  ASSERT_EQ(executor.outputs().size(), 2u);
  EXPECT_EQ(executor.outputs()[0].name, "y");
  EXPECT_EQ(executor.outputs()[1].info, (TensorInfo{DType::kF32, {3, 4}}));

  for (unsigned seed : {10u, 11u, 12u}) {
    const std::vector<float> x = randomFloats(Mlp::kBatch * Mlp::kIn, seed);
    std::vector<float> y(Mlp::kBatch * Mlp::kOut), p(Mlp::kBatch * Mlp::kOut);
    const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(x.data())};
    std::byte* outputs[] = {reinterpret_cast<std::byte*>(y.data()), reinterpret_cast<std::byte*>(p.data())};
    executor.run(inputs, outputs);
    std::vector<double> y_ref, p_ref;
    mlp_.reference(x, y_ref, p_ref);
    for (size_t i = 0; i < y.size(); ++i) {
      EXPECT_NEAR(y[i], y_ref[i], 1e-5 * (1 + std::abs(y_ref[i]))) << i;
      EXPECT_NEAR(p[i], p_ref[i], 1e-6) << i;
    }
  }
}

TEST_F(EndToEnd, PackageHoldsTheModelWeightsAndAnchors) {
  const PackageReader reader(dir_ / "mlp.kiln", {.checksums = ChecksumPolicy::kEager});
  const Metadata& m = reader.findMetadata("mlp")->metadata();
  EXPECT_EQ(m.program_flow.main, (std::vector<uint32_t>{1}));
  std::vector<std::string> user_inputs;
  for (const Anchor* anchor : m.inputs()) {
    if (!reader.isPackageProvided(*anchor)) user_inputs.push_back(anchor->name);
  }
  EXPECT_EQ(user_inputs, std::vector<std::string>{"x"});
  EXPECT_EQ(m.outputs().size(), 2u);
  ASSERT_NE(reader.findTensorData("W1"), nullptr);
  EXPECT_EQ(reader.findTensorData("W1")->tensorInfo(), (TensorInfo{DType::kF32, {8, 16}}));
  EXPECT_EQ(m.options.at("memory.arena_bytes"), std::to_string(report_.arena_bytes));
}

// The executor and kiln's own kernels allocate nothing per call. (oneDNN's
// MatMul does, inside dnnl_primitive_execute: see tests/kernels/
// allocation_test.cc; so this model has no MatMul.)
TEST(SteadyState, RunsMakeNoHeapAllocation) {
  TempDir dir;
  GraphBuilder b("chain");
  const ValueId x = b.input("x", DType::kF32, {4, 64});
  const ValueId bias = b.constant<float>("bias", {64}, randomFloats(64, 7));
  const ValueId shape = b.constant<int64_t>("shape", {2}, {16, 16});
  ValueId h = b.op("Relu", {b.op("Add", {x, bias})});
  h = b.op("Reshape", {h, shape});
  b.output(b.op("Sigmoid", {b.op("Mul", {h, h})}));
  GraphPtr graph = b.build();
  (void)compile(*graph, {{"", 17}}, dir / "chain.kiln");
  Executor executor(dir / "chain.kiln");
  // Add and Relu, then Mul and Sigmoid, each fused into one
  // kiln.FusedElementwise step (the Reshape between them is a view).
  EXPECT_EQ(executor.stepCount(), 2u);
  const std::vector<float> input = randomFloats(4 * 64, 8);
  std::vector<float> output(256);
  const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(input.data())};
  std::byte* outputs[] = {reinterpret_cast<std::byte*>(output.data())};
  executor.run(inputs, outputs);  // warm-up
  testing::startCountingAllocations();
  for (int i = 0; i < 100; ++i) executor.run(inputs, outputs);
  const testing::AllocationCount count = testing::stopCountingAllocations();
  EXPECT_EQ(count.news, 0u);
  EXPECT_EQ(count.mallocs, 0u);
  const float expected = 1.0f / (1.0f + std::exp(-std::pow(std::max(input[0] + randomFloats(64, 7)[0], 0.0f), 2.0f)));
  EXPECT_NEAR(output[0], expected, 1e-6);
}

// A Clip after a product is fused into it by default (oneDNN's clip post-op,
// which maps NaN to the min, as onnxruntime and OpenVINO do); fuse_clip off
// keeps it a step of its own, where NaN passes through as ONNX specifies.
TEST(Compile, FusedClipMapsNanToItsMinAndUnfusedKeepsIt) {
  for (const bool fuse_clip : {true, false}) {
    TempDir dir;
    GraphBuilder b("clip");
    const ValueId x = b.input("x", DType::kF32, {2, 2});
    const ValueId w = b.constant<float>("w", {2, 2}, {1, 0, 0, 1});
    const ValueId lo = b.constant<float>("lo", {}, {-1});
    const ValueId hi = b.constant<float>("hi", {}, {6});
    b.output(b.op("Clip", {b.op("MatMul", {x, w}), lo, hi}));
    GraphPtr graph = b.build();
    CompileOptions options;
    options.fuse_clip = fuse_clip;
    const CompileReport report = compile(*graph, {{"", 17}}, dir / "clip.kiln", options);
    EXPECT_EQ(report.step_kernels.count("Clip"), fuse_clip ? 0u : 1u);
    Executor executor(dir / "clip.kiln");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> input = {nan, 9, -3, 2};
    std::vector<float> output(4);
    const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(input.data())};
    std::byte* outputs[] = {reinterpret_cast<std::byte*>(output.data())};
    executor.run(inputs, outputs);
    // Row 0 is [NaN, NaN] (NaN * 0 is NaN); row 1 is clipped either way.
    EXPECT_EQ(output[2], -1.0f);
    EXPECT_EQ(output[3], 2.0f);
    for (int i = 0; i < 2; ++i) {
      if (fuse_clip) {
        EXPECT_EQ(output[i], -1.0f) << i;
      } else {
        EXPECT_TRUE(std::isnan(output[i])) << i;
      }
    }
  }
}

TEST(Compile, ReportsProgressInOrder) {
  TempDir dir;
  Mlp mlp;
  OnnxModel model = importOnnx(mlp.write(dir / "m.onnx"));
  std::vector<std::pair<std::string, double>> stages;
  CompileOptions options;
  options.progress = [&](const std::string& stage, double fraction) { stages.emplace_back(stage, fraction); };
  (void)compile(*model.graph, model.opsets, dir / "m.kiln", options);
  ASSERT_GE(stages.size(), 4u);
  EXPECT_EQ(stages.front().first, "inferring types");
  EXPECT_EQ(stages.back(), (std::pair<std::string, double>{"done", 1.0}));
  for (size_t i = 1; i < stages.size(); ++i) EXPECT_LE(stages[i - 1].second, stages[i].second);
}

TEST(Compile, MissingKernelsAreListedAtCompileTime) {
  TempDir dir;
  Mlp mlp;
  OnnxModel model = importOnnx(mlp.write(dir / "m.onnx"));
  CompileOptions options;
  options.has_kernel = [](const std::string& name) { return name != "kiln.FusedMatMul" && name != "Sigmoid"; };
  try {
    (void)compile(*model.graph, model.opsets, dir / "m.kiln", options);
    FAIL();
  } catch (const GraphError& e) {
    EXPECT_STREQ(e.what(), "Unsupported: 2 operators without a CPU kernel: op 'FusedMatMul' (domain 'kiln'), op "
                           "'Sigmoid' (domain 'ai.onnx')");
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "m.kiln"));
}

}  // namespace
}  // namespace kiln
