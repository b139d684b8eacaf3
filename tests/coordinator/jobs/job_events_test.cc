// The in-memory event log of one running job: only the latest events are kept, and a
// reader behind them is told exactly what it missed (for JobManager::Watch to read it
// from the store); waiting, and the end of the stream.
#include "coordinator/jobs/job_events.h"

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

pb::JobEvent Step(int64_t step) {
  pb::JobEvent e;
  e.mutable_step()->set_step(step);
  return e;
}
pb::JobEvent Log(const std::string& text) {
  pb::JobEvent e;
  e.mutable_log()->set_text(text);
  return e;
}

TEST(JobEventsTest, AReaderWithinTheKeptEventsMissesNothing) {
  JobEvents events(4);
  events.Append(Log("planned"));
  events.Append(Step(1));
  bool ended = true;
  JobEvents::Missed missed;
  std::vector<pb::JobEvent> got = events.Read(0, absl::ZeroDuration(), &ended, &missed);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].log().text(), "planned");
  EXPECT_EQ(got[1].step().step(), 1);
  EXPECT_EQ(missed.until, 0u);
  EXPECT_FALSE(ended);
  got = events.Read(1, absl::ZeroDuration(), &ended, &missed);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].step().step(), 1);
}

TEST(JobEventsTest, OnlyTheLatestAreKeptAndAReaderBehindIsToldWhatItMissed) {
  JobEvents events(3);
  events.Append(Log("a"));    // 0
  events.Append(Step(1));     // 1
  events.Append(Log("b"));    // 2
  events.Append(Step(2));     // 3
  events.Append(Step(3));     // 4
  events.Append(Log("c"));    // 5: keeps 3..5
  bool ended = false;
  JobEvents::Missed missed;
  std::vector<pb::JobEvent> got = events.Read(0, absl::ZeroDuration(), &ended, &missed);
  EXPECT_EQ(missed.until, 3u);
  EXPECT_EQ(missed.logs, 2u) << "a and b";
  EXPECT_EQ(missed.last_step, 1);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].step().step(), 2);
  EXPECT_EQ(got[2].log().text(), "c");
  // From index 2 (b): still behind, the same account; from 3 on: nothing missed.
  got = events.Read(2, absl::ZeroDuration(), &ended, &missed);
  EXPECT_EQ(missed.until, 3u);
  EXPECT_EQ(got.size(), 3u);
  got = events.Read(4, absl::ZeroDuration(), &ended, &missed);
  EXPECT_EQ(missed.until, 0u);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].step().step(), 3);
}

// A job a previous coordinator queued or ran already has log lines in the store: what a
// reader missed counts them too, so that it reads the dropped lines at the store's index.
TEST(JobEventsTest, WhatWasMissedCountsTheLogLinesStoredBefore) {
  JobEvents events(2, /*stored_logs=*/3);
  EXPECT_EQ(events.stored_logs(), 3u);
  events.Append(Log("d"));
  events.Append(Log("e"));
  events.Append(Step(1));
  bool ended = false;
  JobEvents::Missed missed;
  std::vector<pb::JobEvent> got = events.Read(0, absl::ZeroDuration(), &ended, &missed);
  EXPECT_EQ(missed.until, 1u);
  EXPECT_EQ(missed.logs, 4u) << "the 3 stored before and d: e is the store's fifth";
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].log().text(), "e");
}

TEST(JobEventsTest, AReaderWaitsForTheNextEventOrTheEnd) {
  JobEvents events(2);
  events.Append(Step(1));
  std::jthread writer([&] {  // joined even when an ASSERT returns early
    absl::SleepFor(absl::Milliseconds(50));
    events.Append(Step(2));
    absl::SleepFor(absl::Milliseconds(50));
    events.End();
  });
  bool ended = false;
  JobEvents::Missed missed;
  std::vector<pb::JobEvent> got = events.Read(1, absl::Seconds(10), &ended, &missed);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].step().step(), 2);
  got = events.Read(2, absl::Seconds(10), &ended, &missed);
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(ended);
  writer.join();
  // A wait with nothing coming times out empty-handed.
  JobEvents quiet(2);
  got = quiet.Read(0, absl::Milliseconds(30), &ended, &missed);
  EXPECT_TRUE(got.empty());
  EXPECT_FALSE(ended);
}

}  // namespace
}  // namespace pipetrain::coordinator
