// The job runner's step loop in process, against fake stages (testing/fake_stages.h):
// every step run and reported in order with the losses of the state it ran on,
// validation and checkpoints when due, a lost stage named, a stage's error, a cancel, a
// restored run keeping the job's step numbers, two-phase clipping, replicas, checkpoints
// that record the job's precision and a job started from one of the other precision.
#include "coordinator/runner/job_runner.h"

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/model/checkpoint.h"
#include "common/model/checkpoint_folder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/corpus_text.h"
#include "tests/testing/fake_stages.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::FakeStages;
using ::pipetrain::testing::TempDir;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

// What a run reported, as it reported it. Cancelled once step `cancel_after` is done.
class RecordingHooks : public RunnerHooks {
 public:
  void Log(const std::string& text) override { logs.push_back(text); }
  void FirstStep(int64_t first) override { first_steps.push_back(first); }
  void PredictedTimeline(std::vector<pb::TimelineEvent> events) override {
    if (!events.empty()) predicted_steps.push_back(events[0].step());
  }
  void Step(const pb::StepRecord& record, std::vector<pb::TimelineEvent> timeline) override {
    steps.push_back(record);
    timeline_sizes.push_back(timeline.size());
  }
  void Checkpoint(const std::string& dir, int64_t step) override {
    checkpoint_steps.push_back(step);
    checkpoint_dirs.push_back(dir);
  }
  void Measured(const pb::MeasuredCostRates& rates) override { measured.push_back(rates); }
  bool Cancelled() override {
    return cancel_after > 0 && !steps.empty() && steps.back().step() >= cancel_after;
  }

  std::string AllLogs() const { return absl::StrJoin(logs, "\n"); }
  std::vector<int64_t> StepNumbers() const {
    std::vector<int64_t> out;
    for (const pb::StepRecord& r : steps) out.push_back(r.step());
    return out;
  }

  int64_t cancel_after = 0;
  std::vector<std::string> logs;
  std::vector<int64_t> first_steps, predicted_steps, checkpoint_steps;
  std::vector<std::string> checkpoint_dirs;
  std::vector<pb::StepRecord> steps;
  std::vector<size_t> timeline_sizes;
  std::vector<pb::MeasuredCostRates> measured;
};

class JobRunnerTest : public ::testing::Test {
 protected:
  static constexpr int kFakes = 4;

  JobRunnerTest() {
    testing::WriteFileOrDie(dir_.File("corpus.txt"), testing::EnglishLikeCorpus());
    for (int i = 0; i < kFakes; ++i) fakes_->Add(Address(i));
    options_.checkpoint_root = dir_.File("checkpoints");
    options_.connector = fakes_;
    options_.step_deadline = absl::Seconds(30);
  }

  static std::string Address(int i) { return absl::StrCat("10.0.0.", i + 1, ":7000"); }

  pb::JobSpec Spec(const std::vector<std::string>& overrides = {}) {
    absl::StatusOr<pb::JobSpec> spec = testing::FakeJobSpec(dir_.File("corpus.txt"), overrides);
    EXPECT_TRUE(spec.ok()) << spec.status();
    return spec.value_or(pb::JobSpec());
  }

  RunOutcome Run(const pb::JobSpec& spec, int stages, RecordingHooks& hooks,
                 const RunStart& start = {}) {
    std::vector<RunnerStage> on;
    for (int i = 0; i < stages; ++i) {
      RunnerStage s{absl::StrCat("stage-", i + 1), Address(i), {}};
      s.device.set_kind("cpu");
      s.device.set_memory_bytes(uint64_t{1} << 30);
      on.push_back(std::move(s));
    }
    return RunJob("job-1", spec, on, options_, hooks, start);
  }

  // The losses the steps reported equal those of an unbroken run: each step ran on the
  // state of the steps before it, applied once.
  static void ExpectUnbrokenLosses(const std::vector<pb::StepRecord>& steps) {
    for (const pb::StepRecord& r : steps) {
      EXPECT_DOUBLE_EQ(r.loss(), FakeStages::LossAfter(r.step() - 1)) << "step " << r.step();
    }
  }

  TempDir dir_;
  std::shared_ptr<FakeStages> fakes_ = std::make_shared<FakeStages>();
  RunnerOptions options_;
  RecordingHooks hooks_;
};

TEST_F(JobRunnerTest, RunsEveryStepAndReportsEachInOrder) {
  const RunOutcome out = Run(Spec(), 2, hooks_);
  EXPECT_EQ(out.state, pb::JobStatus::SUCCEEDED) << out.reason;
  EXPECT_EQ(out.steps_done, 6);
  EXPECT_TRUE(out.configured);
  EXPECT_THAT(out.lost_stage_ids, IsEmpty());
  EXPECT_THAT(hooks_.first_steps, ElementsAre(1));
  EXPECT_THAT(hooks_.StepNumbers(), ElementsAre(1, 2, 3, 4, 5, 6));
  ExpectUnbrokenLosses(hooks_.steps);
  for (size_t i = 0; i < hooks_.steps.size(); ++i) {
    const pb::StepRecord& r = hooks_.steps[i];
    EXPECT_DOUBLE_EQ(r.grad_norm(), std::sqrt(2 * 0.25)) << "both stages' shares";
    EXPECT_EQ(r.stages_size(), 2);
    EXPECT_GT(hooks_.timeline_sizes[i], 0u) << "step " << r.step();
    EXPECT_FALSE(r.has_val_loss());
  }
  // Each step predicted just before it was reported.
  EXPECT_EQ(hooks_.predicted_steps, hooks_.StepNumbers());
  // Every 2 steps, and the last one.
  EXPECT_THAT(hooks_.checkpoint_steps, ElementsAre(2, 4, 6));
  EXPECT_EQ(hooks_.checkpoint_dirs.back(), dir_.File("checkpoints/step-6"));
  EXPECT_THAT(testing::ListFolder(dir_.File("checkpoints")),
              ElementsAre("step-2", "step-4", "step-6"));
  for (int s = 0; s < 2; ++s) {
    EXPECT_THAT(fakes_->Updates(Address(s)), ElementsAre(6)) << Address(s);
    EXPECT_THAT(fakes_->StepsRun(Address(s)), ElementsAre(1, 2, 3, 4, 5, 6));
    EXPECT_EQ(fakes_->Calls(Address(s)).front(), absl::StrCat("Configure job-1 stage ", s));
  }
  EXPECT_THAT(fakes_->Calls(Address(2)), IsEmpty()) << "a stage the job was not given";
  EXPECT_THAT(hooks_.AllLogs(), HasSubstr("planned 2 stages, schedule gpipe"));
}

TEST_F(JobRunnerTest, ValidatesEveryNStepsAndAtTheLast) {
  const RunOutcome out = Run(Spec({"data.validate_every_steps=4"}), 2, hooks_);
  ASSERT_EQ(out.state, pb::JobStatus::SUCCEEDED) << out.reason;
  ASSERT_EQ(hooks_.steps.size(), 6u);
  for (const pb::StepRecord& r : hooks_.steps) {
    const bool due = r.step() == 4 || r.step() == 6;
    EXPECT_EQ(r.has_val_loss(), due) << "step " << r.step();
    // Measured after the step's update.
    if (due) {
      EXPECT_DOUBLE_EQ(r.val_loss(), FakeStages::LossAfter(r.step()));
    }
  }
  EXPECT_THAT(fakes_->StepsRun(Address(0)), ElementsAre(1, 2, 3, 4, 4, 5, 6, 6));
  EXPECT_THAT(fakes_->Updates(Address(0)), ElementsAre(6)) << "validation updates nothing";
}

TEST_F(JobRunnerTest, AStageThatDiesIsNamedLostAndNoStageAppliesTheStep) {
  fakes_->DieAtStep(Address(1), 3);
  const RunOutcome out = Run(Spec(), 2, hooks_);
  EXPECT_EQ(out.state, pb::JobStatus::FAILED);
  EXPECT_THAT(out.reason,
              HasSubstr("stage 1 (stage-2 at 10.0.0.2:7000) stopped answering at step 3"));
  EXPECT_THAT(out.lost_stage_ids, ElementsAre("stage-2"));
  EXPECT_EQ(out.steps_done, 2);
  EXPECT_TRUE(out.configured);
  EXPECT_THAT(hooks_.StepNumbers(), ElementsAre(1, 2));
  EXPECT_THAT(fakes_->Calls(Address(0)), Contains("RunStep 3"));
  EXPECT_THAT(fakes_->Updates(Address(0)), ElementsAre(2)) << "the survivor was cancelled";
}

TEST_F(JobRunnerTest, AStagesErrorFailsTheJobAndLosesNoStage) {
  fakes_->FailAtStep(Address(0), 2, absl::InternalError("bad frame"));
  const RunOutcome out = Run(Spec(), 2, hooks_);
  EXPECT_EQ(out.state, pb::JobStatus::FAILED);
  EXPECT_THAT(out.reason,
              HasSubstr("running stage 0 (stage-1 at 10.0.0.1:7000) failed at step 2: bad frame"));
  EXPECT_THAT(out.lost_stage_ids, IsEmpty());
  EXPECT_EQ(out.steps_done, 1);
  EXPECT_THAT(fakes_->Updates(Address(1)), ElementsAre(1));
}

TEST_F(JobRunnerTest, AConfigureErrorFailsBeforeAnyStep) {
  fakes_->FailNext(Address(1), "Configure", absl::ResourceExhaustedError("out of memory"));
  const RunOutcome out = Run(Spec(), 2, hooks_);
  EXPECT_EQ(out.state, pb::JobStatus::FAILED);
  EXPECT_THAT(out.reason, HasSubstr("configuring stage 1 (stage-2 at 10.0.0.2:7000) failed: "
                                    "out of memory"));
  EXPECT_FALSE(out.configured);
  EXPECT_EQ(out.steps_done, 0);
  EXPECT_THAT(hooks_.steps, IsEmpty());
  EXPECT_THAT(fakes_->StepsRun(Address(0)), IsEmpty());
}

TEST_F(JobRunnerTest, ACancelEndsBetweenStepsWithACheckpointOfTheLast) {
  hooks_.cancel_after = 3;
  const RunOutcome out = Run(Spec(), 2, hooks_);
  EXPECT_EQ(out.state, pb::JobStatus::CANCELLED);
  EXPECT_EQ(out.reason, "cancelled before step 4");
  EXPECT_EQ(out.steps_done, 3);
  EXPECT_THAT(hooks_.checkpoint_steps, ElementsAre(2, 3));
  EXPECT_THAT(fakes_->StepsRun(Address(0)), ElementsAre(1, 2, 3));
}

TEST_F(JobRunnerTest, ARestoredRunContinuesWithTheJobsStepNumbers) {
  ASSERT_EQ(Run(Spec(), 2, hooks_).state, pb::JobStatus::SUCCEEDED);
  const std::string dir = dir_.File("checkpoints/step-4");
  absl::StatusOr<model::Checkpoint> whole = model::LoadWholeCheckpoint(dir, "test");
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(whole->optimizer.has_value());
  EXPECT_EQ(whole->optimizer->step, 4);
  const RestoredState restored{4, *std::move(whole), absl::StrCat("checkpoint ", dir)};

  RecordingHooks again;
  // On one stage: the restored state is cut to whatever the new plan holds.
  const RunOutcome out = Run(Spec({"pipeline.stages=1", "pipeline.micro_batches=2"}), 1, again,
                             RunStart{.job_first_step = 1, .restored = &restored});
  EXPECT_EQ(out.state, pb::JobStatus::SUCCEEDED) << out.reason;
  EXPECT_THAT(again.first_steps, ElementsAre(1));
  EXPECT_THAT(again.StepNumbers(), ElementsAre(5, 6));
  ExpectUnbrokenLosses(again.steps);
  EXPECT_THAT(again.AllLogs(), HasSubstr("restored the state after step 4 from checkpoint"));
  EXPECT_THAT(fakes_->Calls(Address(0)), Contains("ImportChunk 0 step 4"));
  EXPECT_THAT(fakes_->Updates(Address(0)), ElementsAre(6));
}

TEST_F(JobRunnerTest, ClippingOverSeveralStagesAppliesTheOptimizerInASecondPhase) {
  const RunOutcome out = Run(Spec({"training.grad_clip_norm=1.0"}), 2, hooks_);
  ASSERT_EQ(out.state, pb::JobStatus::SUCCEEDED) << out.reason;
  ExpectUnbrokenLosses(hooks_.steps);
  for (int s = 0; s < 2; ++s) {
    for (int step = 1; step <= 6; ++step) {
      EXPECT_THAT(fakes_->Calls(Address(s)), Contains(absl::StrCat("ApplyOptimizer ", step)));
    }
    EXPECT_THAT(fakes_->Updates(Address(s)), ElementsAre(6));
  }
}

TEST_F(JobRunnerTest, WithoutClippingNoSecondPhase) {
  ASSERT_EQ(Run(Spec(), 2, hooks_).state, pb::JobStatus::SUCCEEDED);
  EXPECT_THAT(fakes_->Calls(Address(0)), Not(Contains(HasSubstr("ApplyOptimizer"))));
}

TEST_F(JobRunnerTest, AFailedCheckpointOnHealthyStagesIsAWarningAndTheJobGoesOn) {
  fakes_->FailNext(Address(0), "ExportChunk", absl::InternalError("disk on fire"));
  const RunOutcome out = Run(Spec(), 2, hooks_);
  EXPECT_EQ(out.state, pb::JobStatus::SUCCEEDED) << out.reason;
  EXPECT_THAT(hooks_.checkpoint_steps, ElementsAre(4, 6));
  EXPECT_THAT(hooks_.AllLogs(), HasSubstr("disk on fire; the job goes on and tries again at "
                                          "the next checkpoint"));
}

// The precision every file of a checkpoint folder records, and the loaded whole's.
std::vector<std::string> PrecisionsOf(const std::string& dir) {
  std::vector<std::string> out;
  absl::StatusOr<std::vector<std::string>> files = model::IndexShardFiles(dir);
  EXPECT_TRUE(files.ok()) << files.status();
  for (const std::string& f : files.value_or(std::vector<std::string>{})) {
    absl::StatusOr<model::CheckpointInfo> info = model::ReadCheckpointInfo(f);
    EXPECT_TRUE(info.ok()) << info.status();
    out.push_back(info.ok() ? info->precision : "?");
  }
  absl::StatusOr<model::Checkpoint> whole = model::LoadWholeCheckpoint(dir, "test");
  EXPECT_TRUE(whole.ok()) << whole.status();
  out.push_back(whole.ok() ? whole->precision : "?");
  return out;
}

std::vector<std::string> LinesWith(const std::vector<std::string>& logs, const std::string& part) {
  std::vector<std::string> out;
  for (const std::string& line : logs) {
    if (absl::StrContains(line, part)) out.push_back(line);
  }
  return out;
}

// A job's checkpoints record its training.precision (the stages' exports do not know
// it); a job started from a checkpoint of the other precision loads its fp32 state as it
// is, continues the losses, and says so once.
TEST_F(JobRunnerTest, AJobStartsFromACheckpointOfEitherPrecisionAndSaysSo) {
  ASSERT_EQ(Run(Spec(), 2, hooks_).state, pb::JobStatus::SUCCEEDED);
  const std::string fp32 = dir_.File("checkpoints/step-6");
  EXPECT_THAT(PrecisionsOf(fp32), AllOf(SizeIs(3), Each("fp32")));

  RecordingHooks to_bf16;
  const RunOutcome bf16 =
      Run(Spec({"training.precision=bf16", "init_from=" + fp32}), 2, to_bf16);
  ASSERT_EQ(bf16.state, pb::JobStatus::SUCCEEDED) << bf16.reason;
  EXPECT_THAT(to_bf16.StepNumbers(), ElementsAre(7, 8, 9, 10, 11, 12));
  ExpectUnbrokenLosses(to_bf16.steps);
  EXPECT_THAT(LinesWith(to_bf16.logs, "trained in"),
              ElementsAre("job job-1 trains in bf16 from init_from '" + fp32 +
                          "', which was trained in fp32: its fp32 master weights and AdamW "
                          "moments are carried over unchanged"));
  const std::string bf16_dir = dir_.File("checkpoints/step-12");
  EXPECT_THAT(PrecisionsOf(bf16_dir), AllOf(SizeIs(3), Each("bf16")));

  RecordingHooks to_fp32;
  const RunOutcome back = Run(Spec({"init_from=" + bf16_dir}), 2, to_fp32);
  ASSERT_EQ(back.state, pb::JobStatus::SUCCEEDED) << back.reason;
  ExpectUnbrokenLosses(to_fp32.steps);
  EXPECT_THAT(LinesWith(to_fp32.logs, "trained in"),
              ElementsAre("job job-1 trains in fp32 from init_from '" + bf16_dir +
                          "', which was trained in bf16: its fp32 master weights and AdamW "
                          "moments are carried over unchanged"));
  EXPECT_THAT(PrecisionsOf(dir_.File("checkpoints/step-18")), Each("fp32"));

  // The same precision: nothing to say.
  RecordingHooks same;
  ASSERT_EQ(Run(Spec({"training.precision=bf16", "init_from=" + bf16_dir}), 2, same).state,
            pb::JobStatus::SUCCEEDED);
  EXPECT_THAT(LinesWith(same.logs, "trained in"), IsEmpty());
  EXPECT_THAT(same.AllLogs(), HasSubstr("started from " + bf16_dir));
}

TEST_F(JobRunnerTest, ReplicasRunOnEveryStageServerAndOnePipelineIsSaved) {
  const RunOutcome out =
      Run(Spec({"pipeline.replicas=2", "pipeline.shard_optimizer=false"}), 4, hooks_);
  ASSERT_EQ(out.state, pb::JobStatus::SUCCEEDED) << out.reason;
  ExpectUnbrokenLosses(hooks_.steps);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(fakes_->Calls(Address(i)).front(), absl::StrCat("Configure job-1 stage ", i % 2));
    EXPECT_FALSE(fakes_->Configured(Address(i)).shard_optimizer());
    EXPECT_THAT(fakes_->Updates(Address(i)), ElementsAre(6));
    // Replica 1's stages hold the same state as replica 0's: only those are exported.
    EXPECT_EQ(absl::c_count(fakes_->Calls(Address(i)), "ExportChunk 0"), i < 2 ? 3 : 0)
        << Address(i);
  }
  EXPECT_THAT(hooks_.AllLogs(), HasSubstr("2 data-parallel replicas of the 2 stages"));
  EXPECT_THAT(hooks_.AllLogs(), HasSubstr("each replica keeps the whole optimizer"));
}

// By default the copies of each stage split the optimizer: every stage is told so, and
// every copy's export goes into each checkpoint (each holds its own moments).
TEST_F(JobRunnerTest, ReplicasSplitTheOptimizerByDefaultAndEveryCopyIsSaved) {
  const RunOutcome out = Run(Spec({"pipeline.replicas=2"}), 4, hooks_);
  ASSERT_EQ(out.state, pb::JobStatus::SUCCEEDED) << out.reason;
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(fakes_->Configured(Address(i)).shard_optimizer()) << Address(i);
    EXPECT_EQ(absl::c_count(fakes_->Calls(Address(i)), "ExportChunk 0"), 3) << Address(i);
  }
  EXPECT_THAT(hooks_.AllLogs(), HasSubstr("the 2 copies of each stage split the optimizer"));
}

// One replica has nothing to split with: said once, and nothing changes.
TEST_F(JobRunnerTest, SplittingTheOptimizerOfOneReplicaIsSaidToChangeNothing) {
  const RunOutcome out = Run(Spec({"pipeline.shard_optimizer=true"}), 2, hooks_);
  ASSERT_EQ(out.state, pb::JobStatus::SUCCEEDED) << out.reason;
  EXPECT_FALSE(fakes_->Configured(Address(0)).shard_optimizer());
  const std::string logs = hooks_.AllLogs();
  EXPECT_THAT(logs, HasSubstr("pipeline.shard_optimizer changes nothing with one replica"));
  EXPECT_EQ(logs.find("shard_optimizer changes nothing"), logs.rfind("shard_optimizer changes nothing"));
}

}  // namespace
}  // namespace pipetrain::coordinator
