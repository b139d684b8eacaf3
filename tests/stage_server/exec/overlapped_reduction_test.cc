// OverlappedReduction: averages run on a worker, in the order they were started,
// while the caller goes on; Finish waits for them and writes back in order; a failed
// average skips the rest and fails Finish; the next step starts afresh.
#include "stage_server/exec/overlapped_reduction.h"

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::stage_server {
namespace {

using ::testing::ElementsAre;

TEST(OverlappedReductionTest, AveragesRunInOrderWhileTheCallerGoesOnAndWriteBackAtFinish) {
  absl::Notification release;
  std::vector<float> seen;  // the first element of every buffer, as the worker saw it
  OverlappedReduction reduction([&](std::span<float> data) {
    if (seen.empty()) release.WaitForNotification();  // the first one waits for the test
    seen.push_back(data[0]);
    for (float& v : data) v *= 0.5f;
    return absl::OkStatus();
  });
  std::vector<std::vector<float>> out(3);
  for (int i = 0; i < 3; ++i) {
    reduction.Start({float(i + 1), float(10 * (i + 1))}, [&out, i](std::span<const float> avg) {
      out[i].assign(avg.begin(), avg.end());
      return absl::OkStatus();
    });
  }
  // Start returned with the first average still running: nothing written back yet.
  EXPECT_EQ(reduction.pending(), 3);
  EXPECT_TRUE(out[0].empty());
  absl::SleepFor(absl::Milliseconds(20));
  release.Notify();
  ReductionTimes times;
  ASSERT_TRUE(reduction.Finish(&times).ok());
  EXPECT_THAT(seen, ElementsAre(1.0f, 2.0f, 3.0f));
  EXPECT_THAT(out[0], ElementsAre(0.5f, 5.0f));
  EXPECT_THAT(out[2], ElementsAre(1.5f, 15.0f));
  EXPECT_EQ(times.calls, 3);
  EXPECT_GE(times.busy, absl::Milliseconds(15)) << "the first average's wait is its own time";
  EXPECT_GE(times.exposed, absl::ZeroDuration());
  EXPECT_EQ(reduction.pending(), 0);
}

TEST(OverlappedReductionTest, AFailedAverageSkipsTheRestAndTheNextStepStartsAfresh) {
  std::atomic<int> calls{0};
  std::atomic<bool> fail{true};
  OverlappedReduction reduction([&](std::span<float>) {
    ++calls;
    return fail.load() ? absl::UnavailableError("replica 1 of stage 0 is gone")
                       : absl::OkStatus();
  });
  int written = 0;
  auto count = [&](std::span<const float>) {
    ++written;
    return absl::OkStatus();
  };
  reduction.Start({1}, count);
  reduction.Start({2}, count);
  ReductionTimes times;
  absl::Status s = reduction.Finish(&times);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("replica 1 of stage 0"));
  EXPECT_EQ(calls.load(), 1) << "the second was skipped";
  EXPECT_EQ(written, 0) << "nothing half-averaged is written back";

  fail = false;
  reduction.Start({3}, count);
  ASSERT_TRUE(reduction.Finish(&times).ok());
  EXPECT_EQ(written, 1);
  EXPECT_EQ(times.calls, 1);
}

TEST(OverlappedReductionTest, AWriteBackErrorFailsFinishAndFinishWithNothingStartedIsOk) {
  OverlappedReduction reduction([](std::span<float>) { return absl::OkStatus(); });
  ReductionTimes times;
  EXPECT_TRUE(reduction.Finish(&times).ok());
  EXPECT_EQ(times.calls, 0);
  reduction.Start({1}, [](std::span<const float>) {
    return absl::InvalidArgumentError("gradients of layer 3: 1 values for 2 parameters");
  });
  EXPECT_EQ(reduction.Finish(&times).code(), absl::StatusCode::kInvalidArgument);
}

TEST(OverlappedReductionTest, DestroyingItWaitsForTheAveragesStarted) {
  std::atomic<int> done{0};
  {
    OverlappedReduction reduction([&](std::span<float>) {
      absl::SleepFor(absl::Milliseconds(10));
      ++done;
      return absl::OkStatus();
    });
    for (int i = 0; i < 3; ++i) reduction.Start({1}, [](std::span<const float>) { return absl::OkStatus(); });
  }
  EXPECT_EQ(done.load(), 3);
}

// A step stuck waiting for an average that will not come (the other replicas are
// gone) while the stage is reconfigured: Abort ends the wait at once, later Finishes
// too, destroying the reduction does not wait for the stuck average, which finishes on
// its own later with everything it uses still alive.
TEST(OverlappedReductionTest, AbortEndsAFinishWaitingForAStuckAverageAndDestroyingItDoesNotWait) {
  auto release = std::make_shared<absl::Notification>();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  auto reduction = std::make_unique<OverlappedReduction>([release, finished](std::span<float> d) {
    release->WaitForNotification();
    d[0] = 7;  // its buffer is still there
    *finished = true;
    return absl::OkStatus();
  });
  bool written = false;
  reduction->Start({1, 2}, [&](std::span<const float>) {
    written = true;
    return absl::OkStatus();
  });
  reduction->Start({3}, [&](std::span<const float>) {
    written = true;
    return absl::OkStatus();
  });
  absl::Status waited;
  std::thread finish([&] {
    ReductionTimes times;
    waited = reduction->Finish(&times);
  });
  absl::SleepFor(absl::Milliseconds(50));
  reduction->Abort("stage 1 of job 'j' was configured again");
  finish.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(waited.message()), ::testing::HasSubstr("configured again"));
  ReductionTimes times;
  EXPECT_EQ(reduction->Finish(&times).code(), absl::StatusCode::kAborted) << "for good";
  const absl::Time before = absl::Now();
  reduction.reset();
  EXPECT_LT(absl::Now() - before, absl::Seconds(5)) << "the destructor waited for the average";
  EXPECT_FALSE(*finished);
  release->Notify();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!*finished && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_TRUE(*finished);
  EXPECT_FALSE(written) << "nothing is written back after an abort";
}

}  // namespace
}  // namespace pipetrain::stage_server
