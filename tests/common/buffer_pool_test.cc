#include "common/buffer_pool.h"

#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

TEST(BufferPoolTest, ReusesBuffersOfTheSameSize) {
  BufferPool pool;
  Buffer a = pool.Acquire(4096);
  std::byte* where = a.data();
  pool.Release(std::move(a));
  EXPECT_EQ(pool.cached_bytes(), 4096u);
  Buffer b = pool.Acquire(4096);
  EXPECT_EQ(b.data(), where);
  EXPECT_EQ(pool.hits(), 1u);
  EXPECT_EQ(pool.cached_bytes(), 0u);
  Buffer c = pool.Acquire(8192);  // other size: fresh
  EXPECT_EQ(c.size(), 8192u);
  EXPECT_EQ(pool.hits(), 1u);
}

TEST(BufferPoolTest, BoundsWhatItCaches) {
  BufferPool pool(10000);
  pool.Release(Buffer(6000));
  pool.Release(Buffer(6000));  // over the bound: dropped
  EXPECT_EQ(pool.cached_bytes(), 6000u);
  pool.Release(Buffer());
  EXPECT_EQ(pool.cached_bytes(), 6000u);
}

}  // namespace
}  // namespace pipetrain::common
