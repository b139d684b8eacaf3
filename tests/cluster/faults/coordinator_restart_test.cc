// End to end, a coordinator killed with SIGKILL and started again on the same port and
// state dir while its stages live on: each stage registers again under an identity the
// new coordinator gave it (none is taken for another stage that now holds its old id),
// the cluster lists every stage once, and jobs run on them.
#include <signal.h>

#include <map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::LocalCluster;

class CoordinatorRestartTest : public testing::ClusterJobTest {
 protected:
  // `pipetrain cluster --json`'s stages, parsed.
  json Stages(LocalCluster& c) {
    auto view = c.Cli({"cluster", "--json"});
    EXPECT_TRUE(view.ok() && view->exit_code == 0);
    if (!view.ok()) return json::array();
    const json parsed = json::parse(view->out, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << view->out;
    if (parsed.is_discarded() || !parsed.contains("stages")) return json::array();
    return parsed["stages"];
  }
};

// Stage ids start again from stage-1 in the new coordinator. The stage that was
// stage-1 is paused (SIGSTOP) across the restart, so the other two register first and
// take stage-1 and stage-2; when it resumes, its heartbeat carries stage-1, which now
// names another stage. Matched by id alone, that heartbeat would pass for the other
// stage and the paused one would never register again (a ghost); with the
// registration's secret it is refused and the stage registers as stage-3.
TEST_F(CoordinatorRestartTest, EveryStageRegistersOnceAgainAfterACoordinatorSigkill) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 3);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string paused = StageAddress(c, "stage-1");
  ASSERT_FALSE(paused.empty());
  ASSERT_TRUE(c.SignalStage(paused, SIGSTOP));

  absl::Status killed = c.KillCoordinator(SIGKILL);
  ASSERT_TRUE(killed.ok()) << killed;
  absl::Status started = c.StartCoordinatorAgain(2);
  ASSERT_TRUE(started.ok()) << started;
  const std::string new_first = StageAddress(c, "stage-1");
  EXPECT_FALSE(new_first.empty());
  EXPECT_NE(new_first, paused) << "the scenario needs stage-1 to name another stage now";

  ASSERT_TRUE(c.SignalStage(paused, SIGCONT));
  absl::Status idle = c.WaitForIdleStages(3);
  ASSERT_TRUE(idle.ok()) << idle << "\n" << Stages(c).dump(2);

  const json stages = Stages(c);
  std::map<std::string, int> listed;  // address -> how many records name it
  for (const json& s : stages) {
    ++listed[s.value("address", "")];
    EXPECT_EQ(s.value("state", ""), "IDLE") << s.dump();
  }
  EXPECT_EQ(stages.size(), 3u) << stages.dump(2);
  for (const std::string& address : c.stage_addresses()) {
    EXPECT_EQ(listed[address], 1) << address << " in " << stages.dump(2);
  }
  EXPECT_EQ(StageAddress(c, "stage-3"), paused) << stages.dump(2);

  const std::string id = SubmitAndFollow(c, {"pipeline.stages=2"});
  EXPECT_EQ(Status(c, id)["state"], "SUCCEEDED");
}

}  // namespace
}  // namespace pipetrain
