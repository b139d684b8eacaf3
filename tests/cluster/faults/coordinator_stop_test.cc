// End to end, a cluster stopped the way scancel stops it: SIGTERM to the coordinator
// and every stage server at the same moment. The stages that a job holds keep serving
// until the coordinator has finished the step and taken the checkpoint through them
// (pipetrain-stage --stop-grace), then every process exits within seconds; the job
// ends CANCELLED with that checkpoint under --on-stop cancel (and `pipetrain resume`
// continues it from there), or RECOVERING with it under the default --on-stop recover
// (and the next coordinator continues it). A stage that no job holds stops at once, and
// a second SIGTERM stops a held one at once.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain {
namespace {

using namespace std::chrono_literals;
using ::pipetrain::testing::JsonInt;
using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::LocalClusterOptions;
using ::testing::HasSubstr;
using ::testing::Not;

// Far less than the stages' default --stop-grace (30 s): they leave once released.
constexpr auto kAllStopWithin = 15s;

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class CoordinatorStopTest : public testing::ClusterJobTest {
 protected:
  CoordinatorStopTest() {
    // Long enough to be running when the signal comes however slow the machine; no
    // checkpoint but the stop's (and the last step's).
    spec_["training"]["steps"] = 2000;
    spec_["data"]["validate_every_steps"] = 0;
    spec_["checkpoint"]["every_steps"] = 0;
    spec_["pipeline"]["schedule"] = "1f1b";
  }

  // Every process's log so far, for the message of a failed expectation.
  static std::string ProcessLogs(const LocalCluster& c) {
    return "\ncoordinator: " + c.coordinator_log() + c.stage_logs();
  }

  // Submits the job on 2 stages and waits until it has done a few steps; their count.
  int64_t RunAFewSteps(LocalCluster& c, std::string* id) {
    *id = SubmitNoWait(c, {"pipeline.stages=2"});
    const json s = WaitFor(c, *id, [](const json& j) { return JsonInt(j, "steps_done") >= 5; });
    EXPECT_EQ(s.value("state", ""), "RUNNING") << Brief(s);
    return JsonInt(s, "steps_done");
  }

  // SIGTERM to all three processes at once, as scancel; each must exit 0 within
  // kAllStopWithin. The stages' logs say they served on until the coordinator let them go.
  void StopLikeScancel(LocalCluster& c, const std::string& id) {
    const auto signalled = std::chrono::steady_clock::now();
    absl::StatusOr<std::vector<int>> codes = c.SignalAllAndWait(SIGTERM, kAllStopWithin);
    ASSERT_TRUE(codes.ok()) << codes.status() << ProcessLogs(c);
    EXPECT_LT(SecondsSince(signalled), std::chrono::duration<double>(kAllStopWithin).count());
    for (int code : *codes) EXPECT_EQ(code, 0) << ProcessLogs(c);
    const std::string stages = c.stage_logs();
    EXPECT_THAT(stages, HasSubstr(absl::StrCat("stopping: job ", id, " holds this stage; serving "
                                               "up to 30 s more")))
        << stages;
    EXPECT_THAT(stages, HasSubstr("stopping: the coordinator no longer holds this stage"))
        << stages;
    EXPECT_THAT(stages, Not(HasSubstr("--stop-grace is over"))) << stages;
  }

  // A status's fields these tests look at, for a failure's message (not its history).
  static std::string Brief(const json& s) {
    json b = json::object();
    for (const char* key : {"state", "reason", "steps_done", "checkpoint_dir", "recoveries"}) {
      if (s.contains(key)) b[key] = s[key];
    }
    return b.dump();
  }

  // The step of a checkpoint folder ".../step-N"; -1 if it is not one.
  static int64_t StepOf(const std::string& dir) {
    const size_t at = dir.rfind("/step-");
    int64_t n = -1;
    if (at == std::string::npos || !absl::SimpleAtoi(dir.substr(at + 6), &n)) return -1;
    return n;
  }
};

TEST_F(CoordinatorStopTest, WithOnStopCancelTheJobEndsCancelledWithTheStopsCheckpoint) {
  LocalClusterOptions options;
  options.coordinator_args = {"--on-stop", "cancel"};
  auto cluster = LocalCluster::Start(dir_.File("state"), 2, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::string id;
  const int64_t seen = RunAFewSteps(**cluster, &id);
  ASSERT_FALSE(id.empty());
  StopLikeScancel(**cluster, id);
  if (HasFatalFailure()) return;

  // What the store says, through a fresh coordinator on the same state dir.
  auto fresh = LocalCluster::Start(dir_.File("state"), 2);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  LocalCluster& c = **fresh;
  const json s = Status(c, id);
  EXPECT_EQ(s.value("state", ""), "CANCELLED") << Brief(s);
  const int64_t done = JsonInt(s, "steps_done");
  EXPECT_GE(done, seen);
  EXPECT_LT(done, 2000) << "the job must have been stopped, not finished";
  const std::string checkpoint = s.value("checkpoint_dir", "");
  EXPECT_EQ(StepOf(checkpoint), done) << Brief(s);
  EXPECT_TRUE(std::filesystem::is_directory(checkpoint)) << checkpoint;
  const std::string reason = s.value("reason", "");
  EXPECT_THAT(reason, HasSubstr("stopped by a signal (--on-stop cancel)"));
  EXPECT_THAT(reason, HasSubstr(absl::StrCat("after step ", done)));
  EXPECT_THAT(reason, HasSubstr(absl::StrCat("pipetrain resume ", id, "' (from ", checkpoint)));
  EXPECT_THAT(reason, Not(HasSubstr("failed"))) << "the checkpoint must have been taken";

  // `pipetrain resume` continues it from that step (3 steps of it are enough to see).
  auto resumed = c.Cli({"resume", id, "--set", "training.steps=3"});
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->exit_code, 0) << resumed->out << resumed->err;
  const std::string next = testing::SubmittedId(resumed->out);
  ASSERT_FALSE(next.empty()) << resumed->out;
  const json r = Status(c, next);
  EXPECT_EQ(r.value("state", ""), "SUCCEEDED") << Brief(r);
  ASSERT_EQ(r["history"].size(), 3u) << Brief(r);
  EXPECT_EQ(JsonInt(r["history"][0], "step"), done + 1) << Brief(r);
}

TEST_F(CoordinatorStopTest, WithOnStopRecoverTheJobIsLeftRecoveringWithTheStopsCheckpoint) {
  spec_["training"]["steps"] = 300;  // the next coordinator runs the rest
  spec_["fault_tolerance"]["max_restarts"] = 3;
  auto cluster = LocalCluster::Start(dir_.File("state"), 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::string id;
  const int64_t seen = RunAFewSteps(**cluster, &id);
  ASSERT_FALSE(id.empty());
  StopLikeScancel(**cluster, id);
  if (HasFatalFailure()) return;

  // A fresh coordinator finds it RECOVERING and waits for its stages, which are gone:
  // it continues on new ones from the checkpoint the stop took.
  auto fresh = LocalCluster::Start(dir_.File("state"), 2);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  LocalCluster& c = **fresh;
  const json s = Status(c, id);
  const int64_t done = JsonInt(s, "steps_done");
  EXPECT_GE(done, seen);
  const std::string checkpoint = s.value("checkpoint_dir", "");
  EXPECT_EQ(StepOf(checkpoint), done) << Brief(s);
  EXPECT_TRUE(std::filesystem::is_directory(checkpoint)) << checkpoint;
  const json end = WaitFor(c, id, testing::JobHasEnded);
  EXPECT_EQ(end.value("state", ""), "SUCCEEDED") << Brief(end) << ProcessLogs(c);
  ASSERT_EQ(end.value("recoveries", json::array()).size(), 1u) << Brief(end);
  EXPECT_EQ(JsonInt(end["recoveries"][0], "restored_step"), done) << Brief(end);

  // The first coordinator's log lines: a watcher of a live job sees only this
  // coordinator's, an ended job's are read from the store (once it has left memory).
  const std::string written = absl::StrCat("checkpoint of step ", done, " written to ");
  std::string logs;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!absl::StrContains(logs, written) && std::chrono::steady_clock::now() < deadline) {
    auto r = c.Cli({"logs", id});
    if (r.ok()) logs = r->out;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_THAT(logs, HasSubstr(written));
  EXPECT_THAT(logs, HasSubstr(absl::StrCat("the coordinator stopped while the job was running "
                                           "(after step ", done, "; cancelled before step ",
                                           done + 1, "): a coordinator started on the same "
                                           "--state-dir continues it")))
      << logs;
  EXPECT_THAT(logs, Not(HasSubstr("checkpoint of step " + std::to_string(done) + " failed")));
}

// A stage no job holds stops at once, whatever its --stop-grace.
TEST_F(CoordinatorStopTest, AStageNoJobHoldsStopsAtOnce) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 1);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string idle = c.stage_addresses()[0];
  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.SignalStage(idle, SIGTERM));
  absl::StatusOr<int> code = c.WaitForStageExit(idle, 3s);
  ASSERT_TRUE(code.ok()) << code.status() << ProcessLogs(c);
  EXPECT_EQ(*code, 0);
  EXPECT_LT(SecondsSince(signalled), 3.0);
  EXPECT_THAT(c.stage_logs(), Not(HasSubstr("holds this stage")));
}

// A stage a job holds serves on while the coordinator runs the job; a second SIGTERM
// stops it at once.
TEST_F(CoordinatorStopTest, ASecondSignalStopsAHeldStageAtOnce) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  std::string id;
  RunAFewSteps(c, &id);
  const json s = Status(c, id);
  ASSERT_EQ(s["stage_ids"].size(), 2u) << Brief(s);
  const std::string held = StageAddress(c, s["stage_ids"][0].get<std::string>());
  ASSERT_FALSE(held.empty());

  ASSERT_TRUE(c.SignalStage(held, SIGTERM));
  const std::string draining = absl::StrCat("stopping: job ", id, " holds this stage");
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!absl::StrContains(c.stage_logs(), draining) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  ASSERT_THAT(c.stage_logs(), HasSubstr(draining));
  std::this_thread::sleep_for(1s);  // it serves on: the job still holds it and runs
  const json running = Status(c, id);
  EXPECT_EQ(running.value("state", ""), "RUNNING") << Brief(running);
  EXPECT_GT(JsonInt(running, "steps_done"), JsonInt(s, "steps_done"));
  const auto signalled = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.SignalStage(held, SIGTERM));
  absl::StatusOr<int> code = c.WaitForStageExit(held, 3s);
  ASSERT_TRUE(code.ok()) << code.status() << ProcessLogs(c);
  EXPECT_EQ(*code, 0);
  EXPECT_LT(SecondsSince(signalled), 3.0);
  EXPECT_THAT(c.stage_logs(), HasSubstr("stopping at once: a second signal"));
}

}  // namespace
}  // namespace pipetrain
