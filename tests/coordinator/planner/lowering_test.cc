#include "coordinator/planner/lowering.h"

#include "common/schedule/validator.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::IsOk;

schedule::Schedule Parse(const char* text) {
  auto s = schedule::ParseScheduleText(text);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(LoweringTest, ReceivesGoRightBeforeAndSendsRightAfterTheirCompute) {
  const schedule::Schedule lowered =
      Lower(Parse("schedule 1f1b stages 3 micro_batches 1 chunks 1\n"
                  "stage 0 max_in_flight 1: F0 B0 OPT\n"
                  "stage 1 max_in_flight 1: F0 B0 OPT\n"
                  "stage 2 max_in_flight 1: F0 B0 OPT\n"));
  EXPECT_EQ(schedule::ToText(lowered),
            "schedule 1f1b stages 3 micro_batches 1 chunks 1\n"
            "stage 0 max_in_flight 1: F0 SEND_F0 RECV_B0 B0 OPT\n"
            "stage 1 max_in_flight 1: RECV_F0 F0 SEND_F0 RECV_B0 B0 SEND_B0 OPT\n"
            "stage 2 max_in_flight 1: RECV_F0 F0 B0 SEND_B0 OPT\n");
  EXPECT_THAT(schedule::Validate(lowered), IsOk());
}

TEST(LoweringTest, SplitBackwardSendsAfterTheInputPartOnly) {
  const schedule::Schedule lowered =
      Lower(Parse("schedule zb-h1 stages 2 micro_batches 1 chunks 1\n"
                  "stage 0 max_in_flight 1: F0 I0 W0 OPT\n"
                  "stage 1 max_in_flight 1: F0 I0 W0 OPT\n"));
  EXPECT_EQ(ToString(lowered[1].actions), "RECV_F0 F0 I0 SEND_B0 W0 OPT");
  EXPECT_EQ(ToString(lowered[0].actions), "F0 SEND_F0 RECV_B0 I0 W0 OPT");
}

TEST(LoweringTest, ChunksWrapFromTheLastStageToTheFirst) {
  // Two stages, two chunks: virtual stages 0 (s0 c0), 1 (s1 c0), 2 (s0 c1), 3 (s1 c1).
  const schedule::Schedule lowered =
      Lower(Parse("schedule interleaved stages 2 micro_batches 1 chunks 2\n"
                  "stage 0 max_in_flight 2: F0 F0@1 B0@1 B0 OPT\n"
                  "stage 1 max_in_flight 2: F0 F0@1 B0@1 B0 OPT\n"));
  EXPECT_EQ(ToString(lowered[0].actions),
            "F0 SEND_F0 RECV_F0@1 F0@1 SEND_F0@1 RECV_B0@1 B0@1 SEND_B0@1 RECV_B0 B0 OPT");
  EXPECT_EQ(ToString(lowered[1].actions),
            "RECV_F0 F0 SEND_F0 RECV_F0@1 F0@1 B0@1 SEND_B0@1 RECV_B0 B0 SEND_B0 OPT");
  EXPECT_THAT(schedule::Validate(lowered), IsOk());
}

}  // namespace
}  // namespace pipetrain::planner
