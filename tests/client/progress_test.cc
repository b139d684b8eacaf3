#include "client/progress.h"

#include <sstream>

#include "client/output.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;
using ::testing::HasSubstr;
using ::testing::Not;

pb::StepRecord Step(int64_t n, double loss = 2.314) {
  pb::StepRecord s;
  s.set_step(n);
  s.set_loss(loss);
  s.set_step_time_s(1.0);
  s.set_tokens_per_s(4210);
  s.set_bubble_measured(0.21);
  s.set_bubble_predicted(0.19);
  return s;
}

TEST(ProgressTest, LineHasBarLossThroughputBubbleAndEta) {
  EXPECT_EQ(ProgressLine(Step(120), 300, 80, /*bar=*/true),
            "step 120/300 [========>           ] loss 2.314  4,210 tok/s  bubble 0.21 "
            "(predicted 0.19)  ETA 1m20s");
  EXPECT_EQ(ProgressLine(Step(300), 300, 0, true).substr(0, 35),
            "step 300/300 [====================]");
  EXPECT_THAT(ProgressLine(Step(1), 300, -1, false), Not(HasSubstr("ETA")));
  EXPECT_THAT(ProgressLine(Step(1), 300, -1, false), Not(HasSubstr("[")));
}

TEST(ProgressTest, PlainOutputPrintsAboutEveryFivePercentAndTheLastStep) {
  std::ostringstream out;
  ProgressPrinter p(/*total_steps=*/101, /*tty=*/false, out);
  for (int i = 1; i <= 101; ++i) p.Step(Step(i));
  p.Finish();
  const std::string text = out.str();
  int lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_GE(lines, 20);
  EXPECT_LE(lines, 22);
  EXPECT_THAT(text, HasSubstr("step 101/101"));
  EXPECT_THAT(text, Not(HasSubstr("\r")));
  EXPECT_EQ(p.totals().count, 101);
}

TEST(ProgressTest, TerminalRedrawsTheBarAndPrintsLogsAboveIt) {
  std::ostringstream out;
  ProgressPrinter p(10, /*tty=*/true, out);
  p.Step(Step(1));
  pb::LogLine log;
  log.set_text("checkpoint written");
  p.Log(log);
  p.Step(Step(2));
  p.Finish();
  const std::string text = out.str();
  EXPECT_THAT(text, HasSubstr("\rstep 1/10 ["));
  EXPECT_THAT(text, HasSubstr("\r\033[Kcheckpoint written\n\rstep 1/10"));
  EXPECT_THAT(text, HasSubstr("\rstep 2/10 ["));
  EXPECT_EQ(text.back(), '\n');
}

TEST(ProgressTest, TerminalBarNeverWraps) {
  std::ostringstream out;
  ProgressPrinter p(10, /*tty=*/true, out, /*width=*/40);
  p.Step(Step(1));
  EXPECT_EQ(out.str(), "\rstep 1/10 [==>                 ] loss 2\033[K");
}

TEST(ProgressTest, SummaryOfSuccessAndFailure) {
  StepTotals totals;
  totals.Add(Step(1, 3.0));
  pb::StepRecord last = Step(2, 2.5);
  last.set_has_val_loss(true);
  last.set_val_loss(2.75);
  last.set_bubble_measured(0.31);
  totals.Add(last);
  pb::JobStatus job;
  job.set_job_id("job-000004");
  job.set_state(pb::JobStatus::SUCCEEDED);
  job.set_steps_done(2);
  job.mutable_spec()->mutable_training()->set_steps(2);
  job.set_checkpoint_dir("/ckpt/4");
  std::string s = JobSummary(job, totals);
  EXPECT_THAT(s, HasSubstr("job-000004 SUCCEEDED: 2 of 2 steps in 2s"));
  EXPECT_THAT(s, HasSubstr("final loss       2.5000 (step 2)"));
  EXPECT_THAT(s, HasSubstr("validation loss  2.7500 (step 2)"));
  EXPECT_THAT(s, HasSubstr("bubble           0.26 measured, 0.19 predicted (mean)"));
  EXPECT_THAT(s, HasSubstr("checkpoint       /ckpt/4"));
  EXPECT_THAT(s, Not(HasSubstr("reason")));

  job.set_state(pb::JobStatus::FAILED);
  job.set_reason("stage-1 lost");
  s = JobSummary(job, StepTotals());
  EXPECT_THAT(s, HasSubstr("job-000004 FAILED"));
  EXPECT_THAT(s, HasSubstr("reason           stage-1 lost"));
  EXPECT_THAT(s, Not(HasSubstr("final loss")));
}

TEST(ProgressTest, FittedPredictionsAreNamedAndAveragedOverTheirOwnSteps) {
  StepTotals totals;
  pb::StepRecord guess = Step(1);  // the cost model's guess, before anything is measured
  guess.set_bubble_measured(0.70);
  guess.set_bubble_predicted(0.32);
  totals.Add(guess);
  for (int n = 2; n <= 3; ++n) {
    pb::StepRecord fitted = Step(n);
    fitted.set_bubble_measured(n == 2 ? 0.50 : 0.40);
    fitted.set_bubble_predicted(n == 2 ? 0.48 : 0.42);
    fitted.set_predicted_fitted(true);
    totals.Add(fitted);
    if (n == 3) {
      EXPECT_THAT(ProgressLine(fitted, 3, -1, false), HasSubstr("bubble 0.40 (fitted 0.42)"));
    }
  }
  EXPECT_THAT(ProgressLine(guess, 3, -1, false), HasSubstr("bubble 0.70 (predicted 0.32)"));
  pb::JobStatus job;
  job.set_job_id("job-000005");
  job.set_state(pb::JobStatus::SUCCEEDED);
  job.mutable_spec()->mutable_training()->set_steps(3);
  const std::string s = JobSummary(job, totals);
  // Steps 2-3 only: step 1's 0.70 measured would hide the agreement.
  EXPECT_THAT(s, HasSubstr("bubble           0.45 measured, 0.45 predicted from the measured "
                           "costs (mean of steps 2-3)"));
  EXPECT_THAT(s, HasSubstr("(the cost model's guess: 0.32)"));
}

// Byte sizes are common::FormatBytes's (byte_format_test).
TEST(OutputTest, NumbersDurationsAndTables) {
  EXPECT_EQ(WithThousands(0), "0");
  EXPECT_EQ(WithThousands(4210), "4,210");
  EXPECT_EQ(WithThousands(-1234567), "-1,234,567");
  EXPECT_EQ(HumanDuration(4.2), "4s");
  EXPECT_EQ(HumanDuration(80), "1m20s");
  EXPECT_EQ(HumanDuration(7500), "2h05m");
  EXPECT_EQ(RenderTable({"A", "LONG"}, {{"xyz", "1"}, {"q", ""}}), "A    LONG\nxyz  1\nq\n");
  google::protobuf::Timestamp t;
  EXPECT_EQ(TimeText(t), "-");
  t.set_seconds(1714564803);
  EXPECT_EQ(TimeText(t), "2024-05-01T12:00:03Z");
  EXPECT_EQ(AgeText(t, ToTime(t) + absl::Seconds(65)), "1m05s ago");
}

}  // namespace
}  // namespace pipetrain::client
