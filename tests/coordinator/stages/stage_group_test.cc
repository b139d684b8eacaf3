// How a job's stages are called as a group: every call at once, and one error for the
// job out of their statuses (AttributeError): the first real error wins over our own
// cancellations, and a stage that stopped answering is named as the cause. And how the
// first call to a stage waits for its connection.
#include "coordinator/stages/stage_group.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "coordinator/stages/grpc_stage_connector.h"
#include "coordinator/stages/stage_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Name(int s) { return absl::StrCat("stage ", s); }

struct Case {
  std::string name;
  std::vector<absl::Status> statuses;
  std::vector<bool> answers;  // whether each stage answers a ping
  absl::StatusCode code;
  std::vector<std::string> message_has;
  int lost;  // the stage named as lost, or -1
};

class AttributeErrorTest : public ::testing::TestWithParam<Case> {};

TEST_P(AttributeErrorTest, PicksTheJobsError) {
  const Case& c = GetParam();
  std::vector<int> pinged;
  int lost = -2;
  const absl::Status s = AttributeError(
      c.statuses, 3, "running", Name,
      [&](int stage) {
        pinged.push_back(stage);
        return c.answers[stage];
      },
      &lost);
  EXPECT_EQ(s.code(), c.code) << s;
  for (const std::string& part : c.message_has) EXPECT_THAT(s.message(), HasSubstr(part));
  EXPECT_EQ(lost, c.lost);
  if (c.code == absl::StatusCode::kOk) {
    EXPECT_TRUE(pinged.empty()) << "pinged on success";
  }
}

const absl::Status kCancelled = absl::CancelledError("cancelled by the coordinator");

INSTANTIATE_TEST_SUITE_P(
    Cases, AttributeErrorTest,
    ::testing::Values(
        Case{"AllOk", {absl::OkStatus(), absl::OkStatus()}, {true, true},
             absl::StatusCode::kOk, {}, -1},
        Case{"TheRealErrorWinsOverCancellations",
             {kCancelled, absl::InvalidArgumentError("bad frame"), kCancelled},
             {true, true, true},
             absl::StatusCode::kInvalidArgument,
             {"running stage 1 failed at step 3: bad frame"},
             -1},
        Case{"TheFirstRealErrorWins",
             {absl::OkStatus(), absl::InternalError("first"), absl::InternalError("second")},
             {true, true, true},
             absl::StatusCode::kInternal,
             {"stage 1", "first"},
             -1},
        Case{"OnlyCancellationsGiveTheFirst",
             {absl::OkStatus(), kCancelled, kCancelled},
             {true, true, true},
             absl::StatusCode::kCancelled,
             {"running stage 1 failed"},
             -1},
        Case{"AStageThatStoppedAnsweringIsTheCause",
             {absl::UnavailableError("link to stage 2 broke"), absl::OkStatus(), kCancelled},
             {true, true, false},
             absl::StatusCode::kUnavailable,
             {"stage 2 stopped answering at step 3", "link to stage 2 broke",
              "the job's other stages are free again"},
             2},
        Case{"ALostStagesOwnErrorIsQuoted",
             {kCancelled, absl::DeadlineExceededError("its own")},
             {true, false},
             absl::StatusCode::kUnavailable,
             {"stage 1 stopped answering", "its own"},
             1}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

TEST(AttributeErrorTest, NoStepSaysNoStep) {
  int lost = -2;
  const absl::Status s = AttributeError({absl::InternalError("x")}, 0, "configuring", Name,
                                        [](int) { return true; }, &lost);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kInternal,
                          AllOf(HasSubstr("configuring stage 0 failed: x"),
                                Not(HasSubstr("at step")))));
}

// Every call runs at once: each waits for all the others to have started.
TEST(StageGroupTest, CallsEveryStageAtOnce) {
  std::vector<RunnerStage> stages;
  for (int s = 0; s < 4; ++s) {
    stages.push_back({absl::StrCat("stage-", s + 1), absl::StrCat("127.0.0.1:", 1 + s), {}});
  }
  GrpcStageConnector connector{common::RpcSecurity()};
  StageGroup group(stages, connector);
  ASSERT_EQ(group.size(), 4);
  EXPECT_EQ(group.StageName(2), "stage 2 (stage-3 at 127.0.0.1:3)");
  std::mutex mu;
  std::condition_variable all_in;
  int started = 0;
  const std::vector<absl::Status> st = group.OnEveryStage([&](int s) -> absl::Status {
    std::unique_lock<std::mutex> lock(mu);
    ++started;
    all_in.notify_all();
    if (!all_in.wait_for(lock, std::chrono::seconds(10), [&] { return started == 4; })) {
      return absl::DeadlineExceededError(absl::StrCat("stage ", s, " ran alone"));
    }
    return s == 1 ? absl::InternalError("stage 1's own") : absl::OkStatus();
  });
  ASSERT_EQ(st.size(), 4u);
  EXPECT_THAT(st[0], IsOk());
  EXPECT_THAT(st[1], StatusIs(absl::StatusCode::kInternal, HasSubstr("stage 1's own")));
  EXPECT_THAT(st[2], IsOk());
  EXPECT_THAT(st[3], IsOk());
  EXPECT_TRUE(group.lost().empty());
}

// Configure waits for the connection (a fresh channel's first attempt may fail once),
// but no longer than its deadline, and a stage nobody serves is named.
TEST(StageClientTest, ConfigureOfAnAddressNobodyServesFailsWithinItsDeadline) {
  StageClient client("127.0.0.1:1", common::RpcSecurity());
  const auto start = std::chrono::steady_clock::now();
  auto r = client.Configure(pipetrain::v1::ConfigureRequest(), absl::Seconds(1));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_THAT(r.status(), StatusIs(absl::StatusCode::kUnavailable,
                                   AllOf(HasSubstr("Configure on 127.0.0.1:1"),
                                         HasSubstr("cannot connect within 1s"))));
  EXPECT_GE(seconds, 0.9);  // it waited for the connection, not failed on the first try
  EXPECT_LT(seconds, 5.0);
}

}  // namespace
}  // namespace pipetrain::coordinator
