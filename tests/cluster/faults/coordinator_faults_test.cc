// End to end, the tests that need a cluster of their own because they stop, kill or
// fill its processes: a restarted coordinator still lists finished jobs, and a job it
// cut off says how to resume it; a killed stage fails its job with a reason naming it
// (without restarts) and the other stages take the next job; two jobs run side by side
// on disjoint stages and a third queues until one of them ends.
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/loss_comparison.h"
#include "tests/testing/tolerance.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::LocalClusterOptions;
using ::pipetrain::testing::Losses;
using ::pipetrain::testing::LossesMatch;
using ::testing::HasSubstr;
using ::testing::Not;

class CoordinatorFaultsTest : public testing::ClusterJobTest {
 protected:
  static bool Started(const json& s) { return s.value("steps_done", "0") != "0"; }
  static bool Failed(const json& s) { return s["state"] == "FAILED"; }

  // A job with nothing but steps to do, until something stops it.
  void RunUntilStopped() {
    spec_["training"]["steps"] = 100000;
    spec_["data"]["validate_every_steps"] = 0;
    spec_["checkpoint"]["every_steps"] = 0;
  }
};

TEST_F(CoordinatorFaultsTest, ARestartedCoordinatorStillListsFinishedJobs) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string one = SubmitAndFollow(c, {});
  const std::vector<double> before = Losses(Status(c, one));
  ASSERT_EQ(before.size(), 4u);

  absl::Status restarted = c.RestartCoordinator(4);
  ASSERT_TRUE(restarted.ok()) << restarted;
  auto after = c.Cli({"list", "--json"});
  ASSERT_TRUE(after.ok());
  EXPECT_THAT(after->out, HasSubstr(one));
  const json status = Status(c, one);
  EXPECT_EQ(status["state"], "SUCCEEDED");
  EXPECT_TRUE(LossesMatch(Losses(status), before, testing::kSameArithmetic)) << "after restart";
}

// With fault_tolerance.max_restarts 0, a job that was running when its coordinator
// stopped is FAILED after the restart, and its reason says how to continue it:
// `pipetrain resume ID`, from its checkpoint (coordinator_recovery_test.cc: by default
// the next coordinator continues it).
TEST_F(CoordinatorFaultsTest, AJobCutOffByACoordinatorStopSaysHowToResumeIt) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  RunUntilStopped();
  spec_["checkpoint"]["every_steps"] = 1;
  spec_["fault_tolerance"]["max_restarts"] = 0;  // else the next coordinator continues it
  const std::string id = SubmitNoWait(c, {"pipeline.stages=2"});
  WaitFor(c, id, [](const json& s) { return s.value("checkpoint_dir", "") != ""; });

  absl::Status restarted = c.RestartCoordinator(4);
  ASSERT_TRUE(restarted.ok()) << restarted;
  const json status = Status(c, id);
  EXPECT_EQ(status["state"], "FAILED") << status.dump();
  const std::string reason = status.value("reason", "");
  EXPECT_THAT(reason, HasSubstr("the coordinator stopped while the job was running"));
  EXPECT_THAT(reason, HasSubstr("pipetrain resume " + id)) << reason;
  EXPECT_THAT(reason, Not(HasSubstr("--init-from"))) << reason;
}

// With fault_tolerance.max_restarts 0 (coordinator_recovery_test.cc has the default).
TEST_F(CoordinatorFaultsTest, AKilledStageFailsItsJobAndTheOthersServeTheNext) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  RunUntilStopped();
  spec_["fault_tolerance"]["max_restarts"] = 0;
  const std::string id = SubmitNoWait(c, {"pipeline.stages=4"});
  const json running = WaitFor(c, id, Started);
  const std::string victim = running["stage_ids"][2];
  const std::string victim_address = StageAddress(c, victim);
  ASSERT_TRUE(c.KillStage(victim_address)) << victim << " at '" << victim_address << "'";
  const json failed = WaitFor(c, id, Failed);
  EXPECT_THAT(failed["reason"].get<std::string>(), HasSubstr(victim)) << failed.dump();

  absl::Status idle = c.WaitForIdleStages(3);
  ASSERT_TRUE(idle.ok()) << idle;
  spec_["training"]["steps"] = 2;
  const std::string next = SubmitAndFollow(c, {"pipeline.stages=3"});
  EXPECT_EQ(Status(c, next)["state"], "SUCCEEDED");
  auto cluster_view = c.Cli({"cluster"});
  ASSERT_TRUE(cluster_view.ok());
  EXPECT_THAT(cluster_view->out, HasSubstr("LOST"));
}

// Needs every stage of its cluster free, and fills them all.
TEST_F(CoordinatorFaultsTest, JobsShareTheClusterSideBySideAndQueueForFreeStages) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  spec_["training"]["steps"] = 100000;
  spec_["data"]["validate_every_steps"] = 0;
  auto running = [](const json& s) { return s["state"] == "RUNNING"; };
  const std::string a = SubmitNoWait(c, {"pipeline.stages=2"});
  const std::string b = SubmitNoWait(c, {"pipeline.stages=2"});
  const json sa = WaitFor(c, a, running), sb = WaitFor(c, b, running);
  std::set<std::string> ids;
  for (const json& id : sa["stage_ids"]) ids.insert(id);
  for (const json& id : sb["stage_ids"]) ids.insert(id);
  EXPECT_EQ(ids.size(), 4u) << "two jobs side by side on disjoint stages";

  // Every stage is busy: the next job waits, and starts when one of them ends.
  const std::string queued = SubmitNoWait(c, {"pipeline.stages=1"});
  EXPECT_EQ(Status(c, queued)["state"], "QUEUED");
  ASSERT_EQ(c.Cli({"cancel", a})->exit_code, 0);
  WaitFor(c, queued, running);
  for (const std::string& id : {b, queued}) ASSERT_EQ(c.Cli({"cancel", id})->exit_code, 0);
  for (const std::string& id : {a, b, queued}) {
    WaitFor(c, id, [](const json& s) { return s["state"] == "CANCELLED"; });
  }
}

}  // namespace
}  // namespace pipetrain
