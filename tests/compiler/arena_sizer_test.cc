#include "compiler/arena_sizer.h"

#include <gtest/gtest.h>

namespace kiln {
namespace {

TEST(ArenaSizer, GrowsToTheLargestNeedSeen) {
  ArenaSizer sizer(1000);
  EXPECT_EQ(sizer.capacityBytes(), 1000u);
  EXPECT_FALSE(sizer.request(600));  // fits: no reallocation
  EXPECT_FALSE(sizer.request(1000));
  EXPECT_EQ(sizer.capacityBytes(), 1000u);
  EXPECT_TRUE(sizer.request(4000));
  EXPECT_EQ(sizer.capacityBytes(), 4000u);
  EXPECT_FALSE(sizer.request(2000));  // a smaller run keeps the larger arena
  EXPECT_EQ(sizer.capacityBytes(), 4000u);
  EXPECT_EQ(sizer.growthCount(), 1u);
}

TEST(ArenaSizer, StopsGrowingOnceTheLargestInputsHaveBeenSeen) {
  ArenaSizer sizer;
  const uint64_t needs[] = {300, 100, 900, 200, 900, 50, 900, 700};
  for (const uint64_t need : needs) sizer.request(need);
  EXPECT_EQ(sizer.capacityBytes(), 900u);
  EXPECT_EQ(sizer.growthCount(), 2u);  // 0 -> 300 -> 900
  for (const uint64_t need : needs) EXPECT_FALSE(sizer.request(need));
  EXPECT_EQ(sizer.growthCount(), 2u);
}

TEST(ArenaSizer, ShrinksOnDemandAndGrowsAgainWhenNeeded) {
  ArenaSizer sizer;
  sizer.request(1 << 20);
  EXPECT_TRUE(sizer.shrink(4096));
  EXPECT_EQ(sizer.capacityBytes(), 4096u);
  EXPECT_FALSE(sizer.shrink(8192));  // shrink never raises the capacity
  EXPECT_EQ(sizer.capacityBytes(), 4096u);
  EXPECT_FALSE(sizer.request(4000));
  EXPECT_TRUE(sizer.request(5000));
  EXPECT_EQ(sizer.capacityBytes(), 5000u);
  EXPECT_TRUE(sizer.shrink());
  EXPECT_EQ(sizer.capacityBytes(), 0u);
  EXPECT_FALSE(sizer.shrink());
  EXPECT_EQ(sizer.growthCount(), 2u);
}

}  // namespace
}  // namespace kiln
