// End to end: a real coordinator and stage servers on loopback, driven through the
// `pipetrain` CLI. Pipelines of 4 stages (GPipe, 1F1B) give the losses of 1 stage; a
// checkpoint resumes exactly; submit/status/list/cancel/resume/timeline/logs and the
// HTTP API work; bad specs, unknown ids and unreachable coordinators get their exit
// codes; a restarted coordinator still lists finished jobs; a killed stage fails its job with a
// reason naming it and the other stages take the next job, and so does a frozen one
// (SIGSTOP) within the stage deadline; global-norm clipping on 2 and 4 stages gives the
// losses of 1 stage; GET /metrics agrees with `pipetrain status`.
#include <signal.h>

#include <cmath>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "tests/testing/local_cluster.h"
#include "tests/testing/corpus_text.h"
#include "tests/testing/temp_files.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::LocalClusterOptions;
using ::pipetrain::testing::RunResult;
using ::pipetrain::testing::TempDir;
using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace std::chrono_literals;

class CoordinatorClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFileOrDie(dir_.File("corpus.txt"), testing::EnglishLikeCorpus());
    spec_ = {
        {"name", "e2e"},
        {"model", {{"vocab_size", 256}, {"seq_len", 16}, {"d_model", 32}, {"n_heads", 2},
                   {"n_layers", 2}}},
        {"pipeline", {{"stages", 1}, {"micro_batches", 4}, {"schedule", "gpipe"}}},
        {"training", {{"steps", 4}, {"batch_size", 8}, {"seed", 7}, {"lr", 0.01},
                      {"weight_decay", 0.0}}},
        {"data", {{"corpus", dir_.File("corpus.txt")}, {"validate_every_steps", 2}}},
        {"checkpoint", {{"every_steps", 2}}}};
  }

  std::string WriteSpec(const json& spec, const std::string& name = "job.json") {
    testing::WriteFileOrDie(dir_.File(name), spec.dump(2));
    return dir_.File(name);
  }

  // `pipetrain status ID --json`, parsed.
  json Status(LocalCluster& c, const std::string& id) {
    auto r = c.Cli({"status", id, "--json"});
    EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.status().ToString());
    json j = json::parse(r.ok() ? r->out : "", nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << (r.ok() ? r->out : "");
    return j;
  }

  std::vector<double> Losses(const json& status) {
    std::vector<double> out;
    for (const json& h : status["history"]) out.push_back(h["loss"].get<double>());
    return out;
  }

  // Submits with the given overrides and follows the job to its end.
  std::string SubmitAndFollow(LocalCluster& c, const std::vector<std::string>& sets,
                              int expect_exit = 0) {
    std::vector<std::string> args = {"submit", WriteSpec(spec_)};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    auto r = c.Cli(args);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    EXPECT_EQ(r->exit_code, expect_exit) << r->out << r->err;
    // "submitted job-000001 (...)" is the first line.
    const std::string first = r->out.substr(0, r->out.find('\n'));
    EXPECT_THAT(first, HasSubstr("submitted job-")) << r->out;
    std::vector<std::string> words = absl::StrSplit(first, ' ');
    return words.size() > 1 ? words[1] : "";
  }

  std::string SubmitNoWait(LocalCluster& c, const std::vector<std::string>& sets) {
    std::vector<std::string> args = {"submit", WriteSpec(spec_), "--no-wait"};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    auto r = c.Cli(args);
    EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.status().ToString());
    return r.ok() ? std::string(absl::StripAsciiWhitespace(r->out)) : "";
  }

  // The address of a registered stage, from `pipetrain cluster --json` ("" if absent).
  std::string StageAddress(LocalCluster& c, const std::string& stage_id) {
    auto view = c.Cli({"cluster", "--json"});
    EXPECT_TRUE(view.ok() && view->exit_code == 0);
    if (!view.ok()) return "";
    const json stages = json::parse(view->out, nullptr, false);
    if (stages.is_discarded()) return "";
    for (const json& s : stages["stages"]) {
      if (s["stage_id"] == stage_id) return s["address"];
    }
    return "";
  }

  // Polls status until `pred` holds (deadline 60 s).
  template <typename Pred>
  json WaitFor(LocalCluster& c, const std::string& id, Pred pred) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    json s;
    while (std::chrono::steady_clock::now() < deadline) {
      s = Status(c, id);
      if (pred(s)) return s;
      std::this_thread::sleep_for(100ms);
    }
    ADD_FAILURE() << "job " << id << " never reached the wanted state: " << s.dump();
    return s;
  }

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

  TempDir dir_;
  json spec_;
};

void ExpectSameLosses(const std::vector<double>& a, const std::vector<double>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LT(std::abs(a[i] - b[i]) / std::abs(b[i]), 1e-5)
        << what << " step " << i + 1 << ": " << a[i] << " vs " << b[i];
  }
}

TEST_F(CoordinatorClusterTest, PipelinesMatchOneStageAndTheCliAndApiWork) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  // A warm-up longer than the resumed job's start, so that resuming must continue it.
  spec_["training"]["warmup_steps"] = 4;

  const std::string one = SubmitAndFollow(c, {});
  const json reference = Status(c, one);
  EXPECT_EQ(reference["state"], "SUCCEEDED") << reference.dump();
  const std::vector<double> ref = Losses(reference);
  ASSERT_EQ(ref.size(), 4u);
  EXPECT_TRUE(reference["history"][1].contains("val_loss"));
  for (const char* field : {"step_time_s", "tokens_per_s", "bubble_measured", "bubble_predicted"}) {
    EXPECT_TRUE(reference["history"][0].contains(field)) << field;
  }

  for (const char* schedule : {"gpipe", "1f1b"}) {
    const std::string id = SubmitAndFollow(
        c, {"pipeline.stages=4", absl::StrCat("pipeline.schedule=", schedule)});
    const json s = Status(c, id);
    EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
    EXPECT_EQ(s["stage_ids"].size(), 4u);
    ExpectSameLosses(Losses(s), ref, schedule);
    EXPECT_GT(s["history"][3]["bubble_predicted"].get<double>(), 0);
  }

  // Resume: a job started from the step-2 checkpoint of the first job runs its steps 3
  // and 4 exactly (weights, AdamW state, data position and the warm-up all carry over).
  const std::string ckpt = dir_.File("state") + "/checkpoints/" + one + "/step-2";
  {
    auto r = c.Cli({"submit", WriteSpec(spec_), "--set", "training.steps=2", "--set",
                    "pipeline.stages=2", "--init-from", ckpt});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
    std::vector<std::string> words = absl::StrSplit(r->out.substr(0, r->out.find('\n')), ' ');
    ASSERT_GT(words.size(), 1u);
    ExpectSameLosses(Losses(Status(c, words[1])), {ref[2], ref[3]}, "resumed");
  }

  // Timeline of the last 1F1B job: every stage's compute and link lanes.
  const std::string last = SubmitAndFollow(c, {"pipeline.stages=4", "pipeline.schedule=1f1b"});
  auto t = c.Cli({"timeline", last, "--out", dir_.File("trace.json")});
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->exit_code, 0) << t->err;
  json trace = json::parse(testing::ReadFileOrDie(dir_.File("trace.json")), nullptr, false);
  ASSERT_FALSE(trace.is_discarded());
  std::set<int> pids;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X") pids.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3}));

  // Cancel a long job while it runs; list shows it.
  spec_["training"]["steps"] = 100000;
  const std::string long_job = SubmitNoWait(c, {"pipeline.stages=2"});
  WaitFor(c, long_job, [](const json& s) { return s.value("steps_done", "0") != "0"; });
  auto cancel = c.Cli({"cancel", long_job});
  ASSERT_TRUE(cancel.ok());
  EXPECT_EQ(cancel->exit_code, 0) << cancel->err;
  const json cancelled = WaitFor(c, long_job, [](const json& s) { return s["state"] == "CANCELLED"; });
  EXPECT_FALSE(cancelled["checkpoint_dir"].get<std::string>().empty()) << "cancel keeps the work";
  auto logs = c.Cli({"logs", long_job});
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(logs->out, HasSubstr("cancel"));
  auto list = c.Cli({"list"});
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(list->out, HasSubstr(long_job));
  EXPECT_THAT(list->out, HasSubstr("CANCELLED"));

  // The HTTP API serves the same records.
  httplib::Client http("127.0.0.1", c.http_port());
  auto jobs = http.Get("/api/jobs");
  ASSERT_TRUE(jobs);
  EXPECT_EQ(jobs->status, 200);
  EXPECT_THAT(jobs->body, HasSubstr(long_job));
  auto job = http.Get(("/api/jobs/" + one).c_str());
  ASSERT_TRUE(job);
  EXPECT_THAT(job->body, HasSubstr("bubble_measured"));
  auto cl = http.Get("/api/cluster");
  ASSERT_TRUE(cl);
  EXPECT_EQ(json::parse(cl->body)["stages"].size(), 4u);
  auto missing = http.Get("/api/jobs/job-999999");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);

  // GET /metrics says what `pipetrain status` says, and keeps series only for the five
  // latest finished jobs (the first of six has none).
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

  // `pipetrain resume`: the cancelled job continues from its checkpoint (2 steps here,
  // not its 100000); a job that succeeded has nothing left.
  {
    auto r = c.Cli({"resume", long_job, "--set", "training.steps=2"});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
    EXPECT_THAT(r->out, HasSubstr(absl::StrCat("resuming ", long_job, " from ",
                                               cancelled["checkpoint_dir"].get<std::string>())));
    const std::string first = r->out.substr(r->out.find("submitted job-"));
    std::vector<std::string> words = absl::StrSplit(first.substr(0, first.find('\n')), ' ');
    ASSERT_GT(words.size(), 1u);
    const json resumed = Status(c, words[1]);
    EXPECT_EQ(resumed["state"], "SUCCEEDED") << resumed.dump();
    EXPECT_EQ(resumed["spec"]["init_from"], cancelled["checkpoint_dir"]);
    auto done = c.Cli({"resume", one});
    ASSERT_TRUE(done.ok());
    EXPECT_EQ(done->exit_code, 2);
    EXPECT_THAT(done->err, HasSubstr("no steps left"));
  }

  // Errors and their exit codes.
  json bad = spec_;
  bad["pipeline"]["stagse"] = 2;
  auto unknown = c.Cli({"submit", WriteSpec(bad, "bad.json")});
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(unknown->exit_code, 2);
  EXPECT_THAT(unknown->err, HasSubstr("pipeline.stagse"));
  auto indivisible = c.Cli({"submit", WriteSpec(spec_), "--set", "training.batch_size=10"});
  ASSERT_TRUE(indivisible.ok());
  EXPECT_EQ(indivisible->exit_code, 2);
  EXPECT_THAT(indivisible->err, HasSubstr("training.batch_size"));
  auto no_corpus = c.Cli({"submit", WriteSpec(spec_), "--set", "data.corpus=/no/such/file"});
  ASSERT_TRUE(no_corpus.ok());
  EXPECT_EQ(no_corpus->exit_code, 2);
  EXPECT_THAT(no_corpus->err, HasSubstr("data.corpus"));
  auto unknown_id = c.Cli({"status", "job-999999"});
  ASSERT_TRUE(unknown_id.ok());
  EXPECT_EQ(unknown_id->exit_code, 2);
  EXPECT_THAT(unknown_id->err, HasSubstr("job-999999"));

  // A restarted coordinator still lists the finished jobs.
  absl::Status restarted = c.RestartCoordinator(4);
  ASSERT_TRUE(restarted.ok()) << restarted;
  auto after = c.Cli({"list", "--json"});
  ASSERT_TRUE(after.ok());
  EXPECT_THAT(after->out, HasSubstr(one));
  EXPECT_EQ(Status(c, one)["state"], "SUCCEEDED");
  ExpectSameLosses(Losses(Status(c, one)), ref, "after restart");
}

// Global-norm clipping small enough to clip every step: with 2 and 4 stages (GPipe and
// 1F1B) each step runs in two phases (the coordinator sums the stages' norms, then every
// stage applies its optimizer) and gives the losses of 1 stage, where the stage clips by
// its own norm; without clipping the losses differ, so clipping really acts. The
// optimizer action still shows on every stage's timeline.
TEST_F(CoordinatorClusterTest, GlobalNormClippingAcrossStagesMatchesOneStage) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  spec_["training"]["grad_clip_norm"] = 0.05;

  const std::string one = SubmitAndFollow(c, {});
  const json reference = Status(c, one);
  ASSERT_EQ(reference["state"], "SUCCEEDED") << reference.dump();
  const std::vector<double> ref = Losses(reference);
  ASSERT_EQ(ref.size(), 4u);

  std::string last;
  for (const char* stages : {"2", "4"}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      const std::string what = absl::StrCat(stages, " stages ", schedule);
      last = SubmitAndFollow(c, {absl::StrCat("pipeline.stages=", stages),
                                 absl::StrCat("pipeline.schedule=", schedule)});
      const json s = Status(c, last);
      EXPECT_EQ(s["state"], "SUCCEEDED") << what << ": " << s.dump();
      ExpectSameLosses(Losses(s), ref, what);
    }
  }

  const std::string unclipped = SubmitAndFollow(c, {"training.grad_clip_norm=0"});
  const std::vector<double> free = Losses(Status(c, unclipped));
  ASSERT_EQ(free.size(), ref.size());
  // Step 1's loss comes before any update, and AdamW's first update does not depend on
  // the gradient's scale (only through eps), so step 2 barely moves. From step 3 on the
  // clipped updates (a different scale every step) differ from the free ones by far
  // more than the tolerance the pipelines meet.
  for (size_t i = 2; i < free.size(); ++i) {
    EXPECT_GT(std::abs(free[i] - ref[i]) / std::abs(ref[i]), 1e-3)
        << "step " << i + 1 << ": clipping to 0.05 changed nothing: " << free[i] << " vs "
        << ref[i];
  }

  auto t = c.Cli({"timeline", last, "--steps", "4", "--out", dir_.File("clipped.json")});
  ASSERT_TRUE(t.ok());
  ASSERT_EQ(t->exit_code, 0) << t->err;
  json trace = json::parse(testing::ReadFileOrDie(dir_.File("clipped.json")), nullptr, false);
  ASSERT_FALSE(trace.is_discarded());
  std::map<int, int> optimizer_steps;  // by stage
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["name"] == "OPT") ++optimizer_steps[e["pid"].get<int>()];
  }
  EXPECT_EQ(optimizer_steps, (std::map<int, int>{{0, 4}, {1, 4}, {2, 4}, {3, 4}}));
}

TEST_F(CoordinatorClusterTest, UnreachableCoordinatorExitsThree) {
  auto r = testing::RunCommand({std::string(PIPETRAIN_BIN_DIR) + "/pipetrain", "list",
                                "--address", "127.0.0.1:1"}, 30s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_THAT(r->err, HasSubstr("cannot reach the coordinator"));
}

TEST_F(CoordinatorClusterTest, AKilledStageFailsItsJobAndTheOthersServeTheNext) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 4);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  spec_["training"]["steps"] = 100000;
  spec_["data"]["validate_every_steps"] = 0;
  spec_["checkpoint"]["every_steps"] = 0;
  const std::string id = SubmitNoWait(c, {"pipeline.stages=4"});
  const json running = WaitFor(c, id, [](const json& s) { return s.value("steps_done", "0") != "0"; });
  const std::string victim = running["stage_ids"][2];
  const std::string victim_address = StageAddress(c, victim);
  ASSERT_TRUE(c.KillStage(victim_address)) << victim << " at '" << victim_address << "'";
  const json failed = WaitFor(c, id, [](const json& s) { return s["state"] == "FAILED"; });
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

// A stage that stops answering without dying (SIGSTOP: its sockets stay open, as with
// a hung process or a wedged GPU) must fail its job, naming it, not hang the pipeline.
TEST_F(CoordinatorClusterTest, AFrozenStageFailsItsJobWithinTheDeadlineNamingIt) {
  LocalClusterOptions options;
  options.coordinator_args = {"--stage-deadline", "3"};
  auto cluster = LocalCluster::Start(dir_.File("state"), 3, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  spec_["training"]["steps"] = 100000;
  spec_["data"]["validate_every_steps"] = 0;
  spec_["checkpoint"]["every_steps"] = 0;
  const std::string id = SubmitNoWait(c, {"pipeline.stages=3", "pipeline.schedule=1f1b"});
  const json running = WaitFor(c, id, [](const json& s) { return s.value("steps_done", "0") != "0"; });
  const std::string victim = running["stage_ids"][1];
  const std::string victim_address = StageAddress(c, victim);
  ASSERT_TRUE(c.SignalStage(victim_address, SIGSTOP)) << victim << " at '" << victim_address << "'";
  const auto frozen_at = std::chrono::steady_clock::now();
  const json failed = WaitFor(c, id, [](const json& s) { return s["state"] == "FAILED"; });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen_at).count();
  EXPECT_EQ(failed["state"], "FAILED");
  EXPECT_THAT(failed["reason"].get<std::string>(), HasSubstr(victim)) << failed.dump();
  // --stage-deadline 3: the neighbours give up after 3 s, then the coordinator finds
  // which stage stopped answering.
  EXPECT_LT(took, 20.0) << failed.dump();
  ASSERT_TRUE(c.KillStage(victim_address));  // a stopped process still takes SIGKILL

  absl::Status idle = c.WaitForIdleStages(2);
  ASSERT_TRUE(idle.ok()) << idle;
  spec_["training"]["steps"] = 2;
  const std::string next = SubmitAndFollow(c, {"pipeline.stages=2"});
  EXPECT_EQ(Status(c, next)["state"], "SUCCEEDED");
}

TEST_F(CoordinatorClusterTest, JobsShareTheClusterSideBySideAndQueueForFreeStages) {
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
  // A spec the cluster can never run is refused up front, naming the field.
  auto follow = c.Cli({"submit", WriteSpec(spec_), "--set", "training.steps=1", "--set",
                       "pipeline.stages=5"});
  ASSERT_TRUE(follow.ok());
  EXPECT_EQ(follow->exit_code, 2) << "5 stages of a 4-layer pipeline: " << follow->err;
  EXPECT_THAT(follow->err, HasSubstr("pipeline.stages"));
}

TEST_F(CoordinatorClusterTest, AModelTooBigForTheStagesIsRefusedNamingTheMemory) {
  auto cluster = LocalCluster::Start(dir_.File("state"), 2, {"--memory-limit", "100000"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto r = (*cluster)->Cli({"submit", WriteSpec(spec_), "--set", "pipeline.stages=2"});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2) << r->out;
  EXPECT_THAT(r->err, HasSubstr("does not fit the stages' memory"));
  EXPECT_THAT(r->err, HasSubstr("pipeline.recompute"));
}

}  // namespace
}  // namespace pipetrain
