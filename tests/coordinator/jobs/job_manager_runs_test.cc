// A job's whole life in the job manager, in process, against fake stages
// (testing/fake_stages.h): a run to success with every step stored; a lost stage
// replaced (or the job continued on the survivors) with its steps keeping their numbers
// and losses; no restarts left, or used up; a stage's error; a cancel mid-run; a
// coordinator that stops mid-run leaving the job RECOVERING, and the next one on its
// state folder continuing it, or failing it when its restarts are used up (or, with
// --on-stop cancel, ending it CANCELLED), its stages held until then; a job started
// from a checkpoint of another precision saying so once, restarts included.
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/job_state.h"
#include "common/model/checkpoint_folder.h"
#include "coordinator/jobs/job_manager.h"
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
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

class JobDriverTest : public ::testing::Test {
 protected:
  JobDriverTest() {
    testing::WriteFileOrDie(dir_.File("corpus.txt"), testing::EnglishLikeCorpus());
    for (int i = 0; i < 3; ++i) fakes_->Add(Address(i));
  }

  // A, B, C: the stages register in this order, and a job takes the oldest free ones.
  static std::string Address(int i) { return absl::StrCat("10.0.0.", i + 1, ":7000"); }

  std::unique_ptr<JobManager> StartCoordinator(OnStop on_stop = OnStop::kRecover) {
    ManagerOptions options;
    options.state_dir = dir_.File("state");
    options.on_stop = on_stop;
    options.heartbeat_timeout = absl::Seconds(60);  // the fakes send no heartbeats
    options.heartbeat_interval = absl::Milliseconds(20);
    options.runner.connector = fakes_;
    options.runner.step_deadline = absl::Seconds(30);
    absl::StatusOr<std::unique_ptr<JobManager>> m = JobManager::Create(options);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? *std::move(m) : nullptr;
  }

  // A coordinator with stages 0 .. n-1 registered.
  std::unique_ptr<JobManager> StartWithStages(int n) {
    std::unique_ptr<JobManager> m = StartCoordinator();
    if (m != nullptr) for (int i = 0; i < n; ++i) Register(*m, i);
    return m;
  }

  static pb::RegisterStageResponse Register(JobManager& m, int i) {
    pb::RegisterStageRequest request;
    request.set_address(Address(i));
    request.mutable_device()->set_kind("cpu");
    request.mutable_device()->set_name("fake");
    request.mutable_device()->set_memory_bytes(uint64_t{1} << 30);
    absl::StatusOr<pb::RegisterStageResponse> r = m.RegisterStage(request);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.value_or(pb::RegisterStageResponse());
  }

  // What a heartbeat of the registered stage is answered as `held`.
  static bool Held(JobManager& m, const pb::RegisterStageResponse& stage) {
    pb::HeartbeatRequest beat;
    beat.set_stage_id(stage.stage_id());
    beat.set_registration_secret(stage.registration_secret());
    const pb::HeartbeatResponse answer = m.Heartbeat(beat);
    EXPECT_TRUE(answer.known()) << stage.stage_id();
    return answer.held();
  }

  std::string Submit(JobManager& m, const std::vector<std::string>& overrides = {}) {
    absl::StatusOr<pb::JobSpec> spec = testing::FakeJobSpec(dir_.File("corpus.txt"), overrides);
    EXPECT_TRUE(spec.ok()) << spec.status();
    absl::StatusOr<std::string> id = m.Submit(spec.value_or(pb::JobSpec()));
    EXPECT_TRUE(id.ok()) << id.status();
    return id.value_or("");
  }

  // Polls until `done` holds of the job's status (30 s at most).
  static pb::JobStatus WaitFor(JobManager& m, const std::string& id,
                               const std::function<bool(const pb::JobStatus&)>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    absl::StatusOr<pb::JobStatus> s;
    do {
      s = m.Get(id, /*history=*/false);
      if (s.ok() && done(*s)) return *s;
      absl::SleepFor(absl::Milliseconds(5));
    } while (absl::Now() < deadline);
    ADD_FAILURE() << "job " << id << " never got there: " << (s.ok() ? s->DebugString() : "");
    return s.value_or(pb::JobStatus());
  }
  static pb::JobStatus WaitForEnd(JobManager& m, const std::string& id) {
    return WaitFor(m, id, [](const pb::JobStatus& s) { return common::JobEnded(s.state()); });
  }

  static void WaitUntil(const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (!done() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
    ASSERT_TRUE(done());
  }

  // The steps stored for the job, their numbers and losses checked against an unbroken
  // run: each ran once, on the state of the steps before it.
  static void ExpectEveryStepOnceUnbroken(JobManager& m, const std::string& id, int64_t steps) {
    absl::StatusOr<pb::JobStatus> s = m.Get(id, /*history=*/true);
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<int64_t> numbers;
    for (const pb::StepRecord& r : s->history()) {
      numbers.push_back(r.step());
      EXPECT_DOUBLE_EQ(r.loss(), FakeStages::LossAfter(r.step() - 1)) << "step " << r.step();
    }
    std::vector<int64_t> want;
    for (int64_t i = 1; i <= steps; ++i) want.push_back(i);
    EXPECT_EQ(numbers, want);
  }

  static std::string Logs(JobManager& m, const std::string& id) {
    std::vector<std::string> lines;
    absl::Status s = m.Watch(id, 0, /*no_follow=*/true, [&](const pb::JobEvent& e) {
      if (e.has_log()) lines.push_back(e.log().text());
      return true;
    });
    EXPECT_TRUE(s.ok()) << s;
    return absl::StrJoin(lines, "\n");
  }

  static pb::StageInfo::State StageState(JobManager& m, const std::string& stage_id) {
    const pb::ClusterStatus cluster = m.Cluster();
    for (const pb::StageInfo& s : cluster.stages()) {
      if (s.stage_id() == stage_id) return s.state();
    }
    return pb::StageInfo::STATE_UNSPECIFIED;
  }

  // Stops `m` while the job is inside a step that stage A holds until the stop has
  // begun (a watcher of the job sees it first): the job then stops after that step.
  void StopDuringStep(std::unique_ptr<JobManager>& m, const std::string& id,
                      std::atomic<bool>& stop_seen) {
    WaitUntil([&] { return fakes_->Holding(Address(0)); });
    std::thread watcher([&] {
      absl::Status s = m->Watch(id, 0, false, [](const pb::JobEvent&) { return true; });
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
      stop_seen = true;
    });
    m->Shutdown();
    watcher.join();
  }

  TempDir dir_;
  std::shared_ptr<FakeStages> fakes_ = std::make_shared<FakeStages>();
};

TEST_F(JobDriverTest, RunsAJobToSuccessAndStoresEveryStep) {
  std::unique_ptr<JobManager> m = StartWithStages(2);
  ASSERT_NE(m, nullptr);
  const std::string id = Submit(*m);
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::SUCCEEDED) << s.reason();
  EXPECT_EQ(s.steps_done(), 6);
  EXPECT_EQ(s.first_step(), 1);
  EXPECT_THAT(s.stage_addresses(), ElementsAre(Address(0), Address(1)));
  EXPECT_EQ(s.checkpoint_dir(), dir_.File(absl::StrCat("state/checkpoints/", id, "/step-6")));
  EXPECT_EQ(s.recoveries_size(), 0);
  ExpectEveryStepOnceUnbroken(*m, id, 6);
  EXPECT_THAT(Logs(*m, id), HasSubstr("checkpoint of step 4 written to"));
  EXPECT_THAT(testing::ListFolder(dir_.File(absl::StrCat("state/tensorboard/", id))),
              Not(IsEmpty()));
  EXPECT_EQ(StageState(*m, "stage-1"), pb::StageInfo::IDLE) << "freed when the job ended";
}

TEST_F(JobDriverTest, ALostStageIsReplacedAndTheStepsKeepTheirNumbersAndLosses) {
  std::unique_ptr<JobManager> m = StartWithStages(3);
  ASSERT_NE(m, nullptr);
  fakes_->DieAtStep(Address(1), 4);
  const std::string id = Submit(*m, {"fault_tolerance.max_restarts=1"});
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::SUCCEEDED) << s.reason();
  ASSERT_EQ(s.recoveries_size(), 1);
  const pb::Recovery& r = s.recoveries(0);
  EXPECT_THAT(r.lost_stage_ids(), ElementsAre("stage-2"));
  EXPECT_EQ(r.failed_step(), 4);
  EXPECT_EQ(r.restored_step(), 3) << "the newest snapshot every stage's state is in";
  EXPECT_EQ(r.source(), "the stages' snapshots");
  EXPECT_TRUE(r.has_continued());
  EXPECT_THAT(s.stage_addresses(), ElementsAre(Address(0), Address(2)));
  ExpectEveryStepOnceUnbroken(*m, id, 6);
  EXPECT_THAT(fakes_->Calls(Address(2)), Contains("ImportChunk 0 step 3"));
  EXPECT_THAT(fakes_->Updates(Address(2)), ElementsAre(6));
  const std::string logs = Logs(*m, id);
  EXPECT_THAT(logs, HasSubstr("stage 1 (stage-2 at 10.0.0.2:7000) stopped answering at step 4"));
  EXPECT_THAT(logs, HasSubstr("stage-2 lost at step 4: restarting from step 3 on"));
  EXPECT_THAT(logs, HasSubstr("(restart 1 of 1; from the stages' snapshots)"));
  EXPECT_EQ(StageState(*m, "stage-2"), pb::StageInfo::LOST);
}

// A bf16 job started from an fp32 job's checkpoint says so in its log (what `pipetrain
// logs` shows) once, also when a lost stage restarts it from the stages' snapshots (which
// are of the bf16 run), and its checkpoints say bf16.
TEST_F(JobDriverTest, APrecisionChangeFromACheckpointIsLoggedOnceAcrossARestart) {
  std::unique_ptr<JobManager> m = StartWithStages(3);
  ASSERT_NE(m, nullptr);
  const pb::JobStatus fp32 = WaitForEnd(*m, Submit(*m));
  ASSERT_EQ(fp32.state(), pb::JobStatus::SUCCEEDED) << fp32.reason();
  fakes_->DieAtStep(Address(1), 9);
  const std::string id = Submit(*m, {"training.precision=bf16", "fault_tolerance.max_restarts=1",
                                     "init_from=" + fp32.checkpoint_dir()});
  const pb::JobStatus s = WaitForEnd(*m, id);
  ASSERT_EQ(s.state(), pb::JobStatus::SUCCEEDED) << s.reason();
  ASSERT_EQ(s.recoveries_size(), 1);
  EXPECT_EQ(s.recoveries(0).source(), "the stages' snapshots");
  const std::vector<std::string> lines = absl::StrSplit(Logs(*m, id), '\n');
  std::vector<std::string> said;
  for (const std::string& line : lines) {
    if (absl::StrContains(line, "trained in")) said.push_back(line);
  }
  EXPECT_THAT(said, ElementsAre(absl::StrCat(
                        "job ", id, " trains in bf16 from init_from '", fp32.checkpoint_dir(),
                        "', which was trained in fp32: its fp32 master weights and AdamW "
                        "moments are carried over unchanged")));
  absl::StatusOr<model::Checkpoint> last = model::LoadWholeCheckpoint(s.checkpoint_dir(), "test");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->precision, "bf16");
}

TEST_F(JobDriverTest, WithNoFreeStageTheJobGoesOnOnTheSurvivors) {
  std::unique_ptr<JobManager> m = StartWithStages(2);
  ASSERT_NE(m, nullptr);
  fakes_->DieAtStep(Address(1), 3);
  const std::string id = Submit(*m);
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::SUCCEEDED) << s.reason();
  ASSERT_EQ(s.recoveries_size(), 1);
  EXPECT_EQ(s.recoveries(0).stages(), 1);
  EXPECT_EQ(s.recoveries(0).restored_step(), 2);
  EXPECT_THAT(s.stage_addresses(), ElementsAre(Address(0)));
  ExpectEveryStepOnceUnbroken(*m, id, 6);
}

TEST_F(JobDriverTest, WithoutRestartsALostStageFailsTheJobWithTheResumeHint) {
  std::unique_ptr<JobManager> m = StartWithStages(3);
  ASSERT_NE(m, nullptr);
  fakes_->DieAtStep(Address(1), 4);
  const std::string id = Submit(*m, {"fault_tolerance.max_restarts=0"});
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::FAILED);
  EXPECT_THAT(s.reason(), HasSubstr("stage 1 (stage-2 at 10.0.0.2:7000) stopped answering at "
                                    "step 4"));
  EXPECT_THAT(s.reason(), HasSubstr(absl::StrCat(
                              "; continue it with 'pipetrain resume ", id, "' (from ",
                              dir_.File(absl::StrCat("state/checkpoints/", id, "/step-2")), ")")));
  EXPECT_THAT(s.reason(), Not(HasSubstr("max_restarts")));
  EXPECT_EQ(s.recoveries_size(), 0);
  EXPECT_EQ(s.steps_done(), 3);
  EXPECT_THAT(fakes_->Calls(Address(2)), IsEmpty()) << "no replacement was asked";
  EXPECT_EQ(StageState(*m, "stage-2"), pb::StageInfo::LOST);
  EXPECT_EQ(StageState(*m, "stage-1"), pb::StageInfo::IDLE);
}

TEST_F(JobDriverTest, RestartsUsedUpFailTheJobSayingHowMany) {
  std::unique_ptr<JobManager> m = StartWithStages(3);
  ASSERT_NE(m, nullptr);
  fakes_->DieAtStep(Address(1), 3);
  fakes_->DieAtStep(Address(2), 5);  // the replacement dies too
  const std::string id = Submit(*m, {"fault_tolerance.max_restarts=1"});
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::FAILED);
  EXPECT_THAT(s.reason(), HasSubstr("stage 1 (stage-3 at 10.0.0.3:7000) stopped answering at "
                                    "step 5 ("));
  EXPECT_THAT(s.reason(), HasSubstr("(after 1 restart, fault_tolerance.max_restarts); continue "
                                    "it with 'pipetrain resume"));
  EXPECT_EQ(s.recoveries_size(), 1);
  EXPECT_EQ(s.steps_done(), 4);
}

TEST_F(JobDriverTest, AStagesErrorFailsTheJobWithoutARestart) {
  std::unique_ptr<JobManager> m = StartWithStages(2);
  ASSERT_NE(m, nullptr);
  fakes_->FailAtStep(Address(0), 2, absl::InvalidArgumentError("frame of the wrong shape"));
  const std::string id = Submit(*m, {"fault_tolerance.max_restarts=3"});
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::FAILED);
  EXPECT_THAT(s.reason(), HasSubstr("running stage 0 (stage-1 at 10.0.0.1:7000) failed at step "
                                    "2: frame of the wrong shape"));
  EXPECT_THAT(s.reason(), Not(HasSubstr("pipetrain resume"))) << "no checkpoint yet";
  EXPECT_EQ(s.recoveries_size(), 0);
  EXPECT_EQ(StageState(*m, "stage-1"), pb::StageInfo::IDLE);
}

TEST_F(JobDriverTest, ACancelMidRunEndsTheJobCancelledWithACheckpoint) {
  std::unique_ptr<JobManager> m = StartWithStages(2);
  ASSERT_NE(m, nullptr);
  std::atomic<bool> cancelled{false};
  fakes_->HoldAtStep(Address(0), 3, [&] { return cancelled.load(); });
  const std::string id = Submit(*m);
  WaitUntil([&] { return fakes_->Holding(Address(0)); });
  absl::StatusOr<pb::JobStatus> asked = m->Cancel(id);
  ASSERT_TRUE(asked.ok()) << asked.status();
  EXPECT_EQ(asked->reason(), "cancelling: stops after the current step, with a checkpoint");
  cancelled = true;
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::CANCELLED);
  EXPECT_EQ(s.reason(), "cancelled before step 4");
  EXPECT_EQ(s.steps_done(), 3);
  EXPECT_THAT(s.checkpoint_dir(), EndsWith("/step-3"));
  EXPECT_THAT(fakes_->StepsRun(Address(0)), ElementsAre(1, 2, 3));
}

TEST_F(JobDriverTest, ACoordinatorStopLeavesTheJobRecoveringAndTheNextContinuesIt) {
  std::unique_ptr<JobManager> m = StartWithStages(2);
  ASSERT_NE(m, nullptr);
  std::atomic<bool> stop_seen{false};
  fakes_->HoldAtStep(Address(0), 3, [&] { return stop_seen.load(); });
  const std::string id = Submit(*m, {"fault_tolerance.max_restarts=1"});
  StopDuringStep(m, id, stop_seen);
  absl::StatusOr<pb::JobStatus> left = m->Get(id, false);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->state(), pb::JobStatus::RECOVERING);
  EXPECT_EQ(left->reason(),
            "the coordinator stopped while the job was running (after step 3; cancelled before "
            "step 4): a coordinator started on the same --state-dir continues it");
  m.reset();

  m = StartWithStages(2);  // its stages come back
  ASSERT_NE(m, nullptr);
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::SUCCEEDED) << s.reason();
  ASSERT_EQ(s.recoveries_size(), 1);
  EXPECT_EQ(s.recoveries(0).restored_step(), 3);
  EXPECT_EQ(s.recoveries(0).source(), "the stages' snapshots");
  EXPECT_THAT(s.stage_addresses(), ElementsAre(Address(0), Address(1)));
  ExpectEveryStepOnceUnbroken(*m, id, 6);
  EXPECT_THAT(Logs(*m, id), HasSubstr("the coordinator restarted: continuing from the newest "
                                      "state its 2 of 2 stages that registered again hold"));
}

// --on-stop cancel (scancel): the stop is final. The heartbeats of the job's stages say
// `held` until the job has its checkpoint and is recorded, so stages signalled with the
// coordinator serve until then.
TEST_F(JobDriverTest, ACoordinatorStopWithOnStopCancelEndsTheJobCancelledWithItsCheckpoint) {
  std::unique_ptr<JobManager> m = StartCoordinator(OnStop::kCancel);
  ASSERT_NE(m, nullptr);
  std::vector<pb::RegisterStageResponse> stages;
  for (int i = 0; i < 3; ++i) stages.push_back(Register(*m, i));
  EXPECT_FALSE(Held(*m, stages[0]));
  std::atomic<bool> stop_seen{false};
  fakes_->HoldAtStep(Address(0), 3, [&] { return stop_seen.load(); });
  const std::string id = Submit(*m, {"fault_tolerance.max_restarts=3"});
  WaitUntil([&] { return fakes_->Holding(Address(0)); });
  EXPECT_TRUE(Held(*m, stages[0]));
  EXPECT_TRUE(Held(*m, stages[1]));
  EXPECT_FALSE(Held(*m, stages[2])) << "no job holds the third stage";
  StopDuringStep(m, id, stop_seen);
  absl::StatusOr<pb::JobStatus> left = m->Get(id, false);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->state(), pb::JobStatus::CANCELLED);
  EXPECT_EQ(left->steps_done(), 3);
  EXPECT_THAT(left->checkpoint_dir(), EndsWith("/step-3"));
  EXPECT_EQ(left->reason(),
            absl::StrCat("the coordinator was stopped by a signal (--on-stop cancel) after step 3 "
                         "(cancelled before step 4); continue it with 'pipetrain resume ", id,
                         "' (from ", left->checkpoint_dir(), ")"));
  EXPECT_FALSE(Held(*m, stages[0]));
  EXPECT_FALSE(Held(*m, stages[1]));
  m.reset();

  m = StartWithStages(2);  // the next coordinator keeps it as it ended
  ASSERT_NE(m, nullptr);
  absl::SleepFor(absl::Milliseconds(200));
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::CANCELLED);
  EXPECT_EQ(s.recoveries_size(), 0);
  EXPECT_THAT(fakes_->StepsRun(Address(0)), ElementsAre(1, 2, 3));
}

TEST_F(JobDriverTest, ARestartedCoordinatorFailsAJobWhoseRestartsAreUsedUp) {
  std::unique_ptr<JobManager> m = StartWithStages(3);
  ASSERT_NE(m, nullptr);
  fakes_->DieAtStep(Address(1), 2);  // restart 1 of 1, on A and C
  std::atomic<bool> stop_seen{false};
  fakes_->HoldAtStep(Address(0), 4, [&] { return stop_seen.load(); });
  const std::string id = Submit(*m, {"fault_tolerance.max_restarts=1"});
  StopDuringStep(m, id, stop_seen);
  absl::StatusOr<pb::JobStatus> left = m->Get(id, false);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->state(), pb::JobStatus::RECOVERING) << "a stop is no lost stage";
  m.reset();

  m = StartCoordinator();
  ASSERT_NE(m, nullptr);
  Register(*m, 0);
  Register(*m, 2);
  const pb::JobStatus s = WaitForEnd(*m, id);
  EXPECT_EQ(s.state(), pb::JobStatus::FAILED);
  EXPECT_THAT(s.reason(), HasSubstr(absl::StrCat(
                              "the coordinator restarted after 1 restarts "
                              "(fault_tolerance.max_restarts); continue it with 'pipetrain "
                              "resume ", id, "'")));
  EXPECT_THAT(s.reason(), HasSubstr("/step-4)"));
  ExpectEveryStepOnceUnbroken(*m, id, 4);
}

}  // namespace
}  // namespace pipetrain::coordinator
