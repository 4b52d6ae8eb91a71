#include "compiler/memory_planner.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// ------------------------------------------------------- independent oracles
// Deliberately brute force, sharing no code with the planner or the checker.

uint64_t alignUp(uint64_t size, uint64_t alignment) { return (size + alignment - 1) / alignment * alignment; }

// A peak is always reached at some tensor's first step, so those are the
// only steps to look at.
uint64_t bruteForceLowerBound(const std::vector<TensorLifetime>& tensors, uint64_t alignment) {
  uint64_t peak = 0;
  for (const TensorLifetime& at : tensors) {
    uint64_t live = 0;
    for (const TensorLifetime& t : tensors) {
      if (t.first_step <= at.first_step && at.first_step <= t.last_step) live += alignUp(t.size_bytes, alignment);
    }
    peak = std::max(peak, live);
  }
  return peak;
}

bool bruteForceValid(const std::vector<TensorLifetime>& tensors, const MemoryPlan& plan, uint64_t alignment) {
  if (plan.offsets.size() != tensors.size()) return false;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (plan.offsets[i] % alignment != 0) return false;
    if (plan.offsets[i] + tensors[i].size_bytes > plan.arena_bytes) return false;
    for (size_t j = i + 1; j < tensors.size(); ++j) {
      const TensorLifetime& a = tensors[i];
      const TensorLifetime& b = tensors[j];
      if (a.size_bytes == 0 || b.size_bytes == 0) continue;
      if (a.last_step < b.first_step || b.last_step < a.first_step) continue;
      const bool disjoint_in_memory =
          plan.offsets[i] + a.size_bytes <= plan.offsets[j] || plan.offsets[j] + b.size_bytes <= plan.offsets[i];
      if (!disjoint_in_memory) return false;
    }
  }
  return true;
}

// Every property a plan from planMemory must have.
::testing::AssertionResult hasEveryProperty(const std::vector<TensorLifetime>& tensors, uint64_t alignment) {
  const MemoryPlan plan = planMemory(tensors, alignment);
  std::string problem;
  if (!planIsValid(tensors, plan, alignment, &problem)) return ::testing::AssertionFailure() << problem;
  if (!bruteForceValid(tensors, plan, alignment)) return ::testing::AssertionFailure() << "brute force finds a fault";
  uint64_t naive = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    naive += alignUp(tensors[i].size_bytes, alignment);
    if (plan.offsets[i] % alignment != 0) return ::testing::AssertionFailure() << "offset " << i << " misaligned";
    if (tensors[i].size_bytes == 0 && plan.offsets[i] != 0) {
      return ::testing::AssertionFailure() << "zero-size tensor " << i << " is not at offset 0";
    }
  }
  if (plan.naive_bytes != naive) {
    return ::testing::AssertionFailure() << "naive " << plan.naive_bytes << " != " << naive;
  }
  const uint64_t lower = bruteForceLowerBound(tensors, alignment);
  if (plan.lower_bound_bytes != lower) {
    return ::testing::AssertionFailure() << "lower bound " << plan.lower_bound_bytes << " != " << lower;
  }
  if (plan.arena_bytes < plan.lower_bound_bytes) return ::testing::AssertionFailure() << "arena below lower bound";
  if (plan.arena_bytes > plan.naive_bytes) return ::testing::AssertionFailure() << "arena above naive";
  if (planMemory(tensors, alignment).offsets != plan.offsets) {
    return ::testing::AssertionFailure() << "not deterministic";
  }
  return ::testing::AssertionSuccess();
}

// ----------------------------------------------------------- random inputs

enum class Shape {
  kChainLike,        // one tensor per step, mostly short lives, some long skip connections
  kRandomIntervals,  // arbitrary intervals over at most 2n steps: heavy overlap
  kFewSizes,         // four distinct sizes: many ties in the greedy order
  kWithZeroSizes,    // a quarter of the tensors are empty
};

std::vector<TensorLifetime> randomLifetimes(Shape shape, std::mt19937_64& random) {
  const size_t count = std::uniform_int_distribution<size_t>(1, 160)(random);
  std::uniform_real_distribution<double> log_size(std::log(1.0), std::log(4.0 * kMiB));
  const auto size = [&]() -> uint64_t {
    if (shape == Shape::kFewSizes) return uint64_t{1024} << std::uniform_int_distribution<int>(0, 3)(random);
    if (shape == Shape::kWithZeroSizes && random() % 4 == 0) return 0;
    return static_cast<uint64_t>(std::exp(log_size(random)));
  };
  std::vector<TensorLifetime> tensors(count);
  const uint32_t steps = static_cast<uint32_t>(std::uniform_int_distribution<size_t>(1, 2 * count)(random));
  for (size_t i = 0; i < count; ++i) {
    TensorLifetime& t = tensors[i];
    t.size_bytes = size();
    if (shape == Shape::kChainLike) {
      t.first_step = static_cast<uint32_t>(i);
      const bool skip_connection = random() % 10 == 0;
      t.last_step = t.first_step + static_cast<uint32_t>(skip_connection ? random() % 20 : random() % 3);
    } else {
      const uint32_t a = static_cast<uint32_t>(random() % steps);
      const uint32_t b = static_cast<uint32_t>(random() % steps);
      t.first_step = std::min(a, b);
      t.last_step = std::max(a, b);
    }
  }
  return tensors;
}

constexpr uint64_t kAlignments[] = {1, 8, 64, 4096};

// --------------------------------------------------------- hand-made cases

TEST(MemoryPlanner, NoTensorsGiveAnEmptyArena) {
  const MemoryPlan plan = planMemory({});
  EXPECT_TRUE(plan.offsets.empty());
  EXPECT_EQ(plan.arena_bytes, 0u);
  EXPECT_EQ(plan.lower_bound_bytes, 0u);
  EXPECT_EQ(plan.naive_bytes, 0u);
}

TEST(MemoryPlanner, ChainReusesMemoryEveryOtherStep) {
  std::vector<TensorLifetime> chain;
  for (uint32_t step = 0; step < 10; ++step) chain.push_back({1000, step, step + 1});
  const MemoryPlan plan = planMemory(chain, 8);
  EXPECT_THAT(plan.offsets, ElementsAre(0, 1000, 0, 1000, 0, 1000, 0, 1000, 0, 1000));
  EXPECT_EQ(plan.arena_bytes, 2000u);
  EXPECT_EQ(plan.lower_bound_bytes, 2000u);
  EXPECT_EQ(plan.naive_bytes, 10000u);
}

TEST(MemoryPlanner, ChainOfMixedSizesPacksIntoTheTwoLargest) {
  const std::vector<TensorLifetime> chain = {{16, 0, 1}, {8, 1, 2}, {64, 2, 3}, {32, 3, 4}, {8, 4, 5}};
  const MemoryPlan plan = planMemory(chain, 1);
  EXPECT_THAT(plan.offsets, ElementsAre(0, 64, 0, 64, 0));
  EXPECT_EQ(plan.arena_bytes, 96u);
  EXPECT_EQ(plan.lower_bound_bytes, 96u);
}

TEST(MemoryPlanner, TensorsLiveTogetherAreStackedLargestFirst) {
  const std::vector<TensorLifetime> tensors = {{100, 0, 4}, {300, 2, 3}, {200, 1, 2}, {300, 0, 2}};
  const MemoryPlan plan = planMemory(tensors, 1);
  // All meet at step 2. Order: 300 (first step 0, tensor 3), 300 (tensor 1), 200, 100.
  EXPECT_THAT(plan.offsets, ElementsAre(800, 300, 600, 0));
  EXPECT_EQ(plan.arena_bytes, 900u);
  EXPECT_EQ(plan.arena_bytes, plan.naive_bytes);
  EXPECT_EQ(plan.arena_bytes, plan.lower_bound_bytes);
}

TEST(MemoryPlanner, GapThatFitsExactlyIsUsed) {
  const std::vector<TensorLifetime> tensors = {
      {256, 0, 4},  // A: 0
      {128, 0, 1},  // B: above A, 256
      {64, 0, 4},   // C: above A and B, 384
      {128, 2, 3},  // D: B is dead by step 2, its 128 bytes between A and C are free
  };
  const MemoryPlan plan = planMemory(tensors, 64);
  EXPECT_THAT(plan.offsets, ElementsAre(0, 256, 384, 256));
  EXPECT_EQ(plan.arena_bytes, 448u);
}

TEST(MemoryPlanner, BestFitTakesTheSmallestGapNotTheFirst) {
  const std::vector<TensorLifetime> tensors = {
      {400, 0, 3},  // D1: 0
      {200, 3, 4},  // O2: above D1, 400
      {150, 4, 4},  // O1: lives apart from D1, so under O2 at 0
      {120, 2, 3},  // D2: above D1 and O2, 600
      {110, 3, 4},  // O3: above everything, 720
      {100, 4, 4},  // T: meets O1 [0,150), O2 [400,600), O3 [720,830): gaps of 250 and 120 bytes
  };
  const MemoryPlan plan = planMemory(tensors, 1);
  EXPECT_THAT(plan.offsets, ElementsAre(0, 400, 0, 600, 720, 600));  // first fit would put T at 150
  EXPECT_EQ(plan.arena_bytes, 830u);
  EXPECT_EQ(plan.lower_bound_bytes, 830u);  // step 3: D1 + O2 + D2 + O3
}

TEST(MemoryPlanner, TensorsLiveAtTheSameStepConflictEvenForOneStep) {
  // Inclusive ends: the first is still read at step 3, where the second is produced.
  const MemoryPlan plan = planMemory(std::vector<TensorLifetime>{{64, 0, 3}, {64, 3, 5}}, 64);
  EXPECT_THAT(plan.offsets, ElementsAre(0, 64));
  const MemoryPlan apart = planMemory(std::vector<TensorLifetime>{{64, 0, 2}, {64, 3, 5}}, 64);
  EXPECT_THAT(apart.offsets, ElementsAre(0, 0));
}

TEST(MemoryPlanner, ZeroSizeTensorsTakeNoSpaceAndBlockNothing) {
  const std::vector<TensorLifetime> tensors = {{0, 0, 5}, {128, 0, 1}, {0, 1, 1}, {128, 2, 3}};
  const MemoryPlan plan = planMemory(tensors, 64);
  EXPECT_THAT(plan.offsets, ElementsAre(0, 0, 0, 0));
  EXPECT_EQ(plan.arena_bytes, 128u);
  EXPECT_EQ(plan.lower_bound_bytes, 128u);
  EXPECT_EQ(plan.naive_bytes, 256u);

  const MemoryPlan empty = planMemory(std::vector<TensorLifetime>{{0, 0, 1}, {0, 0, 1}});
  EXPECT_THAT(empty.offsets, ElementsAre(0, 0));
  EXPECT_EQ(empty.arena_bytes, 0u);
}

TEST(MemoryPlanner, SizesAreRoundedUpAndOffsetsAligned) {
  const std::vector<TensorLifetime> tensors = {{1, 0, 0}, {65, 0, 0}, {100, 0, 0}};
  const MemoryPlan plan = planMemory(tensors, 64);
  // Rounded: 64, 128, 128; the two 128s in index order, then the 64.
  EXPECT_THAT(plan.offsets, ElementsAre(256, 0, 128));
  EXPECT_EQ(plan.arena_bytes, 320u);
  EXPECT_EQ(plan.naive_bytes, 320u);
  EXPECT_EQ(plan.lower_bound_bytes, 320u);

  const MemoryPlan pages = planMemory(tensors, 4096);
  EXPECT_THAT(pages.offsets, ElementsAre(0, 4096, 8192));
  EXPECT_EQ(pages.arena_bytes, 3u * 4096);
}

TEST(MemoryPlanner, DefaultAlignmentIs64Bytes) {
  const MemoryPlan plan = planMemory(std::vector<TensorLifetime>{{10, 0, 1}, {10, 1, 2}});
  EXPECT_THAT(plan.offsets, ElementsAre(0, 64));
  EXPECT_EQ(plan.naive_bytes, 128u);
}

// The worked example of greedy by size used by TFLite GPU's implementation
// of this algorithm (memory_management_test.cc, "ComplexRecords"); the
// offsets below are derived by hand, step by step:
//   t5 64 [5,7]  nothing placed that it meets             -> 0
//   t0 32 [0,1]  meets nothing placed                      -> 0
//   t1 32 [1,4]  meets t0 [0,32)                           -> 32
//   t3 16 [3,5]  meets t5 [0,64), t1 [32,64)               -> 64
//   t8 16 [8,9]  meets nothing placed                      -> 0
//   t2  8 [2,5]  meets t5, t1, t3 [64,80)                  -> 80
//   t4  8 [4,5]  meets t5, t1, t3, t2 [80,88)              -> 88
//   t6  8 [6,8]  meets t5 [0,64), t8 [0,16)                -> 64
//   t7  8 [7,8]  meets t5, t8, t6 [64,72)                  -> 72
// Step 5 holds t2 + t3 + t4 + t5 = 96 bytes, so the plan is optimal.
TEST(MemoryPlanner, WorkedExampleGivesTheExpectedOffsets) {
  const std::vector<TensorLifetime> tensors = {
      {32, 0, 1}, {32, 1, 4}, {8, 2, 5}, {16, 3, 5}, {8, 4, 5}, {64, 5, 7}, {8, 6, 8}, {8, 7, 8}, {16, 8, 9},
  };
  const MemoryPlan plan = planMemory(tensors, 1);
  EXPECT_THAT(plan.offsets, ElementsAre(0, 32, 80, 64, 88, 0, 64, 72, 0));
  EXPECT_EQ(plan.arena_bytes, 96u);
  EXPECT_EQ(plan.lower_bound_bytes, 96u);
  EXPECT_EQ(plan.naive_bytes, 192u);
  EXPECT_TRUE(hasEveryProperty(tensors, 1));
}

TEST(MemoryPlanner, OneHugeTensorThatFitsIn64BitsIsPlanned) {
  const uint64_t huge = std::numeric_limits<uint64_t>::max() - 10;
  const MemoryPlan plan = planMemory(std::vector<TensorLifetime>{{huge, 0, 0}}, 1);
  EXPECT_EQ(plan.arena_bytes, huge);
}

// --------------------------------------------------------------- bad input

TEST(MemoryPlanner, LifetimeEndingBeforeItStartsIsRefused) {
  try {
    planMemory(std::vector<TensorLifetime>{{64, 0, 1}, {64, 5, 4}});
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 1 is produced at step 5 but last read at step 4")) << e.what();
  }
}

TEST(MemoryPlanner, AlignmentThatIsNotAPowerOfTwoIsRefused) {
  const std::vector<TensorLifetime> tensors = {{64, 0, 1}};
  for (const uint64_t alignment : {uint64_t{0}, uint64_t{3}, uint64_t{48}}) {
    try {
      planMemory(tensors, alignment);
      FAIL() << "expected UsageError for alignment " << alignment;
    } catch (const UsageError& e) {
      EXPECT_THAT(e.what(), HasSubstr("alignment must be a power of two, got " + std::to_string(alignment)));
    }
  }
}

TEST(MemoryPlanner, SizesThatOverflowAreRefused) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  try {
    planMemory(std::vector<TensorLifetime>{{64, 0, 0}, {max - 10, 0, 0}}, 64);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 1 has")) << e.what();
    EXPECT_THAT(e.what(), HasSubstr("overflow 64 bits when rounded up to the alignment of 64")) << e.what();
  }
  // Never live together, but the naive total would not fit in the plan.
  const uint64_t half = uint64_t{1} << 63;
  try {
    planMemory(std::vector<TensorLifetime>{{half, 0, 0}, {half, 1, 1}}, 64);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_THAT(e.what(), HasSubstr("the sizes of tensors 0 to 1 add up to more than 2^64 bytes")) << e.what();
  }
}

// ----------------------------------------------------------------- checker

class MemoryPlanChecker : public ::testing::Test {
 protected:
  // Three tensors: 0 and 1 live together, 2 lives later and reuses 0's bytes.
  const std::vector<TensorLifetime> tensors_ = {{128, 0, 2}, {64, 1, 3}, {128, 4, 5}};
  const MemoryPlan plan_ = planMemory(tensors_, 64);
};

TEST_F(MemoryPlanChecker, AcceptsThePlannersPlan) {
  ASSERT_THAT(plan_.offsets, ElementsAre(0, 128, 0));
  std::string problem;
  EXPECT_TRUE(planIsValid(tensors_, plan_, 64, &problem)) << problem;
  EXPECT_TRUE(planIsValid(tensors_, plan_, 64, nullptr));
}

TEST_F(MemoryPlanChecker, DetectsTensorsLiveTogetherSharingBytes) {
  MemoryPlan broken = plan_;
  broken.offsets[1] = 64;  // inside tensor 0, which is live at steps 1 and 2
  std::string problem;
  EXPECT_FALSE(planIsValid(tensors_, broken, 64, &problem));
  EXPECT_EQ(problem, "tensors 0 and 1 are both live at step 1 and share bytes [64, 128)");
  EXPECT_FALSE(planIsValid(tensors_, broken, 64, nullptr));

  broken.offsets[1] = 0;  // same offset
  EXPECT_FALSE(planIsValid(tensors_, broken, 64, &problem));
  EXPECT_EQ(problem, "tensors 0 and 1 are both live at step 1 and share bytes [0, 64)");
}

TEST_F(MemoryPlanChecker, DetectsMisalignedOffsets) {
  MemoryPlan broken = plan_;
  broken.offsets[1] = 160;
  broken.arena_bytes = 256;
  std::string problem;
  EXPECT_FALSE(planIsValid(tensors_, broken, 64, &problem));
  EXPECT_EQ(problem, "tensor 1 is at offset 160, not a multiple of the alignment 64");
  EXPECT_TRUE(planIsValid(tensors_, broken, 32, &problem)) << problem;
}

TEST_F(MemoryPlanChecker, DetectsTensorsOutsideTheArena) {
  MemoryPlan broken = plan_;
  broken.arena_bytes -= 1;
  std::string problem;
  EXPECT_FALSE(planIsValid(tensors_, broken, 64, &problem));
  EXPECT_EQ(problem, "tensor 1 at offset 128 with 64 bytes ends past the arena's 191 bytes");
  // An offset near 2^64 must not wrap around and look inside.
  broken = plan_;
  broken.offsets[2] = std::numeric_limits<uint64_t>::max() - 63;
  EXPECT_FALSE(planIsValid(tensors_, broken, 64, &problem));
  EXPECT_THAT(problem, HasSubstr("ends past the arena"));
}

TEST_F(MemoryPlanChecker, DetectsAWrongNumberOfOffsetsAndBadArguments) {
  MemoryPlan broken = plan_;
  broken.offsets.pop_back();
  std::string problem;
  EXPECT_FALSE(planIsValid(tensors_, broken, 64, &problem));
  EXPECT_EQ(problem, "the plan has 2 offsets for 3 tensors");
  EXPECT_FALSE(planIsValid(tensors_, plan_, 24, &problem));
  EXPECT_EQ(problem, "alignment 24 is not a power of two");
  std::vector<TensorLifetime> backwards = tensors_;
  backwards[2] = {128, 5, 4};
  EXPECT_FALSE(planIsValid(backwards, plan_, 64, &problem));
  EXPECT_EQ(problem, "tensor 2 starts at step 5, after its last step 4");
}

TEST_F(MemoryPlanChecker, FindsAnOverlapWithARangeStartingBelow) {
  // Tensor 2 starts inside tensor 0, below tensor 1: only a look below its
  // own offset finds the conflict.
  const std::vector<TensorLifetime> tensors = {{256, 0, 9}, {64, 0, 9}, {128, 5, 6}};
  MemoryPlan plan;
  plan.offsets = {0, 256, 64};
  plan.arena_bytes = 320;
  std::string problem;
  EXPECT_FALSE(planIsValid(tensors, plan, 64, &problem));
  EXPECT_EQ(problem, "tensors 0 and 2 are both live at step 5 and share bytes [64, 192)");
}

// Random plans, each with one tensor moved somewhere random: the checker must
// agree with the brute-force oracle on every one, and both verdicts must occur.
TEST(MemoryPlannerProperties, CheckerAgreesWithBruteForceOnCorruptedPlans) {
  std::mt19937_64 random(20240601);
  int valid = 0;
  int invalid = 0;
  for (int round = 0; round < 2000; ++round) {
    const Shape shape = static_cast<Shape>(round % 4);
    const uint64_t alignment = kAlignments[round % 4];
    const std::vector<TensorLifetime> tensors = randomLifetimes(shape, random);
    MemoryPlan plan = planMemory(tensors, alignment);
    const size_t victim = random() % tensors.size();
    const uint64_t slots = plan.arena_bytes / alignment + 1;
    plan.offsets[victim] = (random() % slots) * alignment;
    plan.arena_bytes = std::max(plan.arena_bytes, plan.offsets[victim] + tensors[victim].size_bytes);
    if (random() % 8 == 0) plan.offsets[victim] += alignment / 2;  // sometimes misaligned too (if alignment > 1)
    plan.arena_bytes = std::max(plan.arena_bytes, plan.offsets[victim] + tensors[victim].size_bytes);
    const bool expected = bruteForceValid(tensors, plan, alignment);
    std::string problem;
    ASSERT_EQ(planIsValid(tensors, plan, alignment, &problem), expected) << "round " << round << ": " << problem;
    (expected ? valid : invalid)++;
  }
  EXPECT_GT(valid, 100);
  EXPECT_GT(invalid, 100);
}

// ---------------------------------------------------------- random properties

TEST(MemoryPlannerProperties, HoldOnThousandsOfRandomLifetimeSets) {
  for (const Shape shape : {Shape::kChainLike, Shape::kRandomIntervals, Shape::kFewSizes, Shape::kWithZeroSizes}) {
    std::mt19937_64 random(1000 + static_cast<int>(shape));
    for (int round = 0; round < 1000; ++round) {
      const uint64_t alignment = kAlignments[round % 4];
      const std::vector<TensorLifetime> tensors = randomLifetimes(shape, random);
      ASSERT_TRUE(hasEveryProperty(tensors, alignment))
          << "shape " << static_cast<int>(shape) << ", round " << round << ", alignment " << alignment;
    }
  }
}

// Tensors with an alignment of their own (a plugin's allocator hook): each
// starts on a multiple of it, the plan stays valid, and the arena is at
// least that large (so that a device block of its size is aligned for it).
TEST(MemoryPlannerProperties, HoldWithAlignmentsOfTheirOwn) {
  std::mt19937_64 random(77);
  for (int round = 0; round < 1000; ++round) {
    std::vector<TensorLifetime> tensors = randomLifetimes(Shape::kRandomIntervals, random);
    uint64_t largest = 0;
    for (TensorLifetime& t : tensors) {
      if (random() % 3 == 0) {
        t.alignment = uint64_t{128} << (random() % 6);  // 128 .. 4096
        largest = std::max(largest, t.alignment);
      }
    }
    const MemoryPlan plan = planMemory(tensors, 64);
    std::string problem;
    ASSERT_TRUE(planIsValid(tensors, plan, 64, &problem)) << "round " << round << ": " << problem;
    ASSERT_TRUE(bruteForceValid(tensors, plan, 64)) << "round " << round;
    for (size_t i = 0; i < tensors.size(); ++i) {
      ASSERT_EQ(plan.offsets[i] % std::max<uint64_t>(64, tensors[i].alignment), 0u) << "round " << round;
    }
    ASSERT_GE(plan.arena_bytes, largest);
    ASSERT_LE(plan.arena_bytes, plan.naive_bytes);
  }
}

TEST(MemoryPlanner, AnAlignmentOfItsOwnSkipsToTheNextMultiple) {
  // A lives through steps 0-1 in [0, 128); B, live with it at step 1 and
  // 256-byte aligned, goes to 256, not 128; C, 64-byte aligned like the
  // plan, takes 128.
  const std::vector<TensorLifetime> tensors = {{100, 0, 1}, {10, 1, 2, 256}, {64, 1, 1}};
  const MemoryPlan plan = planMemory(tensors, 64);
  EXPECT_THAT(plan.offsets, ElementsAre(0, 256, 128));
  EXPECT_EQ(plan.arena_bytes, 320u);
  std::string problem;
  EXPECT_TRUE(planIsValid(tensors, plan, 64, &problem)) << problem;
  MemoryPlan moved = plan;
  moved.offsets[1] = 192;  // aligned for the plan, not for B
  EXPECT_FALSE(planIsValid(tensors, moved, 64, &problem));
  EXPECT_THAT(problem, HasSubstr("not a multiple of the alignment 256"));
  EXPECT_THROW(planMemory(std::vector<TensorLifetime>{{8, 0, 0, 96}}, 64), UsageError);
}

// Not a pass/fail check of quality (the greedy has no guarantee), a record of
// it: how far above the lower bound the arena lands, per kind of input.
TEST(MemoryPlannerProperties, ReportsArenaOverLowerBound) {
  const char* const names[] = {"chain_like", "random_intervals", "few_sizes", "with_zero_sizes"};
  for (const Shape shape : {Shape::kChainLike, Shape::kRandomIntervals, Shape::kFewSizes, Shape::kWithZeroSizes}) {
    std::mt19937_64 random(7000 + static_cast<int>(shape));
    double sum = 0;
    double worst = 1;
    int sets = 0;
    for (int round = 0; round < 1000; ++round) {
      const MemoryPlan plan = planMemory(randomLifetimes(shape, random), 64);
      if (plan.lower_bound_bytes == 0) continue;
      const double ratio = static_cast<double>(plan.arena_bytes) / static_cast<double>(plan.lower_bound_bytes);
      sum += ratio;
      worst = std::max(worst, ratio);
      ++sets;
    }
    ASSERT_GT(sets, 0);
    const double mean = sum / sets;
    std::cout << "arena / lower bound, " << names[static_cast<int>(shape)] << " (" << sets << " sets): mean "
              << mean << ", worst " << worst << "\n";
    const std::string name = names[static_cast<int>(shape)];
    RecordProperty("mean_ratio_" + name, std::to_string(mean));
    RecordProperty("worst_ratio_" + name, std::to_string(worst));
    EXPECT_GE(mean, 1.0);
  }
}

// ---------------------------------------------------------------- describe

TEST(MemoryPlanner, DescribesAPlanOnOneLine) {
  MemoryPlan plan;
  plan.arena_bytes = 12 * kMiB;
  plan.lower_bound_bytes = 11 * kMiB + kMiB / 2;
  plan.naive_bytes = 40 * kMiB + kMiB / 5;
  EXPECT_EQ(describePlan(plan), "arena 12.0 MiB, lower bound 11.5 MiB (1.04x), naive 40.2 MiB (saves 70%)");

  plan.arena_bytes = 96;
  plan.lower_bound_bytes = 96;
  plan.naive_bytes = 192;
  EXPECT_EQ(describePlan(plan), "arena 96 B, lower bound 96 B (1.00x), naive 192 B (saves 50%)");

  EXPECT_EQ(describePlan(MemoryPlan{}), "arena 0 B, lower bound 0 B (1.00x), naive 0 B (saves 0%)");

  plan.arena_bytes = 1024 * kMiB - 1;  // just under 1 GiB: no "1024.0 MiB"
  plan.lower_bound_bytes = 3 * (kMiB << 10);
  plan.naive_bytes = 1536;
  EXPECT_THAT(describePlan(plan), HasSubstr("arena 1.0 GiB, lower bound 3.0 GiB"));
  EXPECT_THAT(describePlan(plan), HasSubstr("naive 1.5 KiB"));
}

}  // namespace
}  // namespace kiln
