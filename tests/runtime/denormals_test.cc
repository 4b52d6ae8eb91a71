// ExecutorOptions::flush_denormals: runs flush denormal floats to zero on
// every kernel thread (results and inputs), leave the caller's
// floating-point mode as it was, and with the option off follow the caller's
// mode.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "kiln/compiler.h"
#include "kiln/executor.h"
#include "kiln/graph_builder.h"
#include "kernels/cpu/denormals.h"
#include "tests/format/test_package.h"

namespace kiln {
namespace {

#if defined(__x86_64__)

// 256 x 256 elements: enough that the product splits across the pool's
// threads (parallel.h), so every thread's mode is seen.
constexpr int64_t kSide = 256;
constexpr size_t kCount = kSide * kSide;

// out = x * y. Even elements: 1e-30 * 1e-10, a denormal result (FTZ makes
// it 0). Odd elements: a denormal 1e-40 * 1e30 (DAZ reads 1e-40 as 0).
class Denormals : public ::testing::Test {
 protected:
  void SetUp() override {
    GraphBuilder b("product");
    const ValueId x = b.input("x", DType::kF32, {kSide, kSide});
    const ValueId y = b.input("y", DType::kF32, {kSide, kSide});
    b.output(b.op("Mul", {x, y}));
    (void)compile(*b.build(), {{"", 17}}, dir_ / "product.kiln");
    for (size_t i = 0; i < kCount; ++i) {
      x_[i] = i % 2 == 0 ? 1e-30f : 1e-40f;
      y_[i] = i % 2 == 0 ? 1e-10f : 1e30f;
    }
  }

  // Runs the package; returns how many outputs are 0.
  size_t zerosAfterRun(bool flush_denormals) {
    Executor executor(dir_ / "product.kiln", "", ExecutorOptions{.threads = 2, .flush_denormals = flush_denormals});
    std::vector<float> out(kCount, -1.0f);
    const std::byte* inputs[] = {reinterpret_cast<const std::byte*>(x_.data()),
                                 reinterpret_cast<const std::byte*>(y_.data())};
    std::byte* outputs[] = {reinterpret_cast<std::byte*>(out.data())};
    executor.run(inputs, outputs);
    size_t zeros = 0;
    for (float v : out) zeros += v == 0.0f ? 1 : 0;
    return zeros;
  }

  testing::TempDir dir_;
  std::vector<float> x_ = std::vector<float>(kCount);
  std::vector<float> y_ = std::vector<float>(kCount);
};

TEST_F(Denormals, FlushedOnEveryThreadAndTheCallersModeComesBack) {
  ASSERT_FALSE(DenormalsScope::flushing());
  EXPECT_EQ(zerosAfterRun(true), kCount);
  EXPECT_FALSE(DenormalsScope::flushing());
  // IEEE: 1e-40 and 1e-10, no zeros; run again after the pool was flushed.
  EXPECT_EQ(zerosAfterRun(false), 0u);
  EXPECT_EQ(zerosAfterRun(true), kCount);
}

TEST_F(Denormals, KeptRunsFollowTheCallersMode) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040);
  EXPECT_EQ(zerosAfterRun(false), kCount);
  EXPECT_TRUE(DenormalsScope::flushing());
  _mm_setcsr(saved);
  EXPECT_EQ(zerosAfterRun(false), 0u);
}

#endif

}  // namespace
}  // namespace kiln
