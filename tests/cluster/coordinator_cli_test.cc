// End to end, what a user sees of jobs through the `pipetrain` CLI and the HTTP API:
// cancel keeps a checkpoint, logs and list tell of it, `pipetrain resume` continues it
// (in the other precision too, saying so); `pipetrain follow` follows a job to its end;
// the API serves the same records; bad specs, unknown ids and unreachable coordinators
// get their exit codes; a model too big for the stages is refused naming the memory;
// GET /metrics agrees with `pipetrain status`.
#include <fstream>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/planner/planner.h"
#include "grpcpp/grpcpp.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::JsonInt;
using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::SubmittedId;
using ::testing::HasSubstr;
using ::testing::Not;
using namespace std::chrono_literals;

class CoordinatorCliTest : public testing::SharedClusterTest {
 protected:
  // A 100000-step job on 2 stages, cancelled once its first step is done.
  std::string CancelledJob() {
    return SharedJob("cancelled", [&] {
      json spec = spec_;
      spec_["training"]["steps"] = 100000;
      const std::string id = SubmitNoWait(*c_, {"pipeline.stages=2"});
      spec_ = spec;
      WaitFor(*c_, id, [](const json& s) { return s.value("steps_done", "0") != "0"; });
      auto cancel = c_->Cli({"cancel", id});
      EXPECT_TRUE(cancel.ok() && cancel->exit_code == 0)
          << (cancel.ok() ? cancel->err : cancel.status().ToString());
      WaitFor(*c_, id, [](const json& s) { return s["state"] == "CANCELLED"; });
      return id;
    });
  }
};

TEST_F(CoordinatorCliTest, CancelStopsARunningJobAndKeepsItsCheckpoint) {
  const std::string id = CancelledJob();
  const json cancelled = Status(*c_, id);
  EXPECT_EQ(cancelled["state"], "CANCELLED") << cancelled.dump();
  EXPECT_FALSE(cancelled["checkpoint_dir"].get<std::string>().empty()) << "cancel keeps the work";
}

TEST_F(CoordinatorCliTest, LogsTellThatAJobWasCancelled) {
  const std::string id = CancelledJob();
  auto logs = c_->Cli({"logs", id});
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(logs->out, HasSubstr("cancel"));
}

TEST_F(CoordinatorCliTest, ListShowsAJobWithItsState) {
  const std::string id = CancelledJob();
  auto list = c_->Cli({"list"});
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(list->out, HasSubstr(id));
  EXPECT_THAT(list->out, HasSubstr("CANCELLED"));
}

// `pipetrain resume`: the cancelled job continues from its checkpoint (2 steps here,
// not its 100000).
TEST_F(CoordinatorCliTest, ResumeContinuesACancelledJobFromItsCheckpoint) {
  const std::string id = CancelledJob();
  const std::string checkpoint = Status(*c_, id)["checkpoint_dir"];
  auto r = c_->Cli({"resume", id, "--set", "training.steps=2"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
  EXPECT_THAT(r->out, HasSubstr(absl::StrCat("resuming ", id, " from ", checkpoint)));
  const std::string resumed_id = SubmittedId(r->out);
  ASSERT_FALSE(resumed_id.empty()) << r->out;
  const json resumed = Status(*c_, resumed_id);
  EXPECT_EQ(resumed["state"], "SUCCEEDED") << resumed.dump();
  EXPECT_EQ(resumed["spec"]["init_from"], checkpoint);
}

// Resumed in the other precision: `pipetrain logs` of the new job says that the fp32
// job's checkpoint is carried over unchanged into bf16 training.
TEST_F(CoordinatorCliTest, ResumeInBf16SaysSoInTheLogs) {
  const std::string id = CancelledJob();
  const std::string checkpoint = Status(*c_, id)["checkpoint_dir"];
  auto r = c_->Cli({"resume", id, "--set", "training.steps=2", "--set", "training.precision=bf16"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
  const std::string resumed_id = SubmittedId(r->out);
  ASSERT_FALSE(resumed_id.empty()) << r->out;
  EXPECT_EQ(Status(*c_, resumed_id)["state"], "SUCCEEDED");
  auto logs = c_->Cli({"logs", resumed_id});
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(logs->out, HasSubstr(absl::StrCat(
                             "job ", resumed_id, " trains in bf16 from init_from '", checkpoint,
                             "', which was trained in fp32: its fp32 master weights and AdamW "
                             "moments are carried over unchanged")));
}

TEST_F(CoordinatorCliTest, ResumeOfAJobThatSucceededHasNoStepsLeft) {
  auto done = c_->Cli({"resume", FinishedJob({})});
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->exit_code, 2);
  EXPECT_THAT(done->err, HasSubstr("no steps left"));
}

// `pipetrain follow ID`: a job submitted with --no-wait, followed to its end as submit
// would: every step from the first (those done before it came too), exit 0; a cancelled
// job exits 1, an unknown one 2.
TEST_F(CoordinatorCliTest, FollowShowsEveryStepOfAJobItDidNotSubmit) {
  const std::string id = SubmitNoWait(*c_, {});
  auto followed = c_->Cli({"follow", id, "--json"});
  ASSERT_TRUE(followed.ok());
  EXPECT_EQ(followed->exit_code, 0) << followed->err;
  std::vector<double> losses;
  for (absl::string_view line : absl::StrSplit(followed->out, '\n', absl::SkipEmpty())) {
    const json event = json::parse(line, nullptr, false);
    ASSERT_FALSE(event.is_discarded()) << "not JSON: " << std::string(line);
    if (event.contains("step")) losses.push_back(event["step"]["loss"].get<double>());
  }
  EXPECT_EQ(losses, testing::Losses(Status(*c_, id)));
  EXPECT_EQ(losses.size(), 4u);
  auto text = c_->Cli({"follow", id});
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->exit_code, 0);
  EXPECT_THAT(text->out, HasSubstr("following " + id));
  EXPECT_THAT(text->out, HasSubstr("SUCCEEDED"));
}

TEST_F(CoordinatorCliTest, FollowOfACancelledJobExits1AndOfAnUnknownOne2) {
  auto cancelled = c_->Cli({"follow", CancelledJob()});
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->exit_code, 1) << cancelled->out;
  auto unknown = c_->Cli({"follow", "job-999999"});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->exit_code, 2);
  EXPECT_THAT(unknown->err, HasSubstr("job-999999"));
}

// The HTTP API serves the records the CLI shows.
// A schedule written by hand (here what `pipetrain plan --print-schedule` prints for
// zb-v) runs like the schedule itself, to the same losses bit for bit; a faulty one is
// refused at submit, naming the stage and the action in the validator's table.
TEST_F(CoordinatorCliTest, AScheduleFileRunsAndAFaultyOneIsRefusedAtSubmit) {
  const json saved = spec_;
  spec_["pipeline"]["stages"] = 2;
  spec_["pipeline"]["schedule"] = "zb-v";
  auto printed = c_->Cli({"plan", WriteSpec(spec_, "zb-v.json"), "--print-schedule"});
  ASSERT_TRUE(printed.ok() && printed->exit_code == 0)
      << (printed.ok() ? printed->err : printed.status().ToString());
  ASSERT_THAT(printed->out, HasSubstr("placement v"));
  std::ofstream(dir_.File("mine.txt")) << printed->out;
  const std::string named = SubmitAndFollow(*c_, {});
  spec_["pipeline"].erase("schedule");
  spec_["pipeline"]["schedule_file"] = "mine.txt";
  const std::string from_file = SubmitAndFollow(*c_, {});
  EXPECT_EQ(testing::Losses(Status(*c_, named)), testing::Losses(Status(*c_, from_file)));
  EXPECT_EQ(testing::Losses(Status(*c_, from_file)).size(), 4u);

  // Stage 1 runs its chunk 1 (virtual stage 2) before its chunk 0 (virtual stage 1).
  std::string bad = printed->out;
  const size_t at = bad.find("stage 1 max_in_flight 4: F0 F0@1");
  ASSERT_NE(at, std::string::npos) << bad;
  bad.replace(at, 32, "stage 1 max_in_flight 4: F0@1 F0");
  std::ofstream(dir_.File("bad.txt")) << bad;
  spec_["pipeline"]["schedule_file"] = "bad.txt";
  auto refused = c_->Cli({"submit", WriteSpec(spec_)});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->exit_code, 2) << refused->out << refused->err;
  EXPECT_THAT(refused->err, HasSubstr("pipeline.schedule_file: "));
  EXPECT_THAT(refused->err, HasSubstr("stage 1 position 0 (F0@1)"));
  EXPECT_THAT(refused->err, HasSubstr("[F0@1]"));
  spec_ = saved;
}

// pipeline.schedule "auto": the coordinator calibrates the free stages (a block, the
// ring, a transfer), plans the shape on the 4 of them, runs it, logs the choice and its
// reason, and status shows the prediction next to the measured step; the same shape
// named by hand gives the same losses, bit for bit. A spec that sets part of the shape
// too is refused at submit.
TEST_F(CoordinatorCliTest, AnAutoJobRunsThePlannedShapeAndReportsItsPrediction) {
  const json saved = spec_;
  spec_["pipeline"] = {{"schedule", "auto"}};
  const std::string id = SubmitAndFollow(*c_, {});
  const json s = Status(*c_, id);
  EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
  const json& a = s["auto_plan"];
  ASSERT_TRUE(a.is_object()) << s.dump();
  EXPECT_THAT(a["cost_source"].get<std::string>(), HasSubstr("calibrated on stage-"));
  // The 4 cpu stages timed the replicas' all-reduce on a gloo ring among themselves.
  EXPECT_THAT(a["cost_source"].get<std::string>(),
              HasSubstr("the replicas' all-reduce at")) << a.dump();
  EXPECT_THAT(a["cost_source"].get<std::string>(), HasSubstr("(4 stages,"));
  // Two of them timed a transfer between them over a real peer link.
  EXPECT_THAT(a["cost_source"].get<std::string>(), HasSubstr("transfers at ")) << a.dump();
  EXPECT_THAT(a["cost_source"].get<std::string>(), HasSubstr(" to stage-")) << a.dump();
  EXPECT_THAT(a["reason"].get<std::string>(), HasSubstr("shortest predicted step"));
  EXPECT_GT(a["predicted_step_s"].get<double>(), 0);
  EXPECT_GT(a["measured_step_s"].get<double>(), 0);
  EXPECT_EQ(a["steps_measured"], 3) << "4 steps, the first left out";
  const json& p = s["spec"]["pipeline"];
  EXPECT_NE(p["schedule"], "auto");
  EXPECT_LE(p["stages"].get<int>() * p["replicas"].get<int>(), kStages);
  auto text = c_->Cli({"status", id});
  ASSERT_TRUE(text.ok() && text->exit_code == 0);
  EXPECT_THAT(text->out, HasSubstr("auto plan"));
  EXPECT_THAT(text->out, HasSubstr("s measured (median of 3 steps"));
  auto logs = c_->Cli({"logs", id});
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(logs->out, HasSubstr("auto plan: " + a["shape"].get<std::string>()));
  EXPECT_THAT(logs->out, HasSubstr("auto plan: why: "));
  // Every stage was free at submit: no "queued" line, even when the scheduler gave the
  // job its stages before the submit had counted them.
  EXPECT_THAT(logs->out, Not(HasSubstr("queued: needs"))) << logs->out;

  spec_["pipeline"] = p;
  const std::string by_hand = SubmitAndFollow(*c_, {});
  EXPECT_EQ(testing::Losses(Status(*c_, by_hand)), testing::Losses(s));

  spec_["pipeline"] = {{"schedule", "auto"}, {"stages", 2}};
  auto refused = c_->Cli({"submit", WriteSpec(spec_)});
  ASSERT_TRUE(refused.ok()) << refused.status();
  EXPECT_EQ(refused->exit_code, 2) << refused->out << refused->err;
  EXPECT_THAT(refused->err, HasSubstr("pipeline.stages: is chosen by pipeline.schedule \"auto\""));
  spec_ = saved;
}

TEST_F(CoordinatorCliTest, ApiListsTheJobs) {
  const std::string id = CancelledJob();
  httplib::Client http("127.0.0.1", c_->http_port());
  auto jobs = http.Get("/api/jobs");
  ASSERT_TRUE(jobs);
  EXPECT_EQ(jobs->status, 200);
  EXPECT_THAT(jobs->body, HasSubstr(id));
}

TEST_F(CoordinatorCliTest, ApiServesAJobsStepRecords) {
  const std::string one = FinishedJob({});
  httplib::Client http("127.0.0.1", c_->http_port());
  auto job = http.Get(("/api/jobs/" + one).c_str());
  ASSERT_TRUE(job);
  EXPECT_THAT(job->body, HasSubstr("bubble_measured"));
}

TEST_F(CoordinatorCliTest, ApiServesTheClustersStages) {
  httplib::Client http("127.0.0.1", c_->http_port());
  auto cl = http.Get("/api/cluster");
  ASSERT_TRUE(cl);
  EXPECT_EQ(json::parse(cl->body)["stages"].size(), 4u);
}

TEST_F(CoordinatorCliTest, ApiAnswersNotFoundForAnUnknownJob) {
  httplib::Client http("127.0.0.1", c_->http_port());
  auto missing = http.Get("/api/jobs/job-999999");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

// A request the CLI or the coordinator refuses: the exit code, and the field (or what
// else is wrong) named on stderr.
struct BadRequest {
  std::string name;
  std::vector<std::string> args;  // "SPEC" stands for the written job spec
  int exit_code;
  std::string says;
  bool needs_cluster = true;          // false: the CLI runs with the args as they are
  std::string misspelled_field = "";  // a field added to spec_["pipeline"]

  friend void PrintTo(const BadRequest& bad, std::ostream* os) { *os << bad.name; }
};

const BadRequest kBadRequests[] = {
    {.name = "UnknownField",
     .args = {"submit", "SPEC"},
     .exit_code = 2,
     .says = "pipeline.stagse",
     .misspelled_field = "stagse"},
    {.name = "IndivisibleBatch",
     .args = {"submit", "SPEC", "--set", "training.batch_size=10"},
     .exit_code = 2,
     .says = "training.batch_size"},
    {.name = "ReplicasThatDoNotSplitTheBatch",
     .args = {"submit", "SPEC", "--set", "pipeline.replicas=3"},
     .exit_code = 2,
     .says = "is not divisible by pipeline.replicas 3"},
    {.name = "MissingCorpus",
     .args = {"submit", "SPEC", "--set", "data.corpus=/no/such/file"},
     .exit_code = 2,
     .says = "data.corpus"},
    {.name = "UnknownJobId",
     .args = {"status", "job-999999"},
     .exit_code = 2,
     .says = "job-999999"},
    // More stages than the cluster has (and layers to cut): refused up front.
    {.name = "MoreStagesThanTheCluster",
     .args = {"submit", "SPEC", "--set", "training.steps=1", "--set", "pipeline.stages=5"},
     .exit_code = 2,
     .says = "pipeline.stages"},
    {.name = "UnreachableCoordinator",
     .args = {"list", "--address", "127.0.0.1:1"},
     .exit_code = 3,
     .says = "cannot reach the coordinator",
     .needs_cluster = false},
};

class CoordinatorExitCodeTest : public testing::SharedClusterTest,
                                public ::testing::WithParamInterface<BadRequest> {
 protected:
  bool WantsCluster() const override { return GetParam().needs_cluster; }
};

TEST_P(CoordinatorExitCodeTest, ExitsWithItsCodeNamingTheProblem) {
  const BadRequest& bad = GetParam();
  json spec = spec_;
  if (!bad.misspelled_field.empty()) spec["pipeline"][bad.misspelled_field] = 2;
  std::vector<std::string> args = bad.args;
  for (std::string& arg : args) {
    if (arg == "SPEC") arg = WriteSpec(spec);
  }
  absl::StatusOr<testing::RunResult> r;
  if (bad.needs_cluster) {
    r = c_->Cli(args);
  } else {
    args.insert(args.begin(), std::string(PIPETRAIN_BIN_DIR) + "/pipetrain");
    r = testing::RunCommand(args, 30s);
  }
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, bad.exit_code) << r->out << r->err;
  EXPECT_THAT(r->err, HasSubstr(bad.says));
}

INSTANTIATE_TEST_SUITE_P(BadRequests, CoordinatorExitCodeTest, ::testing::ValuesIn(kBadRequests),
                         [](const ::testing::TestParamInfo<BadRequest>& info) {
                           return info.param.name;
                         });

// A cluster of its own: its stages report a memory limit.
using CoordinatorMemoryTest = testing::ClusterJobTest;

// A coordinator that keeps only 4 events of a job in memory: a watcher that starts
// behind them, and one that falls behind while it follows (the job runs steps faster
// than a watcher's batches), still get every step once, in order, and every log line,
// from the store; one that starts after the job ended gets the same.
using CoordinatorWatchTest = testing::ClusterJobTest;

TEST_F(CoordinatorWatchTest, WatchersBehindTheEventsInMemoryGetEveryStepOnce) {
  testing::LocalClusterOptions options;
  options.coordinator_args = {"--events-in-memory", "4"};
  auto cluster = LocalCluster::Start(dir_.File("state"), 1, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  spec_["training"]["steps"] = 300;
  spec_["checkpoint"]["every_steps"] = 50;  // a log line every 50 steps
  const std::string id = SubmitNoWait(c, {"pipeline.stages=1"});
  ASSERT_FALSE(id.empty());
  const json running = WaitFor(c, id, [](const json& s) { return JsonInt(s, "steps_done") >= 30; });
  ASSERT_LT(JsonInt(running, "steps_done"), 300) << "the watchers must start while the job runs";
  auto stub = pipetrain::v1::Coordinator::NewStub(
      grpc::CreateChannel(c.address(), grpc::InsecureChannelCredentials()));
  struct Seen {
    std::vector<int64_t> steps;
    int logs = 0;
    std::string last_state;
  };
  auto watch = [&] {
    Seen seen;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    pipetrain::v1::WatchJobRequest req;
    req.set_job_id(id);
    auto reader = stub->WatchJob(&ctx, req);
    pipetrain::v1::JobEvent e;
    while (reader->Read(&e)) {
      if (e.has_step()) seen.steps.push_back(e.step().step());
      if (e.has_log()) ++seen.logs;
      if (e.has_state_change()) {
        seen.last_state = pipetrain::v1::JobStatus::State_Name(e.state_change().state());
      }
    }
    EXPECT_TRUE(reader->Finish().ok());
    return seen;
  };
  const Seen live = watch();
  std::vector<int64_t> every(300);
  for (int i = 0; i < 300; ++i) every[i] = i + 1;
  EXPECT_EQ(live.steps, every);
  EXPECT_EQ(live.last_state, "SUCCEEDED");
  // Every log line the store has (the job's own account, read over HTTP).
  httplib::Client http("127.0.0.1", c.http_port());
  auto logs = http.Get("/api/jobs/" + id + "/logs");
  ASSERT_TRUE(logs && logs->status == 200);
  const size_t stored = json::parse(logs->body)["logs"].size();
  EXPECT_GE(stored, 6u) << "a checkpoint line every 50 steps";
  EXPECT_EQ(static_cast<size_t>(live.logs), stored);
  const Seen after = watch();
  EXPECT_EQ(after.steps, every);
  EXPECT_EQ(static_cast<size_t>(after.logs), stored);
  EXPECT_EQ(after.last_state, "SUCCEEDED");
}

TEST_F(CoordinatorMemoryTest, AModelTooBigForTheStagesIsRefusedNamingTheMemory) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 2, {"--memory-limit", "100000"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto r = (*cluster)->Cli({"submit", WriteSpec(spec_), "--set", "pipeline.stages=2"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2) << r->out;
  EXPECT_THAT(r->err, HasSubstr("does not fit the stages' memory"));
  EXPECT_THAT(r->err, HasSubstr("pipeline.recompute"));
}

// A model that fits only when its layers are split within the stages' memory (1F1B keeps
// more activations on the first stage) is accepted: submit plans it as the runner will.
TEST_F(CoordinatorMemoryTest, AModelThatFitsOnlyWhenSplitWithinTheMemoryIsAccepted) {
  constexpr double kCap = 2 << 20;
  planner::PlanOptions o;
  o.model = {256, 16, 32, 2, 2};
  o.stages = 2;
  o.micro_batches = 4;
  o.batch_size = 8;
  o.schedule = planner::ScheduleKind::kOneFOneB;
  int layers = 0;
  for (int n = 2; n < 200 && layers == 0; ++n) {
    o.model.n_layers = n;
    o.memory_cap_bytes = 0;
    auto even = planner::MakePlan(o);
    ASSERT_TRUE(even.ok()) << even.status();
    double need = 0;
    for (const auto& st : even->stages) need = std::max(need, st.state_bytes + st.peak_activation_bytes);
    o.memory_cap_bytes = kCap;
    if (need > kCap && planner::MakePlan(o).ok()) layers = n;
  }
  ASSERT_GT(layers, 0) << "no model fits only within the cap; change kCap";
  auto cluster = LocalCluster::Start(dir_.File("state"), 2,
                                     {"--memory-limit", absl::StrCat(static_cast<int64_t>(kCap))});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  json spec = spec_;
  spec["pipeline"] = {{"stages", 2}, {"micro_batches", 4}, {"schedule", "1f1b"}};
  spec["model"]["n_layers"] = layers;
  spec["checkpoint"]["snapshot_every_steps"] = 0;  // planned as `o` is: no snapshot memory
  auto r = (*cluster)->Cli({"submit", WriteSpec(spec), "--no-wait"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
  (*cluster)->Cli({"cancel", "job-000001"}).IgnoreError();
  // Four times as deep does not fit even so, and is refused naming the memory.
  spec["model"]["n_layers"] = 4 * layers;
  r = (*cluster)->Cli({"submit", WriteSpec(spec), "--no-wait"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2) << r->out;
  EXPECT_THAT(r->err, HasSubstr("does not fit the stages' memory"));
}

// A job's measured costs and its latest steps' timelines are stored with it, so `plan
// --costs-from` and `timeline` work the same after the coordinator that ran it restarted.
using CoordinatorCostsTest = testing::ClusterJobTest;

TEST_F(CoordinatorCostsTest, MeasuredCostsAndTimelinesOutliveTheCoordinator) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string spec = WriteSpec(spec_);
  auto r = (*cluster)->Cli({"submit", spec, "--set", "pipeline.stages=2"});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
  auto status = (*cluster)->Cli({"status", "job-000001", "--json"});
  ASSERT_TRUE(status.ok());
  const json job = json::parse(status->out);
  ASSERT_TRUE(job.contains("measured_costs")) << status->out;
  EXPECT_GT(job["measured_costs"]["forward_s_per_flop"].get<double>(), 0);
  EXPECT_EQ(job["measured_costs"]["last_step"], "4");

  auto live = (*cluster)->Cli({"plan", spec, "--costs-from", "job-000001"});
  ASSERT_TRUE(live.ok());
  EXPECT_EQ(live->exit_code, 0) << live->err;
  EXPECT_THAT(live->out, HasSubstr("Costs measured on job-000001 (steps 2-4: 2 stages"));
  ASSERT_TRUE((*cluster)->RestartCoordinator(2).ok());
  auto later = (*cluster)->Cli({"plan", spec, "--costs-from", "job-000001", "--stages", "1"});
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(later->exit_code, 0) << later->err;
  // From the stored timelines, as before the restart (not the rates kept as a fallback).
  EXPECT_THAT(later->out, HasSubstr("Costs measured on job-000001 (steps 2-4: 2 stages"));
  EXPECT_THAT(later->out, Not(HasSubstr("as recorded with the job")));
  auto timeline = (*cluster)->Cli({"timeline", "job-000001", "--breakdown", "--json",
                                   "--steps", "3"});
  ASSERT_TRUE(timeline.ok());
  EXPECT_EQ(timeline->exit_code, 0) << timeline->err;
  const json breakdown = json::parse(timeline->out, nullptr, false);
  ASSERT_FALSE(breakdown.is_discarded()) << timeline->out;
  EXPECT_EQ(breakdown.value("stages", json::array()).size(), 2u) << timeline->out;
}

// Emulated stages run the job's programs without weights: the job ends SUCCEEDED with
// every step recorded, and says why it wrote no checkpoint.
using CoordinatorEmulatedTest = testing::ClusterJobTest;

TEST_F(CoordinatorEmulatedTest, AJobOnEmulatedStagesSucceedsWithoutACheckpoint) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 2, {"--device", "emulated:1e12"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto r = (*cluster)->Cli({"submit", WriteSpec(spec_), "--set", "pipeline.stages=2",
                            "--set", "training.steps=3", "--set", "checkpoint.every_steps=1"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
  EXPECT_THAT(r->out, HasSubstr("SUCCEEDED: 3 of 3 steps"));
  auto logs = (*cluster)->Cli({"logs", "job-000001"});
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(logs->out, HasSubstr("no checkpoint: the job runs on emulated stages"));
}

// GET /metrics counts every job, so this test keeps a cluster of its own.
class CoordinatorMetricsTest : public testing::ClusterJobTest {
 protected:
  // GET /metrics as {"name{labels}": value}, after checking how it is served.
  std::map<std::string, double> Scrape(LocalCluster& c) {
    httplib::Client http("127.0.0.1", c.http_port());
    auto res = http.Get("/metrics");
    std::map<std::string, double> out;
    EXPECT_TRUE(res && res->status == 200) << (res ? res->body : "no response");
    if (!res) return out;
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
    for (absl::string_view line : absl::StrSplit(res->body, '\n', absl::SkipEmpty())) {
      if (line[0] == '#') continue;
      const size_t space = line.rfind(' ');
      double value = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &value)) << line;
      out[std::string(line.substr(0, space))] = value;
    }
    return out;
  }
};

// GET /metrics says what `pipetrain status` says, and keeps series only for the five
// latest finished jobs (the first of six has none).
TEST_F(CoordinatorMetricsTest, MetricsAgreeWithStatusForTheLatestJobs) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string one = SubmitAndFollow(c, {});
  // Only to push `one` out of the five latest: a step each is enough.
  for (int i = 0; i < 3; ++i) SubmitAndFollow(c, {"training.steps=1"});
  const std::string last = SubmitAndFollow(c, {"pipeline.stages=4", "pipeline.schedule=1f1b"});
  spec_["training"]["steps"] = 100000;
  const std::string long_job = SubmitNoWait(c, {"pipeline.stages=2"});
  WaitFor(c, long_job, [](const json& s) { return s.value("steps_done", "0") != "0"; });
  ASSERT_EQ(c.Cli({"cancel", long_job})->exit_code, 0);
  const json cancelled =
      WaitFor(c, long_job, [](const json& s) { return s["state"] == "CANCELLED"; });

  const std::map<std::string, double> scraped = Scrape(c);
  auto metric = [&scraped](const std::string& series) {
    auto it = scraped.find(series);
    EXPECT_NE(it, scraped.end()) << "no sample " << series;
    return it == scraped.end() ? -1.0 : it->second;
  };
  EXPECT_EQ(metric(R"(pipetrain_jobs{state="SUCCEEDED"})"), 5);
  EXPECT_EQ(metric(R"(pipetrain_jobs{state="CANCELLED"})"), 1);
  EXPECT_EQ(metric(R"(pipetrain_jobs{state="RUNNING"})"), 0);
  EXPECT_EQ(metric(R"(pipetrain_stages{state="IDLE"})"), 4);
  const json last_status = Status(c, last);
  const json& last_step = last_status["history"].back();
  const std::string of_last = absl::StrCat(R"({job_id=")", last, R"(",name="e2e"})");
  EXPECT_EQ(metric("pipetrain_job_steps_done" + of_last), 4);
  EXPECT_EQ(metric("pipetrain_job_steps_planned" + of_last), 4);
  EXPECT_DOUBLE_EQ(metric("pipetrain_job_loss" + of_last), last_step["loss"].get<double>());
  EXPECT_DOUBLE_EQ(metric("pipetrain_job_validation_loss" + of_last),
                   last_step["val_loss"].get<double>());
  const std::string of_cancelled = absl::StrCat(R"({job_id=")", long_job, R"(",name="e2e"})");
  EXPECT_EQ(metric("pipetrain_job_steps_done" + of_cancelled),
            std::stod(cancelled["steps_done"].get<std::string>()));
  EXPECT_EQ(metric("pipetrain_job_steps_planned" + of_cancelled), 100000);
  EXPECT_FALSE(scraped.count(absl::StrCat(R"(pipetrain_job_steps_done{job_id=")", one,
                                          R"(",name="e2e"})")));
}

}  // namespace
}  // namespace pipetrain
