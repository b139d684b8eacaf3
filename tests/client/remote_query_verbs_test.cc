// status, logs, list, cancel, cluster and timeline (its trace and --breakdown) through
// RunCli against an in-process fake coordinator: tables and summaries, JSON output, and
// the requests they send.
#include <sstream>

#include "absl/strings/str_split.h"
#include "client/cli.h"
#include "tests/testing/run_cli.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_coordinator.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::client {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::FakeCoordinator;
using ::pipetrain::testing::TestServer;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Result = ::pipetrain::testing::CliRun;
using ::pipetrain::testing::Cli;

pb::JobStatus RunningJob() {
  pb::JobStatus j;
  j.set_job_id("job-000001");
  j.mutable_spec()->set_name("tiny");
  j.mutable_spec()->mutable_training()->set_steps(300);
  j.mutable_spec()->mutable_pipeline()->set_stages(2);
  j.mutable_spec()->mutable_pipeline()->set_micro_batches(4);
  j.mutable_spec()->mutable_pipeline()->set_schedule("1f1b");
  j.set_state(pb::JobStatus::RUNNING);
  j.set_steps_done(2);
  j.add_stage_ids("stage-a");
  j.add_stage_ids("stage-b");
  j.set_checkpoint_dir("/ckpt/job-000001");
  j.mutable_created()->set_seconds(1714564800);
  j.mutable_started()->set_seconds(1714564801);
  for (int step = 1; step <= 2; ++step) {
    pb::StepRecord* s = j.add_history();
    s->set_step(step);
    s->set_loss(6.0 - step);
    s->set_step_time_s(0.25);
    s->set_tokens_per_s(8192);
    s->set_bubble_measured(0.3);
    s->set_bubble_predicted(0.25);
  }
  return j;
}

class RemoteQueryVerbsTest : public ::testing::Test {
 protected:
  RemoteQueryVerbsTest() { fake_.job = RunningJob(); }
  FakeCoordinator fake_;
  TestServer server_{&fake_};
  const std::string& addr() const { return server_.address(); }
};

TEST_F(RemoteQueryVerbsTest, StatusSummarisesTheJob) {
  Result r = Cli({"status", "job-000001", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("state       RUNNING"), HasSubstr("steps       2/300"),
                           HasSubstr("loss        4.0000 (step 2)"),
                           HasSubstr("stages      stage-a, stage-b"),
                           HasSubstr("checkpoint  /ckpt/job-000001"),
                           HasSubstr("created     2024-05-01T12:00:00Z")));
  // A failed job is reported, not judged: still exit 0.
  fake_.job.set_state(pb::JobStatus::FAILED);
  fake_.job.set_reason("out of memory on stage-b");
  r = Cli({"status", "job-000001", "--address", addr()});
  EXPECT_EQ(r.code, kExitOk);
  EXPECT_THAT(r.out, HasSubstr("reason      out of memory on stage-b"));
}

TEST_F(RemoteQueryVerbsTest, StatusJsonCarriesTheHistory) {
  Result r = Cli({"status", "job-000001", "--json", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["job_id"], "job-000001");
  EXPECT_EQ(j["state"], "RUNNING");
  ASSERT_EQ(j["history"].size(), 2u);
  for (const char* key : {"step", "loss", "step_time_s", "tokens_per_s", "bubble_measured",
                          "bubble_predicted", "val_loss"}) {
    EXPECT_TRUE(j["history"][1].contains(key)) << key;
  }
  EXPECT_EQ(j["history"][1]["step"], "2");
  EXPECT_DOUBLE_EQ(j["history"][1]["bubble_predicted"].get<double>(), 0.25);
  ASSERT_EQ(fake_.gets().size(), 1u);
  EXPECT_TRUE(fake_.gets()[0].include_history());
}

TEST_F(RemoteQueryVerbsTest, LogsPrintTimeAndTextAndFollowOnlyWithF) {
  pb::JobEvent log;
  log.mutable_log()->set_text("step driver: step 1 took 0.25 s");
  log.mutable_log()->mutable_time()->set_seconds(1714564803);
  log.mutable_log()->mutable_time()->set_nanos(250'000'000);
  pb::JobEvent step;
  step.mutable_step()->set_step(1);
  fake_.events = {log, step, log};
  Result r = Cli({"logs", "job-000001", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const std::string line = "2024-05-01T12:00:03.250Z  step driver: step 1 took 0.25 s\n";
  EXPECT_EQ(r.out, line + line);
  r = Cli({"logs", "job-000001", "-f", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_EQ(fake_.watches().size(), 2u);
  EXPECT_TRUE(fake_.watches()[0].no_follow());
  EXPECT_FALSE(fake_.watches()[1].no_follow());
}

TEST_F(RemoteQueryVerbsTest, ListShowsATableOrJson) {
  pb::JobStatus done = RunningJob();
  done.set_job_id("job-000002");
  done.set_state(pb::JobStatus::SUCCEEDED);
  done.clear_history();
  *fake_.jobs.add_jobs() = done;
  *fake_.jobs.add_jobs() = RunningJob();
  Result r = Cli({"list", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  std::istringstream lines(r.out);
  std::vector<std::string> rows;
  for (std::string l; std::getline(lines, l);) rows.push_back(l);
  ASSERT_EQ(rows.size(), 3u) << r.out;
  EXPECT_EQ(rows[0], "ID          STATE      NAME  STEPS  LOSS    CREATED");
  EXPECT_EQ(rows[1], "job-000002  SUCCEEDED  tiny  2/300          2024-05-01T12:00:00Z");
  EXPECT_EQ(rows[2], "job-000001  RUNNING    tiny  2/300  4.0000  2024-05-01T12:00:00Z");

  r = Cli({"list", "--json", "--address", addr()});
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["jobs"].size(), 2u);
  EXPECT_EQ(j["jobs"][0]["job_id"], "job-000002");
}

TEST_F(RemoteQueryVerbsTest, ClusterShowsTheStages) {
  pb::StageInfo* s = fake_.cluster.add_stages();
  s->set_stage_id("stage-a");
  s->set_address("10.0.0.5:7401");
  s->mutable_device()->set_kind("cuda");
  s->mutable_device()->set_name("NVIDIA H200");
  s->mutable_device()->set_memory_bytes(uint64_t{141} << 30);
  s->mutable_device()->set_bf16("none");
  s->set_state(pb::StageInfo::BUSY);
  s->set_job_id("job-000001");
  s->mutable_last_heartbeat()->set_seconds(1);  // long ago
  pb::StageInfo* t = fake_.cluster.add_stages();
  t->set_stage_id("stage-b");
  t->set_address("10.0.0.6:7401");
  t->mutable_device()->set_kind("emulated");
  t->mutable_device()->set_name("emulated:h100");
  t->set_state(pb::StageInfo::IDLE);
  Result r = Cli({"cluster", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out,
              HasSubstr("ID       ADDRESS        DEVICE            BF16  MEMORY     STATE  JOB"));
  EXPECT_THAT(r.out, HasSubstr("stage-a  10.0.0.5:7401  cuda NVIDIA H200  none  141.0 GiB  BUSY   "
                               "job-000001  "));
  // A stage that does not say (older than DeviceInfo.bf16) shows "-".
  EXPECT_THAT(r.out,
              HasSubstr("stage-b  10.0.0.6:7401  emulated:h100     -     -          IDLE   -"));
  EXPECT_THAT(r.out, HasSubstr("never"));
  r = Cli({"cluster", "--json", "--address", addr()});
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["stages"][0]["device"]["name"], "NVIDIA H200");
}

TEST_F(RemoteQueryVerbsTest, CancelPrintsTheNewState) {
  Result r = Cli({"cancel", "job-000001", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_EQ(r.out, "job-000001: CANCELLED (cancelled by the user)\n");
  EXPECT_THAT(fake_.cancelled(), ElementsAre("job-000001"));
  EXPECT_EQ(Cli({"cancel", "--address", addr()}).code, kExitUsage);
}

TEST_F(RemoteQueryVerbsTest, TimelineWritesAChromeTrace) {
  fake_.timeline.set_job_id("job-000001");
  for (int step : {7, 8}) {
    pb::TimelineEvent* f = fake_.timeline.add_events();
    f->set_step(step);
    f->set_stage(1);
    f->set_lane("compute");
    f->mutable_action()->set_kind(pb::FORWARD);
    f->mutable_action()->set_micro_batch(3);
    f->set_start_us(100);
    f->set_end_us(400);
    pb::TimelineEvent* send = fake_.timeline.add_events();
    *send = *f;
    send->set_lane("link");
    send->mutable_action()->set_kind(pb::SEND_ACTIVATION);
    send->set_start_us(400);
    send->set_end_us(1000);
    send->set_bytes(65536);
  }
  ::pipetrain::testing::TempDir dir;
  const std::string path = dir.File("trace.json");
  Result r = Cli({"timeline", "job-000001", "--out", path, "--steps", "2", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr(path), HasSubstr("https://ui.perfetto.dev")));
  ASSERT_EQ(fake_.timeline_requests().size(), 1u);
  EXPECT_EQ(fake_.timeline_requests()[0].last_steps(), 2);
  auto trace = nlohmann::json::parse(::pipetrain::testing::ReadFileOrDie(path), nullptr, false);
  ASSERT_FALSE(trace.is_discarded());
  std::vector<nlohmann::json> spans;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X") spans.push_back(e);
  }
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(spans[0]["name"], "F3");
  EXPECT_EQ(spans[0]["pid"], 1);
  EXPECT_EQ(spans[0]["tid"], 0);
  EXPECT_EQ(spans[1]["name"], "SEND_F3");
  EXPECT_EQ(spans[1]["tid"], 1);
  EXPECT_EQ(spans[1]["args"]["bytes"], 65536);
  EXPECT_EQ(spans[2]["ts"], 1100);  // step 8 starts where step 7 ended (1000 us)

  Result no_out = Cli({"timeline", "job-000001", "--address", addr()});
  EXPECT_EQ(no_out.code, kExitUsage);
  EXPECT_THAT(no_out.err, HasSubstr("--out FILE is required (or --breakdown)"));
}

// Two steps of two stages: stage 1 recomputes inside its backward and waits for the
// activation; stage 0 waits for the gradient.
void AddBreakdownSteps(pb::Timeline& t) {
  t.set_job_id("job-000001");
  auto add = [&](int64_t step, int stage, pb::ActionKind kind, int64_t start, int64_t end,
                 int64_t recompute = 0) {
    pb::TimelineEvent* e = t.add_events();
    e->set_step(step);
    e->set_stage(stage);
    e->mutable_action()->set_kind(kind);
    e->set_lane(kind == pb::FORWARD || kind == pb::BACKWARD ? "compute" : "link");
    e->set_start_us(start);
    e->set_end_us(end);
    e->set_recompute_us(recompute);
  };
  for (int64_t step : {7, 8}) {
    const int64_t slow = step == 8 ? 2 : 1;  // step 8 takes twice as long
    add(step, 0, pb::FORWARD, 0, 1000 * slow);
    add(step, 0, pb::SEND_ACTIVATION, 1000 * slow, 1200 * slow);
    add(step, 0, pb::RECV_GRADIENT, 1200 * slow, 4000 * slow);
    add(step, 0, pb::BACKWARD, 4000 * slow, 6000 * slow);
    add(step, 1, pb::RECV_ACTIVATION, 0, 1200 * slow);
    add(step, 1, pb::FORWARD, 1200 * slow, 2200 * slow);
    add(step, 1, pb::BACKWARD, 2200 * slow, 3900 * slow, 500 * slow);
    add(step, 1, pb::SEND_GRADIENT, 3900 * slow, 4000 * slow);
  }
}

TEST_F(RemoteQueryVerbsTest, TimelineBreakdownPrintsATableOfEveryStage) {
  AddBreakdownSteps(fake_.timeline);
  Result r = Cli({"timeline", "job-000001", "--breakdown", "--steps", "2", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_EQ(fake_.timeline_requests().size(), 1u);
  EXPECT_EQ(fake_.timeline_requests()[0].last_steps(), 2);
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n');
  ASSERT_EQ(lines.size(), 5u) << r.out;
  // Steps of 6 and 12 ms: 9 ms on average.
  EXPECT_EQ(lines[0], "job-000001: steps 7-8 (2 averaged), step time 9.0 ms (the longest stage span)");
  EXPECT_THAT(lines[1], AllOf(HasSubstr("forward"), HasSubstr("recompute"),
                              HasSubstr("recv-wait"), HasSubstr("idle")));
  // Stage 0: forward 1.5 ms (17%), send 0.3 ms (3%), recv-wait 4.2 ms (47%), backward
  // 3 ms (33%), never idle.
  EXPECT_THAT(lines[2], AllOf(::testing::StartsWith("0 "), HasSubstr("1.5 ms  17%"),
                              HasSubstr("300 us   3%"), HasSubstr("4.2 ms  47%"),
                              HasSubstr("3.0 ms  33%"), ::testing::EndsWith("0 us   0%")));
  // Stage 1: recompute 0.75 ms (8%) out of its backward's 2.55 ms, which keeps 1.8 ms
  // (20%); idle 3 ms (33%) after it finished.
  EXPECT_THAT(lines[3], AllOf(::testing::StartsWith("1 "), HasSubstr("750 us   8%"),
                              HasSubstr("1.8 ms  20%"), ::testing::EndsWith("3.0 ms  33%")));
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST_F(RemoteQueryVerbsTest, TimelineBreakdownJsonIsJsonOnlyEvenWithATrace) {
  AddBreakdownSteps(fake_.timeline);
  ::pipetrain::testing::TempDir dir;
  const std::string path = dir.File("trace.json");
  Result r = Cli({"timeline", "job-000001", "--breakdown", "--json", "--out", path, "--steps",
                  "2", "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  auto j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["job_id"], "job-000001");
  EXPECT_EQ(j["steps"], nlohmann::json::array({7, 8}));
  EXPECT_DOUBLE_EQ(j["step_time_s"].get<double>(), 9e-3);
  ASSERT_EQ(j["stages"].size(), 2u);
  EXPECT_EQ(j["stages"][1]["stage"], 1);
  EXPECT_DOUBLE_EQ(j["stages"][1]["recompute_s"].get<double>(), 0.75e-3);
  EXPECT_DOUBLE_EQ(j["stages"][1]["backward_s"].get<double>(), 1.8e-3);
  EXPECT_NEAR(j["stages"][1]["shares"]["idle"].get<double>(), 3.0 / 9, 1e-12);
  // The trace was written as well; the line saying so went to stderr.
  EXPECT_THAT(r.err, HasSubstr(path));
  auto trace = nlohmann::json::parse(::pipetrain::testing::ReadFileOrDie(path), nullptr, false);
  ASSERT_FALSE(trace.is_discarded());
  EXPECT_EQ(trace["otherData"]["job_id"], "job-000001");

  // The table and the trace together: both on stdout.
  r = Cli({"timeline", "job-000001", "--breakdown", "--out", path, "--address", addr()});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("wrote 16 events"), HasSubstr("recv-wait")));
}

TEST_F(RemoteQueryVerbsTest, TimelineBreakdownOfNoStepIsAnErrorAndJsonNeedsIt) {
  Result r = Cli({"timeline", "job-000001", "--breakdown", "--address", addr()});
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(r.err, AllOf(HasSubstr("job-000001"), HasSubstr("no step has finished")));
  EXPECT_TRUE(r.out.empty()) << r.out;
  r = Cli({"timeline", "job-000001", "--json", "--out", "x.json", "--address", addr()});
  EXPECT_EQ(r.code, kExitUsage);
  EXPECT_THAT(r.err, HasSubstr("--json goes with --breakdown"));
  EXPECT_THAT(Cli({"timeline", "--help"}).out,
              AllOf(HasSubstr("--breakdown"), HasSubstr("recompute"), HasSubstr("--json")));
}

TEST(RemoteVerbsHelpTest, EveryRemoteVerbExplainsItselfAndItsExitCodes) {
  for (const std::string verb :
       {"submit", "status", "logs", "list", "cancel", "cluster", "timeline"}) {
    Result r = Cli({verb, "--help"});
    EXPECT_EQ(r.code, kExitOk) << verb;
    EXPECT_THAT(r.out, AllOf(HasSubstr("Usage: pipetrain " + verb), HasSubstr("--address"),
                             HasSubstr("Exit codes"), HasSubstr("3  cannot reach")))
        << verb;
  }
  EXPECT_THAT(Cli({"logs", "--help"}).out, HasSubstr("-f, --follow"));
  EXPECT_THAT(Cli({"--help"}).out, AllOf(HasSubstr("submit"), HasSubstr("timeline")));
}

}  // namespace
}  // namespace pipetrain::client
