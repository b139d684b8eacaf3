// What becomes of a job after a run or a failed recovery (restart_rules.h), case by case:
// recover while restarts are left, the restart count in the reason when they are used
// up, the resume hint on a failure, CANCELLED for the user's cancel, RECOVERING for the
// next coordinator when this one stops (CANCELLED with the hint under --on-stop cancel);
// what a starting coordinator does with the jobs its store holds, and the layout it
// resumes one on.
#include "coordinator/runner/restart_rules.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using Action = Verdict::Action;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kHint[] = "; continue it with 'pipetrain resume job-7' (from /s/ck/step-4)";

JobFacts Facts(int restarts_done, int max_restarts) {
  return {.job_id = "job-7",
          .checkpoint_dir = "/s/ck/step-4",
          .steps_done = 5,
          .restarts_done = restarts_done,
          .max_restarts = max_restarts};
}

RunOutcome Lost(std::vector<std::string> ids = {"stage-2"}) {
  RunOutcome out;
  out.state = pb::JobStatus::FAILED;
  out.reason = "stage 1 (stage-2 at h:1) stopped answering at step 6";
  out.lost_stage_ids = std::move(ids);
  out.steps_done = 5;
  out.configured = true;
  return out;
}

TEST(AfterRunTest, ALostStageWithRestartsLeftIsRecovered) {
  const Verdict v = AfterRun(Lost({"stage-2", "stage-3"}), Facts(1, 3));
  EXPECT_EQ(v.action, Action::kRecover);
  EXPECT_EQ(v.state, pb::JobStatus::RECOVERING);
  EXPECT_EQ(v.reason, "stage-2 and stage-3 lost at step 6: recovering (restart 2 of 3)");
}

TEST(AfterRunTest, RestartsUsedUpFailWithTheirCountAndTheResumeHint) {
  const Verdict one = AfterRun(Lost(), Facts(1, 1));
  EXPECT_EQ(one.action, Action::kEnd);
  EXPECT_EQ(one.state, pb::JobStatus::FAILED);
  EXPECT_EQ(one.reason, absl::StrCat(Lost().reason, " (after 1 restart, "
                                     "fault_tolerance.max_restarts)", kHint));
  const Verdict three = AfterRun(Lost(), Facts(3, 3));
  EXPECT_THAT(three.reason, HasSubstr("(after 3 restarts, fault_tolerance.max_restarts)"));
}

TEST(AfterRunTest, NoRestartsAllowedFailsWithTheResumeHintAlone) {
  const Verdict v = AfterRun(Lost(), Facts(0, 0));
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::FAILED);
  EXPECT_EQ(v.reason, absl::StrCat(Lost().reason, kHint));
}

TEST(AfterRunTest, NoCheckpointNoHint) {
  JobFacts facts = Facts(0, 0);
  facts.checkpoint_dir.clear();
  EXPECT_EQ(AfterRun(Lost(), facts).reason, Lost().reason);
}

TEST(AfterRunTest, AFailureThatLostNoStageIsNotRecovered) {
  RunOutcome out = Lost({});
  out.reason = "running stage 0 failed at step 6: bad frame";
  const Verdict v = AfterRun(out, Facts(0, 3));
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::FAILED);
  EXPECT_EQ(v.reason, absl::StrCat(out.reason, kHint));
}

TEST(AfterRunTest, ALostStageOfACancelledJobIsNotRecovered) {
  JobFacts facts = Facts(0, 3);
  facts.cancel_requested = true;
  const Verdict v = AfterRun(Lost(), facts);
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::FAILED);
  EXPECT_THAT(v.reason, Not(HasSubstr("recovering")));
}

TEST(AfterRunTest, SuccessEndsAsItIs) {
  RunOutcome out;
  out.state = pb::JobStatus::SUCCEEDED;
  out.steps_done = 6;
  const Verdict v = AfterRun(out, Facts(2, 3));
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::SUCCEEDED);
  EXPECT_EQ(v.reason, "");
}

RunOutcome Cancelled() {
  RunOutcome out;
  out.state = pb::JobStatus::CANCELLED;
  out.reason = "cancelled before step 6";
  out.steps_done = 5;
  return out;
}

TEST(AfterRunTest, TheUsersCancelEndsCancelledWithoutHint) {
  JobFacts facts = Facts(0, 3);
  facts.cancel_requested = true;
  facts.coordinator_stopping = true;  // the user's cancel wins
  const Verdict v = AfterRun(Cancelled(), facts);
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::CANCELLED);
  EXPECT_EQ(v.reason, "cancelled before step 6");
}

TEST(AfterRunTest, TheCoordinatorsStopWithRestartsAllowedLeavesItForTheNext) {
  JobFacts facts = Facts(3, 3);  // even with its restarts used up: a stop is no loss
  facts.coordinator_stopping = true;
  const Verdict v = AfterRun(Cancelled(), facts);
  EXPECT_EQ(v.action, Action::kLeaveForNextCoordinator);
  EXPECT_EQ(v.state, pb::JobStatus::RECOVERING);
  EXPECT_EQ(v.reason,
            "the coordinator stopped while the job was running (after step 5; cancelled before "
            "step 6): a coordinator started on the same --state-dir continues it");
}

TEST(AfterRunTest, TheCoordinatorsStopWithoutRestartsFailsTheJobWithTheHint) {
  JobFacts facts = Facts(0, 0);
  facts.coordinator_stopping = true;
  const Verdict v = AfterRun(Cancelled(), facts);
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::FAILED);
  EXPECT_EQ(v.reason, absl::StrCat("the coordinator stopped while the job was running "
                                   "(cancelled before step 6)", kHint));
}

// --on-stop cancel: the coordinator's stop is final (scancel); the job ends CANCELLED
// with the step it stopped after, the stop, and how to continue it.
JobFacts StoppedToCancel(int restarts_done, int max_restarts) {
  JobFacts facts = Facts(restarts_done, max_restarts);
  facts.coordinator_stopping = true;
  facts.on_stop = OnStop::kCancel;
  return facts;
}

TEST(AfterRunTest, TheCoordinatorsStopWithOnStopCancelEndsCancelledWithTheHint) {
  for (int max_restarts : {0, 3}) {
    const Verdict v = AfterRun(Cancelled(), StoppedToCancel(0, max_restarts));
    EXPECT_EQ(v.action, Action::kEnd) << max_restarts;
    EXPECT_EQ(v.state, pb::JobStatus::CANCELLED) << max_restarts;
    EXPECT_EQ(v.reason, absl::StrCat("the coordinator was stopped by a signal (--on-stop "
                                     "cancel) after step 5 (cancelled before step 6)",
                                     kHint));
  }
}

TEST(AfterRunTest, OnStopCancelWithoutACheckpointHasNoHint) {
  JobFacts facts = StoppedToCancel(0, 3);
  facts.checkpoint_dir.clear();
  const Verdict v = AfterRun(Cancelled(), facts);
  EXPECT_EQ(v.state, pb::JobStatus::CANCELLED);
  EXPECT_EQ(v.reason, "the coordinator was stopped by a signal (--on-stop cancel) after step 5 "
                      "(cancelled before step 6)");
}

TEST(AfterRunTest, OnStopCancelLeavesTheUsersCancelAsItIs) {
  JobFacts facts = StoppedToCancel(0, 3);
  facts.cancel_requested = true;
  const Verdict v = AfterRun(Cancelled(), facts);
  EXPECT_EQ(v.state, pb::JobStatus::CANCELLED);
  EXPECT_EQ(v.reason, "cancelled before step 6");
}

TEST(AfterRunTest, OnStopCancelChangesNothingWhileTheCoordinatorRuns) {
  JobFacts facts = Facts(1, 3);
  facts.on_stop = OnStop::kCancel;
  EXPECT_EQ(AfterRun(Lost(), facts).action, Action::kRecover);
  facts = Facts(1, 1);
  facts.on_stop = OnStop::kCancel;
  const Verdict failed = AfterRun(Lost(), facts);
  EXPECT_EQ(failed.state, pb::JobStatus::FAILED);
  RunOutcome done;
  done.state = pb::JobStatus::SUCCEEDED;
  EXPECT_EQ(AfterRun(done, facts).state, pb::JobStatus::SUCCEEDED);
}

// Stages signalled with the coordinator that did not wait for the step (--stop-grace 0,
// or an older stage): still the final stop, from the newest checkpoint.
TEST(AfterRunTest, OnStopCancelEndsARunThatLostStagesDuringTheStopCancelled) {
  const Verdict v = AfterRun(Lost(), StoppedToCancel(0, 3));
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::CANCELLED);
  EXPECT_EQ(v.reason, absl::StrCat("the coordinator was stopped by a signal (--on-stop cancel) "
                                   "after step 5 (", Lost().reason, ")", kHint));
  // A failure that lost no stage stays a failure.
  RunOutcome bad = Lost({});
  bad.reason = "running stage 0 failed at step 6: bad frame";
  EXPECT_EQ(AfterRun(bad, StoppedToCancel(0, 3)).state, pb::JobStatus::FAILED);
}

TEST(AfterFailedRecoveryTest, StoppedByTheCoordinatorWithOnStopCancelIsCancelled) {
  const Verdict v = AfterFailedRecovery(absl::CancelledError("stopped while waiting for its "
                                                             "stages"),
                                        StoppedToCancel(1, 3));
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::CANCELLED);
  EXPECT_EQ(v.reason, absl::StrCat("the coordinator was stopped by a signal (--on-stop cancel) "
                                   "after step 5 (stopped while waiting for its stages)", kHint));
}

TEST(AfterFailedRecoveryTest, NoStagesInTimeFailsWithTheHint) {
  const Verdict v = AfterFailedRecovery(absl::UnavailableError("no free stage"), Facts(1, 3));
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::FAILED);
  EXPECT_EQ(v.reason, absl::StrCat("no free stage", kHint));
}

TEST(AfterFailedRecoveryTest, StoppedByTheUserIsCancelled) {
  JobFacts facts = Facts(1, 3);
  facts.cancel_requested = true;
  const Verdict v = AfterFailedRecovery(absl::CancelledError("stopped while recovering"), facts);
  EXPECT_EQ(v.action, Action::kEnd);
  EXPECT_EQ(v.state, pb::JobStatus::CANCELLED);
  EXPECT_EQ(v.reason, "stopped while recovering");
}

TEST(AfterFailedRecoveryTest, StoppedByTheCoordinatorIsLeftForTheNext) {
  JobFacts facts = Facts(1, 3);
  facts.coordinator_stopping = true;
  const Verdict v = AfterFailedRecovery(absl::UnavailableError("no free stage"), facts);
  EXPECT_EQ(v.action, Action::kLeaveForNextCoordinator);
  EXPECT_EQ(v.state, pb::JobStatus::RECOVERING);
  EXPECT_THAT(v.reason, HasSubstr("(after step 5; no free stage): a coordinator started on the "
                                  "same --state-dir continues it"));
}

TEST(MayResumeTest, WhileRestartsAreLeft) {
  EXPECT_TRUE(MayResume(Facts(0, 1)).ok());
  EXPECT_TRUE(MayResume(Facts(2, 3)).ok());
}

TEST(MayResumeTest, RestartsUsedUpIsResourceExhaustedWithTheirCount) {
  const absl::Status s = MayResume(Facts(3, 3));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(), "the coordinator restarted after 3 restarts (fault_tolerance.max_restarts)");
}

TEST(MayResumeTest, StoppedWhileWaitingIsCancelled) {
  JobFacts facts = Facts(0, 3);
  facts.coordinator_stopping = true;
  EXPECT_EQ(MayResume(facts).code(), absl::StatusCode::kCancelled);
  facts = Facts(3, 3);
  facts.cancel_requested = true;
  EXPECT_EQ(MayResume(facts).code(), absl::StatusCode::kCancelled) << "a stop comes first";
}

pb::JobStatus Stored(pb::JobStatus::State state, int max_restarts, int stages) {
  pb::JobStatus job;
  job.set_job_id("job-7");
  job.set_state(state);
  job.set_steps_done(5);
  job.set_checkpoint_dir("/s/ck/step-4");
  job.mutable_spec()->mutable_fault_tolerance()->set_max_restarts(max_restarts);
  for (int i = 0; i < stages; ++i) job.add_stage_addresses("h:1");
  return job;
}

TEST(AtCoordinatorStartTest, AQueuedJobQueuesAgainAndAnEndedOneStays) {
  EXPECT_EQ(AtCoordinatorStart(Stored(pb::JobStatus::QUEUED, 3, 0)).action,
            StoredJobVerdict::Action::kQueue);
  for (pb::JobStatus::State ended :
       {pb::JobStatus::SUCCEEDED, pb::JobStatus::FAILED, pb::JobStatus::CANCELLED}) {
    EXPECT_EQ(AtCoordinatorStart(Stored(ended, 3, 2)).action, StoredJobVerdict::Action::kKeep)
        << pb::JobStatus::State_Name(ended);
  }
}

TEST(AtCoordinatorStartTest, ARunningJobThatMayRestartIsResumedOnItsStages) {
  for (pb::JobStatus::State was : {pb::JobStatus::RUNNING, pb::JobStatus::RECOVERING}) {
    const StoredJobVerdict v = AtCoordinatorStart(Stored(was, 1, 2));
    EXPECT_EQ(v.action, StoredJobVerdict::Action::kResume) << pb::JobStatus::State_Name(was);
    EXPECT_EQ(v.reason, "the coordinator restarted while the job was running (after step 5): "
                        "waiting for its stages");
  }
}

TEST(AtCoordinatorStartTest, WithoutRestartsOrStagesARunningJobFailedWithTheHint) {
  const std::string reason =
      absl::StrCat("the coordinator stopped while the job was running (after step 5)", kHint);
  const StoredJobVerdict no_restarts = AtCoordinatorStart(Stored(pb::JobStatus::RUNNING, 0, 2));
  EXPECT_EQ(no_restarts.action, StoredJobVerdict::Action::kFail);
  EXPECT_EQ(no_restarts.reason, reason);
  const StoredJobVerdict no_stages = AtCoordinatorStart(Stored(pb::JobStatus::RUNNING, 3, 0));
  EXPECT_EQ(no_stages.action, StoredJobVerdict::Action::kFail);
  EXPECT_EQ(no_stages.reason, reason);
}

TEST(ResumeHintTest, NamesTheJobAndItsCheckpoint) {
  EXPECT_EQ(ResumeHint("job-7", "/s/ck/step-4"), kHint);
  EXPECT_EQ(ResumeHint("job-7", ""), "");
}

pb::JobSpec Layout(int stages, int replicas) {
  pb::JobSpec spec;
  spec.mutable_pipeline()->set_stages(stages);
  spec.mutable_pipeline()->set_replicas(replicas);
  return spec;
}

TEST(SpecForStageServersTest, AReplicatedJobKeepsItsPipelineOnFewerReplicas) {
  const pb::JobSpec spec = SpecForStageServers(Layout(2, 3), 4);
  EXPECT_EQ(spec.pipeline().stages(), 2);
  EXPECT_EQ(spec.pipeline().replicas(), 2);
}

TEST(SpecForStageServersTest, ASinglePipelineGoesOnFewerStages) {
  const pb::JobSpec spec = SpecForStageServers(Layout(4, 1), 3);
  EXPECT_EQ(spec.pipeline().stages(), 3);
  EXPECT_EQ(spec.pipeline().replicas(), 1);
}

TEST(SpecForStageServersTest, ReplicasThatNoLongerSplitTheStagesKeepTheirCount) {
  const pb::JobSpec spec = SpecForStageServers(Layout(3, 2), 4);
  EXPECT_EQ(spec.pipeline().stages(), 2);
  EXPECT_EQ(spec.pipeline().replicas(), 2);
}

}  // namespace
}  // namespace pipetrain::coordinator
