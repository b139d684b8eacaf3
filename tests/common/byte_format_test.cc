// Tests of FormatBytes, the one form byte counts take in messages and listings.
#include "common/byte_format.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

TEST(ByteFormatTest, WholeBytesBelowOneKiB) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
}

TEST(ByteFormatTest, LargestUnitReachedToOneDecimal) {
  EXPECT_EQ(FormatBytes(1024), "1.0 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(128.0 * (1 << 20)), "128.0 MiB");
  EXPECT_EQ(FormatBytes(static_cast<double>(uint64_t{80} << 30)), "80.0 GiB");
  EXPECT_EQ(FormatBytes(static_cast<double>(uint64_t{1024} << 30)), "1.0 TiB");
  // PiB is the last unit: larger counts stay in it.
  EXPECT_EQ(FormatBytes(static_cast<double>(uint64_t{2048} << 50)), "2048.0 PiB");
}

}  // namespace
}  // namespace pipetrain::common
