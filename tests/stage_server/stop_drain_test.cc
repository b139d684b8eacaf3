// A stage told to stop (stop_drain.h) under a fake clock: it stops at once when no job
// holds it or without grace, waits while held until the coordinator lets it go, stops
// at a second signal, and never waits past the grace; each wait is logged once at its
// start and once at its end.
#include "stage_server/stop_drain.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::stage_server {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

// A stage's surroundings in virtual time: held until `released_at`, a second signal at
// `signal_at` (never by default); every wait for a signal moves the clock on.
class FakeStop {
 public:
  absl::Time released_at = absl::InfiniteFuture();
  absl::Time signal_at = absl::InfiniteFuture();
  std::vector<std::string> logs;
  std::vector<absl::Duration> waits;
  absl::Time now = absl::UnixEpoch();

  StopDrain Drain(absl::Duration grace) {
    StopDrain d;
    d.grace = grace;
    d.held = [this] { return now < released_at; };
    d.job_id = [] { return std::string("job-000007"); };
    d.signal_within = [this](absl::Duration timeout) {
      waits.push_back(timeout);
      if (signal_at <= now + timeout) {
        now = std::max(now, signal_at);
        return true;
      }
      now += timeout;
      return false;
    };
    d.now = [this] { return now; };
    d.log = [this](const std::string& line) { logs.push_back(line); };
    return d;
  }
};

TEST(StopDrainTest, AStageNoJobHoldsStopsAtOnceWithoutALog) {
  FakeStop stop;
  stop.released_at = absl::UnixEpoch();
  EXPECT_EQ(WaitWhileHeld(stop.Drain(absl::Seconds(30))), StopCause::kNotHeld);
  EXPECT_THAT(stop.waits, IsEmpty());
  EXPECT_THAT(stop.logs, IsEmpty());
}

TEST(StopDrainTest, NoGraceStopsAtOnceEvenWhenHeld) {
  FakeStop stop;
  EXPECT_EQ(WaitWhileHeld(stop.Drain(absl::ZeroDuration())), StopCause::kNotHeld);
  EXPECT_THAT(stop.waits, IsEmpty());
  EXPECT_THAT(stop.logs, IsEmpty());
}

TEST(StopDrainTest, AHeldStageServesUntilTheCoordinatorLetsItGo) {
  FakeStop stop;
  stop.released_at = absl::UnixEpoch() + absl::Milliseconds(2350);
  EXPECT_EQ(WaitWhileHeld(stop.Drain(absl::Seconds(30))), StopCause::kReleased);
  // Asked every 250 ms: gone by the first poll after the release.
  EXPECT_EQ(stop.now, absl::UnixEpoch() + absl::Milliseconds(2500));
  for (absl::Duration w : stop.waits) EXPECT_EQ(w, absl::Milliseconds(250));
  ASSERT_THAT(stop.logs, SizeIs(2));
  EXPECT_EQ(stop.logs[0],
            "stopping: job job-000007 holds this stage; serving up to 30 s more for its "
            "coordinator to finish the step and checkpoint (a second SIGINT/SIGTERM stops it "
            "at once)");
  EXPECT_EQ(stop.logs[1], "stopping: the coordinator no longer holds this stage (after 2.5 s)");
}

TEST(StopDrainTest, ASecondSignalStopsItAtOnce) {
  FakeStop stop;
  stop.signal_at = absl::UnixEpoch() + absl::Milliseconds(1234);
  EXPECT_EQ(WaitWhileHeld(stop.Drain(absl::Seconds(30))), StopCause::kSecondSignal);
  EXPECT_EQ(stop.now, stop.signal_at);
  ASSERT_THAT(stop.logs, SizeIs(2));
  EXPECT_EQ(stop.logs[1], "stopping at once: a second signal (job job-000007 still holds this stage)");
}

TEST(StopDrainTest, NeverWaitsPastTheGrace) {
  FakeStop stop;
  EXPECT_EQ(WaitWhileHeld(stop.Drain(absl::Milliseconds(1270))), StopCause::kGraceOver);
  EXPECT_EQ(stop.now, absl::UnixEpoch() + absl::Milliseconds(1270));
  EXPECT_EQ(stop.waits.back(), absl::Milliseconds(20)) << "the last wait ends at the deadline";
  ASSERT_THAT(stop.logs, SizeIs(2));
  EXPECT_THAT(stop.logs[0], HasSubstr("serving up to 1.27 s more"));
  EXPECT_EQ(stop.logs[1],
            "stopping: --stop-grace is over (1.3 s) and job job-000007 still holds this stage");
}

TEST(StopDrainTest, AJobNotYetConfiguredHereIsNamedAsAJob) {
  FakeStop stop;
  stop.released_at = absl::UnixEpoch() + absl::Milliseconds(10);
  StopDrain drain = stop.Drain(absl::Seconds(5));
  drain.job_id = [] { return std::string(); };
  EXPECT_EQ(WaitWhileHeld(drain), StopCause::kReleased);
  ASSERT_THAT(stop.logs, SizeIs(2));
  EXPECT_THAT(stop.logs[0], HasSubstr("stopping: a job holds this stage; serving up to 5 s"));
}

}  // namespace
}  // namespace pipetrain::stage_server
