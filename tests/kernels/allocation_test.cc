// Kernels must not allocate when they run (DESIGN.md: no allocation in the
// steady state). Each test warms a kernel up with one call, then counts the
// heap allocations of every thread across 100 more.
#include <dnnl.h>
#include <gtest/gtest.h>

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <dnnl.hpp>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/kernel.h"
#include "tests/support/allocation_counter.h"
#include "tests/kernels/kernel_test_util.h"

namespace kiln {
namespace {

using ::kiln::testing::AllocationCount;
using ::kiln::testing::elementCount;
using ::kiln::testing::omitted;
using ::kiln::testing::Operand;
using ::kiln::testing::operand;
using ::kiln::testing::output;
using ::kiln::testing::PreparedKernel;
using ::kiln::testing::randomValues;

constexpr int kCalls = 100;

struct Case {
  std::string op;
  std::vector<Operand> inputs;
  std::vector<Operand> outputs;
  ParamMap params;
};

// Runs `c` once, then counts allocations across kCalls runs of the same call.
AllocationCount countRunAllocations(Case& c) {
  const PreparedKernel kernel(c.op, c.inputs, c.outputs, c.params);
  const auto bound = kernel.bind(c.inputs, c.outputs);
  kernel.run(bound->call);
  ::kiln::testing::startCountingAllocations();
  for (int i = 0; i < kCalls; ++i) kernel.run(bound->call);
  return ::kiln::testing::stopCountingAllocations();
}

// The counter itself: allocations on the calling thread and on other
// threads count; those of a thread named as the NVIDIA driver names its own
// ("cuda-EvtHandlr") do not, so that the tests here mean the same on a
// machine with a GPU. The count covers only the thread's allocations: it
// starts once the thread runs and stops before it ends (creating and
// joining a thread allocates on the caller, by a varying amount). The
// pointers go to a volatile sink so that the compiler cannot drop an
// allocation it sees freed.
void* volatile sink;

AllocationCount countAThreadNamed(const char* name) {
  std::atomic<int> stage{0};  // 1: named, 2: counting, 3: allocated
  std::thread thread([&] {
    pthread_setname_np(pthread_self(), name);
    stage.store(1);
    while (stage.load() != 2) std::this_thread::yield();
    sink = std::malloc(64);
    std::free(sink);
    auto boxed = std::make_unique<int>(1);
    sink = boxed.get();
    boxed.reset();
    stage.store(3);
  });
  while (stage.load() != 1) std::this_thread::yield();
  ::kiln::testing::startCountingAllocations();
  stage.store(2);
  while (stage.load() != 3) std::this_thread::yield();
  const AllocationCount count = ::kiln::testing::stopCountingAllocations();
  thread.join();
  return count;
}

TEST(AllocationCounter, CountsEveryThreadButTheCudaDriversOwn) {
  ::kiln::testing::startCountingAllocations();
  auto boxed = std::make_unique<int>(1);
  sink = boxed.get();
  EXPECT_EQ(::kiln::testing::stopCountingAllocations().news, 1u);

  const AllocationCount worker = countAThreadNamed("kiln-worker");
  EXPECT_EQ(worker.news, 1u);
  EXPECT_EQ(worker.mallocs, ::kiln::testing::countsMallocs() ? 2u : 0u);  // the malloc, and the new's
  const AllocationCount driver = countAThreadNamed("cuda-EvtHandlr");
  EXPECT_EQ(driver.news, 0u);
  EXPECT_EQ(driver.mallocs, 0u);
}

std::vector<float> floats(const std::vector<int64_t>& shape, uint32_t seed) {
  return randomValues<float>(elementCount(shape), seed, -2, 2);
}

TEST(KernelAllocations, ElementwiseRunsDoNotAllocate) {
  std::vector<Case> cases;
  cases.push_back({"Add",
                   {operand<float>({8, 16, 37}, floats({8, 16, 37}, 1)), operand<float>({37}, floats({37}, 2))},
                   {output(DType::kF32, {8, 16, 37})},
                   {}});
  cases.push_back(
      {"Mul",
       {operand<float>({2, 4, 3, 5}, floats({2, 4, 3, 5}, 3)), operand<float>({4, 1, 1}, floats({4, 1, 1}, 4))},
       {output(DType::kF32, {2, 4, 3, 5})},
       {}});
  cases.push_back({"Max",
                   {operand<float>({2, 1, 5}, floats({2, 1, 5}, 5)), operand<float>({3, 1}, floats({3, 1}, 6)),
                    operand<float>({5}, floats({5}, 7))},
                   {output(DType::kF32, {2, 3, 5})},
                   {}});
  cases.push_back({"Less",
                   {operand<int64_t>({300}, randomValues<int64_t>(300, 8, -3, 3)), operand<int64_t>({}, {0})},
                   {output(DType::kBool, {300})},
                   {}});
  cases.push_back({"Relu", {operand<float>({1000}, floats({1000}, 9))}, {output(DType::kF32, {1000})}, {}});
  cases.push_back({"Gelu", {operand<float>({257}, floats({257}, 10))}, {output(DType::kF32, {257})}, {}});
  cases.push_back({"Clip",
                   {operand<float>({100}, floats({100}, 11)), operand<float>({}, {-1.0f}), operand<float>({}, {1.0f})},
                   {output(DType::kF32, {100})},
                   {}});
  cases.push_back({"Clip",
                   {operand<float>({100}, floats({100}, 12)), omitted(), operand<float>({}, {1.0f}, true)},
                   {output(DType::kF32, {100})},
                   {}});
  cases.push_back({"Identity", {operand<int64_t>({64}, std::vector<int64_t>(64, 5))}, {output(DType::kI64, {64})}, {}});
  for (Case& c : cases) {
    const AllocationCount count = countRunAllocations(c);
    EXPECT_EQ(count.news, 0u) << c.op;
    EXPECT_EQ(count.mallocs, 0u) << c.op;
  }
}

TEST(KernelAllocations, FusedElementwiseRunsDoNotAllocate) {
  // (x + b) * sigmoid(x + b) / 2 over broadcast inputs, rows longer than a block.
  ParamMap params;
  params.set("ops", std::string("Add,Sigmoid,Mul,Div"));
  params.set("operands", std::vector<int64_t>{0, 1, 3, -1, 3, 4, 5, 2});
  params.set("alpha", std::vector<double>(4, 0.0));
  params.set("beta", std::vector<double>(4, 0.0));
  params.set("immediates", std::vector<double>{2.0});
  Case c{"kiln.FusedElementwise",
         {operand<float>({3, 1500}, floats({3, 1500}, 1)), operand<float>({1500}, floats({1500}, 2))},
         {output(DType::kF32, {3, 1500})},
         params};
  const AllocationCount count = countRunAllocations(c);
  EXPECT_EQ(count.news, 0u);
  EXPECT_EQ(count.mallocs, 0u);
}

TEST(KernelAllocations, MatMulLoopKernelRunsDoNotAllocate) {
  // Shapes oneDNN does not take, so the loop kernel runs: 15 dimensions, and K = 0.
  std::vector<int64_t> a_shape, b_shape;
  for (int d = 0; d < 13; ++d) {
    a_shape.push_back(d % 2 == 0 ? 2 : 1);
    b_shape.push_back(d % 2 == 0 ? 1 : 2);
  }
  a_shape.insert(a_shape.end(), {2, 3});
  b_shape.insert(b_shape.end(), {3, 2});
  std::vector<int64_t> out_shape(13, 2);
  out_shape.insert(out_shape.end(), {2, 2});
  std::vector<Case> cases;
  cases.push_back({"MatMul",
                   {operand(a_shape, floats(a_shape, 1)), operand(b_shape, floats(b_shape, 2))},
                   {output(DType::kF32, out_shape)},
                   {}});
  cases.push_back({"Gemm",
                   {operand<float>({4, 0}, {}), operand<float>({0, 3}, {}), operand<float>({3}, floats({3}, 3))},
                   {output(DType::kF32, {4, 3})},
                   {}});
  for (Case& c : cases) {
    const AllocationCount count = countRunAllocations(c);
    EXPECT_EQ(count.news, 0u) << c.op;
    EXPECT_EQ(count.mallocs, 0u) << c.op;
  }
}

// What one bare dnnl_primitive_execute (plus stream wait) of a matmul with
// `src`, `weights`, `dst` and the scratchpad allocates, kCalls times: no kiln
// code involved. With `fused`, the matmul also has a bias, a binary_add
// post-op (a residual) and a gelu post-op, as kiln.FusedMatMul runs it.
AllocationCount countBareOneDnnExecutes(int64_t m, int64_t k, int64_t n, bool fused = false) {
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::desc src({m, k}, dnnl::memory::data_type::f32, tag::ab);
  const dnnl::memory::desc weights({k, n}, dnnl::memory::data_type::f32, tag::any);
  const dnnl::memory::desc dst({m, n}, dnnl::memory::data_type::f32, tag::ab);
  const dnnl::memory::desc bias({1, n}, dnnl::memory::data_type::f32, tag::ab);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (fused) {
    dnnl::post_ops post_ops;
    post_ops.append_binary(dnnl::algorithm::binary_add, dst);
    post_ops.append_eltwise(1, dnnl::algorithm::eltwise_gelu_erf, 0, 0);
    attr.set_post_ops(post_ops);
  }
  const dnnl::matmul::primitive_desc pd(
      fused ? dnnl::matmul::desc(src, weights, bias, dst) : dnnl::matmul::desc(src, weights, dst), attr, engine);
  const dnnl::matmul matmul(pd);
  dnnl::memory src_memory(pd.src_desc(), engine);
  dnnl::memory weights_memory(pd.weights_desc(), engine);
  dnnl::memory dst_memory(pd.dst_desc(), engine);
  dnnl::memory bias_memory(bias, engine);
  dnnl::memory residual_memory(dst, engine);
  dnnl::memory scratchpad(pd.scratchpad_desc(), engine);
  dnnl::stream stream(engine);
  std::vector<dnnl_exec_arg_t> args = {
      {DNNL_ARG_SRC, src_memory.get()}, {DNNL_ARG_WEIGHTS, weights_memory.get()}, {DNNL_ARG_DST, dst_memory.get()}};
  if (fused) {
    args.push_back({DNNL_ARG_BIAS, bias_memory.get()});
    args.push_back({DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, residual_memory.get()});
  }
  if (pd.scratchpad_desc().get_size() != 0) args.push_back({DNNL_ARG_SCRATCHPAD, scratchpad.get()});
  auto execute = [&] {
    EXPECT_EQ(dnnl_primitive_execute(matmul.get(), stream.get(), static_cast<int>(args.size()), args.data()),
              dnnl_success);
    EXPECT_EQ(dnnl_stream_wait(stream.get()), dnnl_success);
  };
  execute();
  ::kiln::testing::startCountingAllocations();
  for (int i = 0; i < kCalls; ++i) {
    (void)dnnl_primitive_execute(matmul.get(), stream.get(), static_cast<int>(args.size()), args.data());
    (void)dnnl_stream_wait(stream.get());
  }
  const AllocationCount count = ::kiln::testing::stopCountingAllocations();
  execute();  // checks the status once more, outside the count
  return count;
}

// oneDNN 2.6 allocates inside dnnl_primitive_execute on every call (it copies
// the arguments into a std::unordered_map), which no caller can avoid. What
// this test holds the kernel to: it adds no allocation of its own around that
// execute (no memory objects, streams or scratchpads per call). It prints the
// figures so that the gap from "no allocation at all" stays visible.
TEST(KernelAllocations, MatMulOneDnnRunsAllocateOnlyInsideOneDnnExecute) {
  const int64_t m = 64, k = 128, n = 96;
  Case c{"MatMul",
         {operand<float>({m, k}, floats({m, k}, 1)), operand<float>({k, n}, floats({k, n}, 2), /*constant=*/true)},
         {output(DType::kF32, {m, n})},
         {}};
  const AllocationCount kernel = countRunAllocations(c);
  const AllocationCount bare = countBareOneDnnExecutes(m, k, n);
  std::cout << "[ note     ] MatMul via oneDNN, per call: " << static_cast<double>(kernel.news) / kCalls
            << " operator new and " << static_cast<double>(kernel.mallocs) / kCalls
            << " malloc-family calls; a bare dnnl_primitive_execute: " << static_cast<double>(bare.news) / kCalls
            << " and " << static_cast<double>(bare.mallocs) / kCalls
            << (::kiln::testing::countsMallocs() ? "" : " (malloc not counted in this build)") << "\n";
  RecordProperty("onednn_news_per_call", std::to_string(static_cast<double>(kernel.news) / kCalls));
  EXPECT_EQ(kernel.news, bare.news);
  EXPECT_EQ(kernel.mallocs, bare.mallocs);
}

// The same for kiln.FusedMatMul with bias, residual and activation: the
// post-ops' operands are set up at prepare like the others.
TEST(KernelAllocations, FusedMatMulRunsAllocateOnlyInsideOneDnnExecute) {
  const int64_t m = 64, k = 128, n = 96;
  ParamMap params;
  params.set("activation", std::string("Gelu"));
  Case c{"kiln.FusedMatMul",
         {operand<float>({m, k}, floats({m, k}, 1)), operand<float>({k, n}, floats({k, n}, 2), /*constant=*/true),
          operand<float>({n}, floats({n}, 3), /*constant=*/true), operand<float>({m, n}, floats({m, n}, 4))},
         {output(DType::kF32, {m, n})},
         params};
  const AllocationCount kernel = countRunAllocations(c);
  const AllocationCount bare = countBareOneDnnExecutes(m, k, n, /*fused=*/true);
  EXPECT_EQ(kernel.news, bare.news);
  EXPECT_EQ(kernel.mallocs, bare.mallocs);
}

}  // namespace
}  // namespace kiln
