// End to end: a real coordinator and stage servers on loopback, driven through the
// `pipetrain` CLI, one cluster shared by the tests of this file. Pipelines of 4 stages
// (GPipe, 1F1B) give the losses of 1 stage; a checkpoint resumes exactly; the timeline
// has every stage's lanes; global-norm clipping on 2 and 4 stages gives the losses of 1
// stage, and really clips; a job on token files gives on 2 and 4 stages the losses of 1
// and resumes exactly; a Llama on 4 stages and on 2 x 2 replicas gives the losses of 1. The CLI verbs and the API: coordinator_cli_test.cc; faults:
// coordinator_faults_test.cc.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/loss_comparison.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tolerance.h"
#include "tests/testing/temp_files.h"
#include "tests/testing/token_files.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::Losses;
using ::pipetrain::testing::LossesDiffer;
using ::pipetrain::testing::LossesMatch;
using ::pipetrain::testing::kSameArithmetic;
using ::pipetrain::testing::SubmittedId;

// The job a pipeline must reproduce runs on 1 stage; `sets` make the pipeline.
class CoordinatorClusterTest : public testing::SharedClusterTest {
 protected:
  void SetUp() override {
    testing::SharedClusterTest::SetUp();
    // A warm-up longer than the resumed job's start, so that resuming must continue it.
    spec_["training"]["warmup_steps"] = 4;
  }

  std::string Reference() { return FinishedJob({}); }
  std::vector<double> ReferenceLosses() {
    const json reference = Status(*c_, Reference());
    EXPECT_EQ(reference["state"], "SUCCEEDED") << reference.dump();
    return Losses(reference);
  }

  // The losses of a job of spec_ on 2 stages started from the reference's step-2
  // checkpoint for the 2 steps left (none, with a failure, if it was not submitted).
  std::vector<double> LossesFromStep2() {
    const std::string ckpt = StateDir() + "/checkpoints/" + Reference() + "/step-2";
    auto r = c_->Cli({"submit", WriteSpec(spec_), "--set", "training.steps=2", "--set",
                      "pipeline.stages=2", "--init-from", ckpt});
    EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->out + r->err : r.status().ToString());
    if (!r.ok()) return {};
    const std::string resumed = SubmittedId(r->out.substr(0, r->out.find('\n')));
    EXPECT_FALSE(resumed.empty()) << r->out;
    if (resumed.empty()) return {};
    // Its steps are the training run's: 3 and 4, and so is its checkpoint.
    const json s = Status(*c_, resumed);
    EXPECT_EQ(s.value("first_step", ""), "3") << s.dump();
    EXPECT_EQ(s.value("steps_done", ""), "4");
    const json history = s.value("history", json::array());
    EXPECT_FALSE(history.empty());
    if (!history.empty()) {
      EXPECT_EQ(history[0].value("step", ""), "3");
    }
    EXPECT_THAT(s.value("checkpoint_dir", ""), ::testing::EndsWith("/step-4"));
    return Losses(s);
  }

  // The events of `id`'s Chrome trace, as `pipetrain timeline ID --out FILE FLAGS` writes it.
  json TraceEvents(const std::string& id, const std::vector<std::string>& flags) {
    std::vector<std::string> args = {"timeline", id, "--out", dir_.File("trace.json")};
    args.insert(args.end(), flags.begin(), flags.end());
    auto t = c_->Cli(args);
    EXPECT_TRUE(t.ok() && t->exit_code == 0) << (t.ok() ? t->err : t.status().ToString());
    if (!t.ok() || t->exit_code != 0) return json::array();
    json trace = json::parse(testing::ReadFileOrDie(dir_.File("trace.json")), nullptr, false);
    EXPECT_FALSE(trace.is_discarded());
    if (trace.is_discarded()) return json::array();
    return trace["traceEvents"];
  }
};

TEST_F(CoordinatorClusterTest, OneStageJobRecordsLossesValidationAndTimings) {
  const json reference = Status(*c_, Reference());
  EXPECT_EQ(reference["state"], "SUCCEEDED") << reference.dump();
  ASSERT_EQ(Losses(reference).size(), 4u);
  EXPECT_TRUE(reference["history"][1].contains("val_loss"));
  for (const char* field : {"step_time_s", "tokens_per_s", "bubble_measured", "bubble_predicted"}) {
    EXPECT_TRUE(reference["history"][0].contains(field)) << field;
  }
}

class CoordinatorPipelineTest : public CoordinatorClusterTest,
                                public ::testing::WithParamInterface<const char*> {};

TEST_P(CoordinatorPipelineTest, FourStagesGiveTheLossesOfOne) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  const std::string schedule = absl::StrCat("pipeline.schedule=", GetParam());
  const json s = Status(*c_, FinishedJob({"pipeline.stages=4", schedule}));
  EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
  EXPECT_EQ(s["stage_ids"].size(), 4u);
  EXPECT_TRUE(LossesMatch(Losses(s), ref, kSameArithmetic));
  EXPECT_GT(s["history"][3]["bubble_predicted"].get<double>(), 0);
}

INSTANTIATE_TEST_SUITE_P(Schedules, CoordinatorPipelineTest, ::testing::Values("gpipe", "1f1b"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

// Data-parallel replicas (R x K stage servers): R copies of the pipeline on their shares
// of each step's batch, averaging their gradients (gloo) before the optimizer, give the
// losses of one stage, for every schedule; R = 4 on one stage each too.
class CoordinatorReplicasTest : public CoordinatorClusterTest,
                                public ::testing::WithParamInterface<const char*> {};

TEST_P(CoordinatorReplicasTest, TwoReplicasOfTwoStagesGiveTheLossesOfOne) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  std::vector<std::string> sets = {"pipeline.replicas=2", "pipeline.stages=2",
                                   absl::StrCat("pipeline.schedule=", GetParam()),
                                   "pipeline.micro_batches=2"};
  if (std::string(GetParam()) == "interleaved") sets.push_back("pipeline.chunks=2");
  const std::string id = FinishedJob(sets);
  const json s = Status(*c_, id);
  EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
  EXPECT_EQ(s["stage_ids"].size(), 4u);
  EXPECT_TRUE(LossesMatch(Losses(s), ref, RegroupedTolerances(ref)));
  // CPU stages: every copy logs that gloo was chosen, and why.
  EXPECT_THAT(c_->stage_logs(), ::testing::HasSubstr(absl::StrCat(
                                    "job ", id,
                                    " stage 1 replica 1 of 2 reduces with gloo: replica 0 runs on cpu")));
}

INSTANTIATE_TEST_SUITE_P(Schedules, CoordinatorReplicasTest,
                         ::testing::Values("gpipe", "1f1b", "interleaved", "zb-h1"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& ch : n) if (ch == '-') ch = '_';
                           return n;
                         });

// The averaging of each layer starts during the backward; the tied embedding's waits
// for its exchange between the first and last stage, and clipping's global norm (the
// two-phase optimizer step) comes after it: still the losses of one stage. The copies
// split the optimizer (the default), so the norm sums every copy's pieces, also on one
// stage (R = 4 x K = 1); with shard_optimizer false each replica keeps all of it.
TEST_F(CoordinatorClusterTest, TwoReplicasWithTiedEmbeddingsAndClippingGiveTheLossesOfOne) {
  spec_["model"]["tie_embeddings"] = true;
  spec_["training"]["grad_clip_norm"] = 0.05;
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  const std::vector<std::vector<std::string>> layouts = {
      {"pipeline.replicas=2", "pipeline.stages=2", "pipeline.schedule=1f1b"},
      {"pipeline.replicas=2", "pipeline.stages=2", "pipeline.schedule=zb-h1"},
      {"pipeline.replicas=2", "pipeline.stages=2", "pipeline.shard_optimizer=false"},
      {"pipeline.replicas=4"}};
  for (std::vector<std::string> sets : layouts) {
    SCOPED_TRACE(absl::StrJoin(sets, " "));
    sets.push_back("pipeline.micro_batches=2");
    const json s = Status(*c_, FinishedJob(sets));
    EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
    EXPECT_TRUE(LossesMatch(Losses(s), ref, RegroupedTolerances(ref)));
  }
}

// `--set training.precision=bf16` through the CLI: 4 stages of 1F1B give 1 stage's bf16
// losses bit for bit (and not fp32's); `pipetrain cluster` says how each stage runs
// bf16 (a CPU stage: natively or on oneDNN's slower path).
TEST_F(CoordinatorClusterTest, Bf16PipelinesGiveTheLossesOfOneBf16Stage) {
  const std::vector<double> fp32 = ReferenceLosses();
  const json one = Status(*c_, FinishedJob({"training.precision=bf16"}));
  const json four = Status(*c_, FinishedJob({"training.precision=bf16", "pipeline.stages=4"}));
  EXPECT_EQ(one["state"], "SUCCEEDED") << one.dump();
  EXPECT_EQ(four["state"], "SUCCEEDED") << four.dump();
  EXPECT_TRUE(LossesMatch(Losses(four), Losses(one), kSameArithmetic));
  EXPECT_TRUE(LossesDiffer(Losses(one), fp32, 1, 0.0)) << "the bf16 job trained as fp32 does";
  auto cluster = c_->Cli({"cluster", "--json"});
  ASSERT_TRUE(cluster.ok() && cluster->exit_code == 0);
  const json stages = json::parse(cluster->out)["stages"];
  ASSERT_EQ(stages.size(), static_cast<size_t>(kStages));
  for (const json& s : stages) {
    const std::string bf16 = s["device"].value("bf16", "");
    EXPECT_TRUE(bf16 == "native" || bf16 == "slow") << s.dump();
  }
}

// Llama on the real binaries: grouped-query attention (4 query heads sharing
// 2 key/value heads), tied embeddings, rotary positions. 4 stages of ZB-H1 with every
// stage recomputing give one stage's losses bit for bit, in fp32 and in bf16; 2 replicas
// of 2 stages give them within the bound of the regrouped sums (fp32).
class CoordinatorLlamaTest : public CoordinatorClusterTest {
 protected:
  void SetUp() override {
    CoordinatorClusterTest::SetUp();
    spec_["model"]["architecture"] = "llama";
    spec_["model"]["n_heads"] = 4;
    spec_["model"]["n_kv_heads"] = 2;
    spec_["model"]["tie_embeddings"] = true;
  }

  void ExpectFourStagesRecomputingGiveTheLossesOfOne() {
    const std::vector<double> ref = ReferenceLosses();
    ASSERT_EQ(ref.size(), 4u);
    const json s = Status(*c_, FinishedJob({"pipeline.stages=4", "pipeline.schedule=zb-h1",
                                            "pipeline.recompute=always"}));
    EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
    EXPECT_EQ(s["spec"]["model"]["architecture"], "llama") << s.dump();
    EXPECT_EQ(s["spec"]["model"]["n_kv_heads"], 2) << s.dump();
    EXPECT_TRUE(LossesMatch(Losses(s), ref, kSameArithmetic));
  }
};

TEST_F(CoordinatorLlamaTest, FourStagesRecomputingGiveTheLossesOfOne) {
  ExpectFourStagesRecomputingGiveTheLossesOfOne();
}

TEST_F(CoordinatorLlamaTest, Bf16FourStagesRecomputingGiveTheLossesOfOneBitForBit) {
  spec_["training"]["precision"] = "bf16";
  ExpectFourStagesRecomputingGiveTheLossesOfOne();
}

TEST_F(CoordinatorLlamaTest, TwoReplicasOfTwoStagesGiveTheLossesOfOne) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  const json s = Status(*c_, FinishedJob({"pipeline.replicas=2", "pipeline.stages=2",
                                          "pipeline.schedule=1f1b", "pipeline.micro_batches=2"}));
  EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
  EXPECT_TRUE(LossesMatch(Losses(s), ref, RegroupedTolerances(ref)));
}

TEST_F(CoordinatorClusterTest, FourReplicasOfOneStageGiveTheLossesOfOne) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  const json s = Status(*c_, FinishedJob({"pipeline.replicas=4", "pipeline.micro_batches=2"}));
  EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
  EXPECT_EQ(s["stage_ids"].size(), 4u);
  EXPECT_TRUE(LossesMatch(Losses(s), ref, RegroupedTolerances(ref)));
  // Validation runs on every replica's share of the held-out batch: the same loss, up to
  // the drift of the weights it sees (one update more than step 4's training loss, taken
  // to move the loss as much as step 3's did).
  const json reference = Status(*c_, Reference());
  const double val = reference["history"][3]["val_loss"].get<double>();
  const double drift = RegroupedTolerances({ref[0], ref[1], ref[2], ref[3], 2 * ref[3] - ref[2]})[4];
  EXPECT_NEAR(s["history"][3]["val_loss"].get<double>(), val, drift * val);
}

// The replicas' checkpoint is one pipeline's (written from replica 0): the step-2
// checkpoint of an R = 2 x K = 2 job continues on one stage, R = 1, as the one-stage
// reference's steps 3 and 4.
TEST_F(CoordinatorClusterTest, AReplicasCheckpointContinuesOnAnotherLayout) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  const std::vector<double> tolerances = RegroupedTolerances(ref);  // of the replicas' run
  const std::string replicas =
      FinishedJob({"pipeline.replicas=2", "pipeline.stages=2", "pipeline.micro_batches=2"});
  const std::string ckpt = StateDir() + "/checkpoints/" + replicas + "/step-2";
  auto r = c_->Cli({"submit", WriteSpec(spec_), "--set", "training.steps=2", "--init-from", ckpt});
  ASSERT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->out + r->err : r.status().ToString());
  const std::string resumed = SubmittedId(r->out.substr(0, r->out.find('\n')));
  ASSERT_FALSE(resumed.empty()) << r->out;
  const json s = Status(*c_, resumed);
  EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
  EXPECT_EQ(s["stage_ids"].size(), 1u);
  EXPECT_TRUE(LossesMatch(Losses(s), {ref[2], ref[3]}, {tolerances[2], tolerances[3]}));
}

// A job started from the step-2 checkpoint of the reference runs its steps 3 and 4
// exactly (weights, AdamW state, data position and the warm-up all carry over).
TEST_F(CoordinatorClusterTest, AJobFromACheckpointContinuesItsLosses) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  EXPECT_TRUE(LossesMatch(LossesFromStep2(), {ref[2], ref[3]}, kSameArithmetic)) << "resumed";
}

// training.lr_schedule "cosine" down to min_lr 0 (no warm-up: the curve starts at the
// peak): each step's record has its rate, the last step's rate of 0 reaches every stage
// as a rate (validation after steps 3 and 4 sees the same weights), 4 stages give the
// losses of one, and a job from the step-2 checkpoint continues the curve at steps 3
// and 4 (numbered from 1, or ending at its own 2 steps, its step 3 would not get 0.0025).
TEST_F(CoordinatorClusterTest, ACosineDecayToZeroIsFollowedByEveryStageAndAResumedJob) {
  spec_["training"]["warmup_steps"] = 0;
  spec_["training"]["lr_schedule"] = "cosine";
  spec_["data"]["validate_every_steps"] = 1;
  const json reference = Status(*c_, Reference());
  ASSERT_EQ(reference["state"], "SUCCEEDED") << reference.dump();
  const json& h = reference["history"];
  ASSERT_EQ(h.size(), 4u);
  const double rates[] = {0.01, 0.0075, 0.0025, 0};  // 0.01 x (1 + cos(pi (s - 1) / 3)) / 2
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(h[i]["lr"].get<double>(), rates[i], 1e-9) << i;
  EXPECT_EQ(h[3]["lr"].get<double>(), 0.0);
  EXPECT_EQ(h[3]["val_loss"].get<double>(), h[2]["val_loss"].get<double>()) << "lr 0 at step 4";
  EXPECT_NE(h[2]["val_loss"].get<double>(), h[1]["val_loss"].get<double>());
  const std::vector<double> ref = Losses(reference);
  const json four = Status(*c_, FinishedJob({"pipeline.stages=4"}));
  EXPECT_EQ(four["state"], "SUCCEEDED") << four.dump();
  EXPECT_TRUE(LossesMatch(Losses(four), ref, kSameArithmetic));
  EXPECT_TRUE(LossesMatch(LossesFromStep2(), {ref[2], ref[3]}, kSameArithmetic)) << "resumed";
}

// The quickstart's job as a newcomer runs it (examples/tiny-gpt.json on the King James
// Bible from Debian's bible-kjv, 4 stages, 300 steps): its loss falls from the first step
// to the last without a spike (a learning rate of 3e-3 from the first step once sent the
// loss from 3.3 to 8 and back around steps 5 to 15), and every validation is lower than
// the one before. Skipped where `bible` is not installed.
TEST_F(CoordinatorClusterTest, TheQuickstartsJobFallsWithoutASpike) {
  const std::string corpus = SharedFile("kjv.txt");
  // Debian's bible-kjv installs the reader here (deploy/install-deps.sh installs it).
  const std::string reader = "/usr/bin/bible";
  if (access(reader.c_str(), X_OK) != 0) {
    GTEST_SKIP() << "needs Debian's bible-kjv (the quickstart's corpus): no " << reader;
  }
  auto bible = testing::RunCommand({reader, "-f", "gen1:1-rev22:21"}, std::chrono::seconds(60));
  ASSERT_TRUE(bible.ok()) << bible.status();
  ASSERT_EQ(bible->exit_code, 0) << bible->err;
  ASSERT_GT(bible->out.size(), 4u << 20) << "the whole King James Bible is 4.4 MB";
  testing::WriteFileOrDie(corpus, bible->out);
  spec_ = json::parse(testing::ReadFileOrDie(PIPETRAIN_EXAMPLES_DIR "/tiny-gpt.json"));
  spec_["data"]["corpus"] = corpus;
  const json s = Status(*c_, SubmitAndFollow(*c_, {}));
  ASSERT_EQ(s["state"], "SUCCEEDED") << s.dump();
  const std::vector<double> losses = Losses(s);
  ASSERT_EQ(losses.size(), 300u);
  // Step to step the loss wanders by about 0.2 (a batch of 16 rows of 64 bytes); the
  // spike it had was +4.4.
  for (size_t i = 1; i < losses.size(); ++i) {
    EXPECT_LT(losses[i] - losses[i - 1], 0.75) << "a spike at step " << i + 1;
  }
  auto mean = [&](size_t from, size_t to) {
    double sum = 0;
    for (size_t i = from; i < to; ++i) sum += losses[i];
    return sum / static_cast<double>(to - from);
  };
  // From about ln 256 = 5.55 (fresh weights give every byte nearly the same odds) to
  // below 2.4 (2.07 on the day the warm-up came).
  EXPECT_GT(losses[0], 5.3);
  EXPECT_LT(mean(280, 300), 2.4);
  for (size_t w = 50; w < 300; w += 50) EXPECT_LT(mean(w, w + 50), mean(w - 50, w)) << w;
  double previous = 1e9;
  int validations = 0;
  for (const json& r : s["history"]) {
    if (!r.value("has_val_loss", false)) continue;
    const double v = r["val_loss"].get<double>();
    EXPECT_LT(v, previous) << "validation at step " << r["step"];
    previous = v;
    ++validations;
  }
  EXPECT_EQ(validations, 6);
}

// The timeline of a 1F1B job: every stage's compute and link lanes.
TEST_F(CoordinatorClusterTest, TimelineHasALaneForEveryStage) {
  std::set<int> pids;
  for (const json& e :
       TraceEvents(FinishedJob({"pipeline.stages=4", "pipeline.schedule=1f1b"}), {})) {
    if (e["ph"] == "X") pids.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1, 2, 3}));
}

// The dashboard's Gantt draws the simulator's prediction of the latest step under the
// measured one: the same step, every stage, and each stage's actions.
TEST_F(CoordinatorClusterTest, ThePredictedTimelineIsTheLatestStepsActionsOnEveryStage) {
  const std::string id = FinishedJob({"pipeline.stages=4", "pipeline.schedule=1f1b"});
  httplib::Client http("127.0.0.1", c_->http_port());
  auto measured = http.Get("/api/jobs/" + id + "/timeline?steps=1");
  auto predicted = http.Get("/api/jobs/" + id + "/timeline?predicted=1");
  ASSERT_TRUE(measured && predicted);
  ASSERT_EQ(measured->status, 200) << measured->body;
  ASSERT_EQ(predicted->status, 200) << predicted->body;
  // ?predicted=0 (or false) is the measured timeline; anything else is refused by name.
  auto not_predicted = http.Get("/api/jobs/" + id + "/timeline?steps=1&predicted=false");
  ASSERT_TRUE(not_predicted);
  EXPECT_EQ(not_predicted->body, measured->body);
  auto unclear = http.Get("/api/jobs/" + id + "/timeline?predicted=maybe");
  ASSERT_TRUE(unclear);
  EXPECT_EQ(unclear->status, 400) << unclear->body;
  EXPECT_THAT(unclear->body, ::testing::HasSubstr("predicted: 'maybe'"));
  // Per stage, its actions sorted (links report when they end, not in program order).
  const auto by_stage = [](const json& timeline, std::set<std::string>* steps) {
    std::map<int, std::vector<std::string>> kinds;
    for (const json& e : timeline.value("events", json::array())) {
      steps->insert(e.value("step", "?"));
      const json action = e.value("action", json::object());
      kinds[e.value("stage", 0)].push_back(action.value("kind", "?") + "/" +
                                           std::to_string(action.value("micro_batch", 0)));
    }
    for (auto& [stage, list] : kinds) std::sort(list.begin(), list.end());
    return kinds;
  };
  std::set<std::string> measured_steps, predicted_steps;
  const auto m = by_stage(json::parse(measured->body), &measured_steps);
  const auto p = by_stage(json::parse(predicted->body), &predicted_steps);
  EXPECT_EQ(measured_steps, std::set<std::string>{"4"});
  EXPECT_EQ(predicted_steps, measured_steps);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p, m);
  // Fitted from the steps measured before it: about as long as the measured step (the
  // planner's own guess for this tiny model, before any measurement, is far shorter).
  const auto step_end_us = [](const json& timeline) {
    int64_t end = 0;
    for (const json& e : timeline.value("events", json::array())) {
      end = std::max<int64_t>(end, std::stoll(e.value("end_us", "0")));
    }
    return end;
  };
  const int64_t measured_end = step_end_us(json::parse(measured->body));
  const int64_t predicted_end = step_end_us(json::parse(predicted->body));
  EXPECT_GT(predicted_end, measured_end / 10) << predicted->body.substr(0, 600);
  EXPECT_LT(predicted_end, measured_end * 10) << predicted->body.substr(0, 600);
}

// Global-norm clipping small enough to clip every step: with 2 and 4 stages (GPipe and
// 1F1B) each step runs in two phases (the coordinator sums the stages' norms, then every
// stage applies its optimizer) and gives the losses of 1 stage, where the stage clips by
// its own norm.
class CoordinatorClippingTest : public CoordinatorClusterTest {
 protected:
  void SetUp() override {
    testing::SharedClusterTest::SetUp();  // no warm-up: the clipping alone shapes the steps
    spec_["training"]["grad_clip_norm"] = 0.05;
  }
};

TEST_F(CoordinatorClippingTest, ClippedPipelinesGiveTheLossesOfOneStage) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  for (const char* stages : {"2", "4"}) {
    for (const char* schedule : {"gpipe", "1f1b"}) {
      SCOPED_TRACE(absl::StrCat(stages, " stages ", schedule));
      const json s = Status(*c_, FinishedJob({absl::StrCat("pipeline.stages=", stages),
                                              absl::StrCat("pipeline.schedule=", schedule)}));
      EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
      EXPECT_TRUE(LossesMatch(Losses(s), ref, kSameArithmetic));
    }
  }
}

// Without clipping the losses differ, so clipping really acts. Step 1's loss comes
// before any update, and AdamW's first update does not depend on the gradient's scale
// (only through eps), so step 2 barely moves. From step 3 on the clipped updates (a
// different scale every step) differ from the free ones by far more than the tolerance
// the pipelines meet.
TEST_F(CoordinatorClippingTest, ClippingChangesTheLosses) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  const std::vector<double> free = Losses(Status(*c_, FinishedJob({"training.grad_clip_norm=0"})));
  EXPECT_TRUE(LossesDiffer(free, ref, 3, 1e-3)) << "clipping to 0.05 changed nothing";
}

// The optimizer action still shows on every stage's timeline, once a step.
TEST_F(CoordinatorClippingTest, EveryStageRunsItsOptimizerEveryStep) {
  std::map<int, int> optimizer_steps;  // by stage
  for (const json& e : TraceEvents(FinishedJob({"pipeline.stages=4", "pipeline.schedule=1f1b"}),
                                   {"--steps", "4"})) {
    if (e["ph"] == "X" && e["name"] == "OPT") ++optimizer_steps[e["pid"].get<int>()];
  }
  EXPECT_EQ(optimizer_steps, (std::map<int, int>{{0, 4}, {1, 4}, {2, 4}, {3, 4}}));
}

// Tied embeddings through the real cluster: the first and last stage swap their
// gradients of the shared matrix over the ring link each step, so 4 stages give the
// losses of 1; a job started from a tied checkpoint (whose head-stage file carries its
// copy) continues them; and tying changes the losses, so it really acts.
class CoordinatorTiedTest : public CoordinatorClusterTest {
 protected:
  void SetUp() override {
    CoordinatorClusterTest::SetUp();
    spec_["model"]["tie_embeddings"] = true;
  }
};

TEST_F(CoordinatorTiedTest, FourStagesGiveTheLossesOfOneAndAResumedJobContinues) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  for (const char* schedule : {"1f1b", "zb-h1"}) {
    SCOPED_TRACE(schedule);
    const json s = Status(
        *c_, FinishedJob({"pipeline.stages=4", absl::StrCat("pipeline.schedule=", schedule)}));
    EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
    EXPECT_TRUE(LossesMatch(Losses(s), ref, kSameArithmetic));
  }
  // From the 4-stage job's step-2 checkpoint onto 2 stages.
  const std::string four = FinishedJob({"pipeline.stages=4", "pipeline.schedule=1f1b"});
  const std::string ckpt = StateDir() + "/checkpoints/" + four + "/step-2";
  auto r = c_->Cli({"submit", WriteSpec(spec_), "--set", "training.steps=2", "--set",
                    "pipeline.stages=2", "--init-from", ckpt});
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->exit_code, 0) << r->out << r->err;
  const std::string resumed = SubmittedId(r->out.substr(0, r->out.find('\n')));
  EXPECT_TRUE(LossesMatch(Losses(Status(*c_, resumed)), {ref[2], ref[3]}, kSameArithmetic))
      << "resumed";
}

TEST_F(CoordinatorTiedTest, TyingChangesTheLosses) {
  const std::vector<double> tied = ReferenceLosses();
  const std::vector<double> untied =
      Losses(Status(*c_, FinishedJob({"model.tie_embeddings=false"})));
  // Both start near ln(256) (small initial logits either way) and the first updates
  // are alike; from step 3 on the shared matrix's summed updates have moved it apart.
  EXPECT_TRUE(LossesDiffer(untied, tied, 3, 1e-3)) << "tie_embeddings changed nothing";
}

// A job on llm.c token files (two shards by a glob, a separate validation file; ids
// drawn at random below a vocabulary of 512): 2 and 4 stages give the losses of 1, and a
// job from its step-2 checkpoint continues them exactly, as a text's job does.
class CoordinatorTokenFileTest : public CoordinatorClusterTest {
 protected:
  void SetUp() override {
    CoordinatorClusterTest::SetUp();
    // Written once; jobs shared between tests (and resumed ones) read them later.
    static const bool written = [] {
      testing::WriteFileOrDie(SharedFile("tokens_train_000.bin"),
                              testing::LlmcBytes(testing::RandomTokens(6000, 512, 1)));
      testing::WriteFileOrDie(SharedFile("tokens_train_001.bin"),
                              testing::LlmcBytes(testing::RandomTokens(6000, 512, 2)));
      testing::WriteFileOrDie(SharedFile("tokens_val.bin"),
                              testing::LlmcBytes(testing::RandomTokens(1000, 512, 3)));
      return true;
    }();
    (void)written;
    spec_["model"]["vocab_size"] = 512;
    spec_["data"].erase("corpus");
    spec_["data"]["tokens"] = json::array({SharedFile("tokens_train_*.bin")});
    spec_["data"]["validation_tokens"] = SharedFile("tokens_val.bin");  // one string
  }
};

TEST_F(CoordinatorTokenFileTest, PipelinesGiveTheLossesOfOneStageAndResumeExactly) {
  const json reference = Status(*c_, Reference());
  ASSERT_EQ(reference["state"], "SUCCEEDED") << reference.dump();
  EXPECT_EQ(reference["spec"]["data"]["format"], "llmc");
  EXPECT_TRUE(reference["history"][1].contains("val_loss"));
  const std::vector<double> ref = Losses(reference);
  ASSERT_EQ(ref.size(), 4u);
  for (const char* stages : {"2", "4"}) {
    SCOPED_TRACE(absl::StrCat(stages, " stages"));
    const json s = Status(
        *c_, FinishedJob({absl::StrCat("pipeline.stages=", stages), "pipeline.schedule=1f1b"}));
    EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
    EXPECT_TRUE(LossesMatch(Losses(s), ref, kSameArithmetic));
  }
  EXPECT_TRUE(LossesMatch(LossesFromStep2(), {ref[2], ref[3]}, kSameArithmetic)) << "resumed";
}

// A bad token file fails the submit, naming the field and the file, before it is queued.
TEST_F(CoordinatorTokenFileTest, ABadTokenFileFailsTheSubmit) {
  testing::WriteFileOrDie(dir_.File("raw.bin"),
                          testing::NanoGptBytes(testing::RandomTokens(3000, 512, 4)));
  auto r = c_->Cli({"submit", WriteSpec(spec_), "--set", "data.tokens=" + dir_.File("raw.bin")});
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->exit_code, 0) << r->out;
  EXPECT_THAT(r->err, ::testing::AllOf(::testing::HasSubstr("data.tokens"),
                                       ::testing::HasSubstr(dir_.File("raw.bin")),
                                       ::testing::HasSubstr("data.format: \"nanogpt\"")));
  r = c_->Cli({"submit", WriteSpec(spec_), "--set", "model.vocab_size=300"});
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->exit_code, 0) << r->out;
  EXPECT_THAT(r->err, ::testing::AllOf(::testing::HasSubstr("data.tokens"),
                                       ::testing::HasSubstr("tokens_train_000.bin"),
                                       ::testing::HasSubstr("model.vocab_size = 300")));
}

// GPT-2's shape on token files: a 50,257-token vocabulary (ids up to <|endoftext|>
// drawn at random, so the embedding's and the head's last rows are used) with tied
// embeddings, in llm.c's format. 4 stages give the losses of 1 and a job from the
// step-2 checkpoint continues them: the bar for GPT-2-shaped training.
class CoordinatorGpt2ShapeTest : public CoordinatorClusterTest {
 protected:
  void SetUp() override {
    CoordinatorClusterTest::SetUp();
    static const bool written = [] {
      std::vector<uint16_t> tokens = testing::RandomTokens(4000, 50257, 11);
      tokens[100] = 50256;  // the highest id
      testing::WriteFileOrDie(SharedFile("gpt2_train.bin"), testing::LlmcBytes(tokens));
      return true;
    }();
    (void)written;
    spec_["model"]["vocab_size"] = 50257;
    spec_["model"]["tie_embeddings"] = true;
    spec_["data"].erase("corpus");
    spec_["data"]["tokens"] = SharedFile("gpt2_train.bin");
  }
};

TEST_F(CoordinatorGpt2ShapeTest, FourStagesGiveTheLossesOfOneAndAResumedJobContinues) {
  const std::vector<double> ref = ReferenceLosses();
  ASSERT_EQ(ref.size(), 4u);
  EXPECT_NEAR(ref[0], std::log(50257.0), 0.1);  // a fresh model is near uniform
  const json s = Status(*c_, FinishedJob({"pipeline.stages=4", "pipeline.schedule=1f1b"}));
  EXPECT_EQ(s["state"], "SUCCEEDED") << s.dump();
  EXPECT_TRUE(LossesMatch(Losses(s), ref, kSameArithmetic));
  EXPECT_TRUE(LossesMatch(LossesFromStep2(), {ref[2], ref[3]}, kSameArithmetic)) << "resumed";
}

}  // namespace
}  // namespace pipetrain
