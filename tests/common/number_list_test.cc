#include "common/number_list.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::common {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(NumberListTest, ParsesCpuSetsAndRefusesOtherText) {
  EXPECT_THAT(ParseNumberList("0-3,8"), ElementsAre(0, 1, 2, 3, 8));
  EXPECT_THAT(ParseNumberList("5,1-2"), ElementsAre(1, 2, 5));
  EXPECT_THAT(ParseNumberList("3-1"), IsEmpty());
  EXPECT_THAT(ParseNumberList("1-2-3"), IsEmpty());
  EXPECT_THAT(ParseNumberList("x"), IsEmpty());
  EXPECT_THAT(ParseNumberList(""), IsEmpty());
}

TEST(NumberListTest, WritesRunsAsRanges) {
  EXPECT_EQ(NumberListText({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(NumberListText({1, 3}), "1,3");
  EXPECT_EQ(NumberListText({0, 1, 5}, ", "), "0-1, 5");
  EXPECT_EQ(NumberListText({}), "");
  EXPECT_THAT(ParseNumberList(NumberListText({2, 4, 5, 6, 9})), ElementsAre(2, 4, 5, 6, 9));
}

}  // namespace
}  // namespace pipetrain::common
