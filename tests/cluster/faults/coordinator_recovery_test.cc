// End to end, automatic recovery: real coordinator, stage and CLI processes
// on loopback. A stage killed or frozen mid-job is replaced by a free one, or the job
// continues on the survivors, or waits for a stage (taking the lost one back when it
// returns), and every case ends as the uninterrupted run would have: the same loss at
// every step. A job that cannot recover fails naming its checkpoint; one cancelled while
// recovering ends CANCELLED (coordinator_faults_test.cc: max_restarts 0 fails at once).
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/job_state.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/loss_comparison.h"
#include "tests/testing/tolerance.h"
#include "tests/testing/temp_files.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::JsonInt;
using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::LocalClusterOptions;
using ::pipetrain::testing::Losses;
using ::pipetrain::testing::LossesMatch;
using ::testing::HasSubstr;

// Same layout: the same arithmetic in the same order, so the same bits.
constexpr double kSameLayout = testing::kSameArithmetic;
// Another number of stages: every layer still does its arithmetic in its order, so the
// same bits; only a clipping norm is summed grouped by stage (in double), which moves the
// float clip factor about once in 10^9 steps (executor_test.cc).
constexpr double kOtherLayout = testing::kSameArithmetic;

// Whether `job_dir` holds a checkpoint folder step-N with N >= `step` (an older one may
// be gone already when retention keeps only the newest).
bool HasCheckpointFrom(const std::filesystem::path& job_dir, int64_t step) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(job_dir, ec)) {
    const std::string name = e.path().filename().string();
    int64_t n = 0;
    if (absl::StartsWith(name, "step-") && absl::SimpleAtoi(name.substr(5), &n) && n >= step) {
      return true;
    }
  }
  return false;
}

class CoordinatorRecoveryTest : public testing::ClusterJobTest {
 protected:
  static constexpr int kSteps = 300;  // about 3 s: long enough to kill a stage mid-run

  CoordinatorRecoveryTest() {
    spec_["training"]["steps"] = kSteps;
    spec_["data"]["validate_every_steps"] = 0;
    spec_["checkpoint"]["every_steps"] = 0;
    spec_["pipeline"]["schedule"] = "1f1b";
  }

  // Every process's log so far, for the message of a failed expectation.
  static std::string ProcessLogs(const LocalCluster& c) {
    return "\ncoordinator: " + c.coordinator_log() + c.stage_logs();
  }
  static bool Recovered(const json& s) { return !s.value("recoveries", json::array()).empty(); }

  // Waits until the job has done `steps` steps and kills stage `position` of it.
  std::string KillAt(LocalCluster& c, const std::string& id, int64_t steps, int position) {
    const json s = WaitFor(c, id, [&](const json& j) { return JsonInt(j, "steps_done") >= steps; });
    const std::string victim = s["stage_ids"][position];
    EXPECT_TRUE(c.KillStage(StageAddress(c, victim))) << victim;
    return victim;
  }

  // The uninterrupted run's losses, from a job run to its end on `stages` stages.
  std::vector<double> Reference(LocalCluster& c, int stages) {
    const std::string id = SubmitAndFollow(c, {absl::StrCat("pipeline.stages=", stages)});
    const json s = Status(c, id);
    EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
    return Losses(s);
  }

  // A per-stage memory the job's model fits on `fits` stages of but not on `fits - 1`.
  uint64_t MemoryBetween(int fits) {
    auto parsed = coordinator::ParseJobSpec(spec_.dump());
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    double peak[2] = {0, 0};
    for (int i = 0; i < 2; ++i) {
      pipetrain::v1::JobSpec spec = coordinator::WithDefaults(*parsed);
      spec.mutable_pipeline()->set_stages(fits - i);
      auto po = planner::OptionsFromJobSpec(spec);
      EXPECT_TRUE(po.ok()) << po.status();
      auto plan = planner::MakePlan(*po);
      EXPECT_TRUE(plan.ok()) << plan.status();
      for (const auto& st : plan->stages) {
        peak[i] = std::max(peak[i], st.peak_memory_bytes());
      }
    }
    EXPECT_LT(peak[0], peak[1]);
    return static_cast<uint64_t>((peak[0] + peak[1]) / 2);
  }
};

TEST_F(CoordinatorRecoveryTest, AKilledStageIsReplacedByAFreeOneAndEveryLossIsTheSame) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 3);
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));

  const std::string id = SubmitNoWait(c, {"pipeline.stages=3"});
  const std::string victim = KillAt(c, id, 5, 1);
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done["recoveries"].size(), 1u) << done.dump() << ProcessLogs(c);
  const json& r = done["recoveries"][0];
  EXPECT_EQ(r["lost_stage_ids"][0], victim);
  EXPECT_EQ(r["stages"], 3) << "a free stage took the lost one's place";
  EXPECT_EQ(r["replicas"], 1);
  EXPECT_GE(JsonInt(r, "failed_step"), 6);
  // From the snapshots: the step before the lost one, or (when the lost stage's newest
  // copy was still on its way to its neighbour) the one before that.
  EXPECT_EQ(r["source"], "the stages' snapshots");
  EXPECT_GE(JsonInt(r, "restored_step"), JsonInt(r, "failed_step") - 2);
  EXPECT_EQ(JsonInt(done, "steps_done"), kSteps);
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
  EXPECT_THAT(done["stage_ids"].dump(), ::testing::Not(HasSubstr(victim)));
  auto status = c.Cli({"status", id});
  ASSERT_TRUE(status.ok());
  EXPECT_THAT(status->out, HasSubstr(victim + " lost at step"));
  EXPECT_THAT(status->out, HasSubstr("(the stages' snapshots) on 3 stages"));
}

TEST_F(CoordinatorRecoveryTest, WithoutAFreeStageTheJobContinuesOnTheSurvivors) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 3);

  const std::string id = SubmitNoWait(c, {"pipeline.stages=3"});
  KillAt(c, id, 4, 2);
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done["recoveries"].size(), 1u) << done.dump() << ProcessLogs(c);
  EXPECT_EQ(done["recoveries"][0]["stages"], 2);
  EXPECT_EQ(done["stage_ids"].size(), 2u);
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kOtherLayout));
}

TEST_F(CoordinatorRecoveryTest, WithSnapshotsOffItContinuesFromTheNewestCheckpoint) {
  spec_["checkpoint"]["every_steps"] = 4;
  spec_["checkpoint"]["snapshot_every_steps"] = 0;
  auto cluster = LocalCluster::Start(dir_.File("state"), 3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 2);

  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  KillAt(c, id, 9, 0);
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done["recoveries"].size(), 1u) << done.dump() << ProcessLogs(c);
  const json& r = done["recoveries"][0];
  EXPECT_THAT(r["source"].get<std::string>(), HasSubstr("checkpoint"));
  const int64_t restored = JsonInt(r, "restored_step");
  EXPECT_EQ(restored % 4, 0);
  EXPECT_GE(restored, 8);
  EXPECT_LT(restored, JsonInt(r, "failed_step"));
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
  EXPECT_THAT(done["checkpoint_dir"].get<std::string>(), HasSubstr(absl::StrCat("step-", kSteps)));
}

// With a checkpoint after every step the kill most often lands while one is written:
// the failed checkpoint is the loss (one restart), and the survivor, whose next step
// waited for its lost neighbour, is configured again rather than lost too.
TEST_F(CoordinatorRecoveryTest, AStageKilledWhileACheckpointIsWrittenIsOneRestart) {
  spec_["checkpoint"]["every_steps"] = 1;
  spec_["checkpoint"]["snapshot_every_steps"] = 0;
  spec_["training"]["steps"] = 60;
  auto cluster = LocalCluster::Start(dir_.File("state"), 3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 2);

  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  const std::string victim = KillAt(c, id, 9, 0);
  const json after_kill = Status(c, id);
  if (testing::JobHasEnded(after_kill) && after_kill.value("recoveries", json::array()).empty()) {
    GTEST_SKIP() << "the job's 60 steps ended before the kill reached it (the machine was too "
                    "slow for this test): "
                 << JsonInt(after_kill, "steps_done") << " steps done";
  }
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done["recoveries"].size(), 1u) << done.dump() << ProcessLogs(c);
  const json& r = done["recoveries"][0];
  EXPECT_EQ(r["lost_stage_ids"].size(), 1u) << r.dump();
  EXPECT_EQ(r["lost_stage_ids"][0], victim);
  EXPECT_EQ(r["stages"], 2) << "the free stage took the lost one's place";
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
}

TEST_F(CoordinatorRecoveryTest, TwoStagesLostAtOnceStillEndAsTheUninterruptedRun) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 3);

  const std::string id = SubmitNoWait(c, {"pipeline.stages=3"});
  const json s = WaitFor(c, id, [](const json& j) { return JsonInt(j, "steps_done") >= 4; });
  for (int position : {1, 2}) {
    ASSERT_TRUE(c.KillStage(StageAddress(c, s["stage_ids"][position])));
  }
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  EXPECT_EQ(done["stage_ids"].size(), 1u) << done.dump();
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kOtherLayout));
}

// The survivors cannot hold the model: the job waits for a stage, and the lost one
// restarted on its address is taken back.
TEST_F(CoordinatorRecoveryTest, ItWaitsForAStageAndTakesTheLostOneBackWhenItReturns) {
  LocalClusterOptions options;
  options.stage_args = {"--memory-limit", absl::StrCat(MemoryBetween(2))};
  auto cluster = LocalCluster::Start(dir_.File("state"), 2, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 2);

  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  const std::string victim = KillAt(c, id, 4, 1);
  WaitFor(c, id, [](const json& j) { return j["state"] == "RECOVERING"; });
  ASSERT_TRUE(c.RestartStage(StageAddress(c, victim)).ok());
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done["recoveries"].size(), 1u) << done.dump() << ProcessLogs(c);
  EXPECT_EQ(done["recoveries"][0]["stages"], 2);
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
  auto logs = c.Cli({"logs", id});
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(logs->out, HasSubstr("waiting up to"));
  EXPECT_THAT(logs->out, HasSubstr(victim + " lost at step"));
}

TEST_F(CoordinatorRecoveryTest, ACancelWhileRecoveringEndsTheJobCancelled) {
  LocalClusterOptions options;
  options.stage_args = {"--memory-limit", absl::StrCat(MemoryBetween(2))};
  auto cluster = LocalCluster::Start(dir_.File("state"), 2, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  KillAt(c, id, 4, 0);
  WaitFor(c, id, [](const json& j) { return j["state"] == "RECOVERING"; });
  auto listed = c.Cli({"list"});
  ASSERT_TRUE(listed.ok());
  EXPECT_THAT(listed->out, HasSubstr("RECOVERING"));
  ASSERT_EQ(c.Cli({"cancel", id})->exit_code, 0);
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "CANCELLED") << done.dump();
}

TEST_F(CoordinatorRecoveryTest, AfterMaxRestartsTheJobFailsNamingItsCheckpoint) {
  spec_["training"]["steps"] = 100000;
  spec_["checkpoint"]["every_steps"] = 2;
  spec_["fault_tolerance"]["max_restarts"] = 1;
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  KillAt(c, id, 3, 0);
  WaitFor(c, id, [](const json& j) { return Recovered(j) && j["state"] == "RUNNING"; });
  const json before = Status(c, id);
  KillAt(c, id, JsonInt(before, "steps_done") + 2, 1);
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "FAILED") << done.dump();
  const std::string reason = done["reason"];
  EXPECT_THAT(reason, HasSubstr("max_restarts"));
  EXPECT_THAT(reason, HasSubstr("pipetrain resume " + id));
}

// A checkpoint every step: the kill lands during (or between) the checkpoints'
// exports and writes; the job restores the newest complete one or the snapshots. The job
// is long enough (about 25 ms a step here) that the kill, which follows a status poll
// and a `cluster` call after step 5, lands before it ends: with 60 steps (1.4 s) it came
// after the end in 2 of 4 runs on an idle machine.
TEST_F(CoordinatorRecoveryTest, AStageKilledWhileCheckpointsAreWrittenEveryStep) {
  spec_["checkpoint"]["every_steps"] = 1;
  spec_["training"]["steps"] = 200;
  auto cluster = LocalCluster::Start(dir_.File("state"), 3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 2);
  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  KillAt(c, id, 5, 1);
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  EXPECT_EQ(done.value("recoveries", json::array()).size(), 1u) << done.dump() << ProcessLogs(c);
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
}

// Data-parallel replicas: a stage of one replica lost (its copies wait in their gradient
// reduction until the coordinator breaks the step off) is replaced like any other, and
// the job ends with the uninterrupted run's losses. The copies split the optimizer (the
// default), so the lost copy's moments come from the copy of its snapshot another stage
// held, joined with the other replica's: its ring neighbour's with K = 2, the next
// replica's with K = 1 (a one-stage pipeline's snapshots go round the replicas).
class ReplicaRecoveryTest : public CoordinatorRecoveryTest,
                            public ::testing::WithParamInterface<int> {};

TEST_P(ReplicaRecoveryTest, AReplicasLostStageIsReplacedAndTheLossesStayTheSame) {
  const int k = GetParam();
  auto cluster = LocalCluster::Start(dir_.File("state"), 2 * k + 1);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // The same layout uninterrupted: the same sums in the same order (over 300 steps a
  // one-stage run's float rounding would drift from it).
  const std::vector<std::string> layout = {"pipeline.replicas=2",
                                           absl::StrCat("pipeline.stages=", k),
                                           "pipeline.micro_batches=2"};
  const std::vector<double> expected = Losses(Status(c, SubmitAndFollow(c, layout)));
  const std::string id = SubmitNoWait(c, layout);
  KillAt(c, id, 5, 2 * k - 1);  // replica 1's last stage
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done.value("recoveries", json::array()).size(), 1u) << done.dump();
  EXPECT_EQ(done["recoveries"][0]["replicas"], 2) << "the free stage took the lost one's place";
  EXPECT_EQ(done["recoveries"][0]["source"], "the stages' snapshots") << done.dump();
  EXPECT_EQ(done["stage_ids"].size(), static_cast<size_t>(2 * k));
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
}

INSTANTIATE_TEST_SUITE_P(Stages, ReplicaRecoveryTest, ::testing::Values(1, 2),
                         [](const auto& info) { return absl::StrCat("K", info.param); });

// Data-parallel replicas with no free stage to take a lost one's place: the replica that
// lost nothing goes on alone (1 of 2) rather than waiting, the lost replica's surviving
// stage is freed, and the losses are one pipeline's of the same K (which sequences a
// step takes depends only on the seed and the step, not on R).
//
// Another R sums the gradients in another order, and over many steps the float rounding
// of two such runs drifts apart (RegroupedTolerances bounds it to first order, which
// over hundreds of steps no longer holds): the first kCompared steps, the restart among
// them, are compared; the job runs its usual 300 steps so that the kill surely lands
// mid-run.
TEST_F(CoordinatorRecoveryTest, WithoutAFreeStageTheReplicaThatLostNothingGoesOnAlone) {
  constexpr size_t kCompared = 40;
  spec_["checkpoint"]["every_steps"] = 4;
  spec_["fault_tolerance"]["wait_for_stages_s"] = 120;  // a wait would outlast WaitFor
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected =
      Losses(Status(c, SubmitAndFollow(c, {"pipeline.stages=2", "pipeline.micro_batches=2"})));
  ASSERT_EQ(expected.size(), static_cast<size_t>(kSteps));

  // As soon as the job's step-4 (or a later) checkpoint is on disk (before its submit has even
  // returned: the job is that fast) every stage is frozen, so that the job advances no
  // further while replica 1's last stage is found and killed; then the others go on.
  std::map<std::string, std::string> address;
  for (int i = 1; i <= 4; ++i) {
    const std::string stage = absl::StrCat("stage-", i);
    address[stage] = StageAddress(c, stage);
  }
  const std::filesystem::path checkpoints = dir_.File("state/checkpoints");
  std::set<std::string> before;
  for (const auto& e : std::filesystem::directory_iterator(checkpoints)) before.insert(e.path().string());
  std::thread freezer([&] {
    for (const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
         std::chrono::steady_clock::now() < end;) {
      std::error_code ec;
      for (const auto& e : std::filesystem::directory_iterator(checkpoints, ec)) {
        if (before.count(e.path().string()) == 0 && HasCheckpointFrom(e.path(), 4)) {
          for (const auto& [stage, at] : address) c.SignalStage(at, SIGSTOP);
          return;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  const std::string id = SubmitNoWait(
      c, {"pipeline.replicas=2", "pipeline.stages=2", "pipeline.micro_batches=2"});
  freezer.join();
  const json running = Status(c, id);
  ASSERT_EQ(running["stage_ids"].size(), 4u) << running.dump();
  const std::string victim = running["stage_ids"][3];
  ASSERT_TRUE(c.KillStage(address[victim])) << victim;
  for (const auto& [stage, at] : address) {
    if (stage != victim) {
      ASSERT_TRUE(c.SignalStage(at, SIGCONT)) << stage;
    }
  }
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done.value("recoveries", json::array()).size(), 1u)
      << done.dump() << ProcessLogs(c);
  const json& r = done["recoveries"][0];
  EXPECT_EQ(r["lost_stage_ids"][0], victim);
  EXPECT_EQ(r["stages"], 2) << "one replica of 2 stages";
  EXPECT_EQ(r["replicas"], 1);
  EXPECT_LT(JsonInt(r, "restored_step"), JsonInt(r, "failed_step"));
  EXPECT_GE(JsonInt(r, "restored_step"), 3);
  // Replica 0's stages, in their places.
  ASSERT_EQ(done["stage_ids"].size(), 2u) << done.dump();
  EXPECT_EQ(done["stage_ids"][0], running["stage_ids"][0]);
  EXPECT_EQ(done["stage_ids"][1], running["stage_ids"][1]);
  EXPECT_EQ(JsonInt(done, "steps_done"), kSteps);
  const std::vector<double> losses = Losses(Status(c, id));
  ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(JsonInt(r, "failed_step"), static_cast<int64_t>(kCompared)) << "the restart is compared";
  const std::vector<double> compared(expected.begin(), expected.begin() + kCompared);
  EXPECT_TRUE(LossesMatch({losses.begin(), losses.begin() + kCompared}, compared,
                          RegroupedTolerances(compared)));
  auto logs = c.Cli({"logs", id});
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(logs->out, HasSubstr(victim + " lost at step"));
  EXPECT_THAT(logs->out, HasSubstr("on 1 replica of 2 stages (restart 1 of"));
  EXPECT_THAT(logs->out, HasSubstr(absl::StrCat("freed ", running["stage_ids"][2].get<std::string>())));
  EXPECT_THAT(logs->out, ::testing::Not(HasSubstr("waiting up to")));
  auto status = c.Cli({"status", id});
  ASSERT_TRUE(status.ok());
  EXPECT_THAT(status->out, HasSubstr(") on 1 replica of 2 stages"));
}

// With global-norm clipping the optimizer waits for ApplyOptimizer (and the snapshot is
// taken after it): a stage lost then still ends as the uninterrupted run.
TEST_F(CoordinatorRecoveryTest, WithGradientClippingALostStageStillGivesTheSameLosses) {
  spec_["training"]["grad_clip_norm"] = 0.5;
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 3);
  const std::string id = SubmitNoWait(c, {"pipeline.stages=3"});
  KillAt(c, id, 5, 0);
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  EXPECT_EQ(done.value("recoveries", json::array()).size(), 1u) << done.dump() << ProcessLogs(c);
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
}

// A stage lost again as soon as the job has restarted (during or right after the
// recovery) costs one more restart, and the job still ends as the uninterrupted run.
TEST_F(CoordinatorRecoveryTest, AStageLostDuringTheRecoveryCostsOneMoreRestart) {
  // Two kills, each after a status poll: on a loaded machine a poll can lag the job by
  // seconds (the first kill once landed at step 139 of 300, the second after the end), so
  // this job runs longer than the others.
  spec_["training"]["steps"] = 3 * kSteps;
  auto cluster = LocalCluster::Start(dir_.File("state"), 5);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 3);
  const std::string id = SubmitNoWait(c, {"pipeline.stages=3"});
  const std::string first = KillAt(c, id, 5, 1);
  const json restarted = WaitFor(c, id, Recovered);
  // The stage that took the lost one's place.
  std::string second;
  for (const json& s : restarted["stage_ids"]) {
    if (s != first) second = s;
  }
  ASSERT_TRUE(c.KillStage(StageAddress(c, second))) << second;
  const json after_kill = Status(c, id);
  if (testing::JobHasEnded(after_kill) && after_kill.value("recoveries", json::array()).size() < 2) {
    GTEST_SKIP() << "the job ended before the second kill reached it (the machine was too "
                    "slow for this test): "
                 << JsonInt(after_kill, "steps_done") << " steps done";
  }
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  EXPECT_EQ(done.value("recoveries", json::array()).size(), 2u) << done.dump();
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kOtherLayout));
}

// A checkpoint that cannot be written (here its folder's place is taken by a file)
// warns and does not fail a job whose training is healthy; the next interval writes it.
TEST_F(CoordinatorRecoveryTest, ACheckpointThatCannotBeWrittenWarnsAndTheNextOneIsWritten) {
  spec_["checkpoint"]["every_steps"] = 20;
  auto cluster = LocalCluster::Start(dir_.File("state"), 1);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // The fresh cluster's first job is job-000001: its checkpoints cannot go where a file is.
  const std::string blocker = dir_.File("state") + "/checkpoints/job-000001";
  std::filesystem::create_directories(dir_.File("state") + "/checkpoints");
  testing::WriteFileOrDie(blocker, "not a folder");
  const std::string id = SubmitNoWait(c, {});
  ASSERT_EQ(id, "job-000001");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string logs;
  while (std::chrono::steady_clock::now() < deadline && logs.find("warning:") == std::string::npos) {
    auto r = c.Cli({"logs", id});
    if (r.ok()) logs = r->out;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_THAT(logs, HasSubstr("the job goes on and tries again at the next checkpoint"));
  EXPECT_THAT(logs, HasSubstr("step-20"));
  std::filesystem::remove(blocker);
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  EXPECT_THAT(done.value("checkpoint_dir", ""), ::testing::EndsWith(absl::StrCat("/step-", kSteps)));
  for (const auto& entry : std::filesystem::directory_iterator(blocker)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp-"), std::string::npos)
        << "a partial folder was left: " << entry.path();
  }
}

// A coordinator killed (SIGKILL) or stopped (SIGTERM) and started again on the same
// --state-dir continues the job it was running, from the state its stages kept.
class CoordinatorRestartRecoveryTest : public CoordinatorRecoveryTest,
                                       public ::testing::WithParamInterface<int> {};

TEST_P(CoordinatorRestartRecoveryTest, TheNextCoordinatorContinuesTheJobFromItsStages) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 2);

  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  const json before = WaitFor(c, id, [](const json& j) { return JsonInt(j, "steps_done") >= 5; });
  ASSERT_TRUE(c.KillCoordinator(GetParam()).ok());
  ASSERT_TRUE(c.StartCoordinatorAgain(0).ok());
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done["recoveries"].size(), 1u) << done.dump() << ProcessLogs(c);
  const json& r = done["recoveries"][0];
  EXPECT_EQ(r["source"], "the stages' snapshots") << r.dump();
  EXPECT_GE(JsonInt(r, "restored_step"), JsonInt(before, "steps_done"));
  EXPECT_EQ(r["stages"], 2);
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
}

INSTANTIATE_TEST_SUITE_P(Signals, CoordinatorRestartRecoveryTest,
                         ::testing::Values(SIGKILL, SIGTERM),
                         [](const auto& info) { return info.param == SIGKILL ? "Sigkill" : "Sigterm"; });

// A stage that dies while the coordinator is down does not come back with the others:
// the restarted coordinator gives up on it after a few heartbeat timeouts, takes the
// free stage in its place and restores its slice from the copy its neighbour holds.
TEST_F(CoordinatorRecoveryTest, AStageLostWhileTheCoordinatorWasDownIsReplaced) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<double> expected = Reference(c, 2);
  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  const json before = WaitFor(c, id, [](const json& j) { return JsonInt(j, "steps_done") >= 5; });
  const std::string victim_address = StageAddress(c, before["stage_ids"][1]);
  ASSERT_TRUE(c.KillCoordinator(SIGKILL).ok());
  ASSERT_TRUE(c.KillStage(victim_address));
  ASSERT_TRUE(c.StartCoordinatorAgain(0).ok());
  const json done = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done.value("recoveries", json::array()).size(), 1u) << done.dump();
  const json& r = done["recoveries"][0];
  EXPECT_EQ(r["source"], "the stages' snapshots") << r.dump();
  EXPECT_EQ(r["stages"], 2);
  EXPECT_THAT(r["lost_stage_ids"][0].get<std::string>(), HasSubstr(victim_address));
  EXPECT_TRUE(LossesMatch(Losses(Status(c, id)), expected, kSameLayout));
}

// A stage that stops answering without dying is lost within --stage-deadline, and the
// job goes on without it.
TEST_F(CoordinatorRecoveryTest, AFrozenStageIsLostWithinTheDeadlineAndTheJobGoesOn) {
  LocalClusterOptions options;
  options.coordinator_args = {"--stage-deadline", "3"};
  auto cluster = LocalCluster::Start(dir_.File("state"), 3, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // Long enough (about 25 ms a step) that the job is still running when the status poll
  // has seen its third step and the stage is frozen, however slow the poll.
  spec_["training"]["steps"] = 400;
  const std::string id = SubmitNoWait(c, {"pipeline.stages=3"});
  const json running = WaitFor(c, id, [](const json& j) { return JsonInt(j, "steps_done") >= 3; });
  ASSERT_LT(JsonInt(running, "steps_done"), 300) << "the job must still be running when frozen";
  const std::string victim = running["stage_ids"][1];
  const std::string victim_address = StageAddress(c, victim);
  ASSERT_TRUE(c.SignalStage(victim_address, SIGSTOP)) << victim;
  const auto frozen_at = std::chrono::steady_clock::now();
  const json recovering = WaitFor(c, id, Recovered);
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen_at).count();
  EXPECT_LT(took, 20.0) << recovering.dump();
  const json done = WaitFor(c, id, testing::JobHasEnded);
  ASSERT_TRUE(c.KillStage(victim_address));  // a stopped process still takes SIGKILL
  EXPECT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done["recoveries"].size(), 1u);
  EXPECT_EQ(done["recoveries"][0]["lost_stage_ids"][0], victim);
  EXPECT_EQ(JsonInt(done, "steps_done"), 400);
}

}  // namespace
}  // namespace pipetrain
