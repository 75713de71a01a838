#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <vector>

namespace meshnet::kv {
namespace {

TEST(BlockPoolTest, AllocatesLazilyInSlabsUpToCapacity) {
  // 100-byte blocks (stride 112), 1000-block capacity, ~1 KiB slabs = 9 blocks.
  BlockPool pool(100, 1000, 1024);
  EXPECT_EQ(pool.allocated(), 0);
  EXPECT_EQ(pool.slabs(), 0);
  uint8_t* a = pool.Allocate();
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(pool.slabs(), 1);
  EXPECT_EQ(pool.allocated(), 9);
  EXPECT_EQ(pool.used(), 1);
  EXPECT_EQ(pool.free_blocks(), 8);
  for (int i = 0; i < 8; ++i) ASSERT_NE(pool.Allocate(), nullptr);
  EXPECT_EQ(pool.slabs(), 1);
  ASSERT_NE(pool.Allocate(), nullptr);
  EXPECT_EQ(pool.slabs(), 2);
  EXPECT_EQ(pool.used(), 10);
}

TEST(BlockPoolTest, HardCapAndDistinctWritableBlocks) {
  BlockPool pool(24, 5, 64);
  std::set<uint8_t*> seen;
  for (int i = 0; i < 5; ++i) {
    uint8_t* b = pool.Allocate();
    ASSERT_NE(b, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 16, 0u);
    std::memset(b, i + 1, 24);
    EXPECT_TRUE(seen.insert(b).second);
  }
  EXPECT_EQ(pool.Allocate(), nullptr);
  EXPECT_EQ(pool.allocated(), 5);  // the last slab was clipped to the capacity
  for (uint8_t* b : seen) {
    // No block overlaps another: each still holds its own fill byte.
    EXPECT_EQ(b[0], b[23]);
  }
}

TEST(BlockPoolTest, FreedBlocksAreReusedLifoWithoutNewSlabs) {
  BlockPool pool(64, 4, 64);  // one block per slab
  uint8_t* a = pool.Allocate();
  uint8_t* b = pool.Allocate();
  EXPECT_EQ(pool.slabs(), 2);
  pool.Free(a);
  pool.Free(b);
  EXPECT_EQ(pool.used(), 0);
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_EQ(pool.Allocate(), b);
  EXPECT_EQ(pool.Allocate(), a);
  EXPECT_EQ(pool.slabs(), 2);
}

TEST(BlockPoolDeathTest, DoubleFreeAndForeignBlocksAbort) {
  BlockPool pool(64, 8, 256);
  uint8_t* a = pool.Allocate();
  EXPECT_TRUE(pool.InUse(a));
  EXPECT_FALSE(pool.InUse(a + 1));
  pool.Free(a);
  EXPECT_FALSE(pool.InUse(a));
  EXPECT_DEATH(pool.Free(a), "already free");
  uint8_t foreign[64];
  EXPECT_DEATH(pool.Free(foreign), "foreign");
  uint8_t* b = pool.Allocate();
  EXPECT_DEATH(pool.Free(b + 8), "foreign");
}

TEST(BlockPoolTest, ZeroCapacity) {
  BlockPool pool(64, 0);
  EXPECT_EQ(pool.Allocate(), nullptr);
  EXPECT_EQ(pool.slabs(), 0);
}

}  // namespace
}  // namespace meshnet::kv
