#include "coordinator/planner/plan_report.h"

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "coordinator/planner/generators.h"
#include "coordinator/planner/lowering.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::planner {
namespace {

using ::testing::HasSubstr;

SimulationResult Sim(ScheduleKind kind, int k, int m) {
  auto s = Simulate(Lower(*Generate(kind, k, m)), EqualStageCost(k));
  EXPECT_TRUE(s.ok());
  return *s;
}

TEST(PlanReportTest, PictureHasOneRowPerStageAndBubblesAsDots) {
  EXPECT_EQ(RenderPicture(Sim(ScheduleKind::kGpipe, 2, 2), 2),
            "stage 0 | F0 F1 .  .  .  B0 B0 B1 B1\n"
            "stage 1 | .  F0 F1 B0 B0 B1 B1 .  .\n");
  EXPECT_EQ(RenderPicture(Sim(ScheduleKind::kZbH1, 2, 2), 2),
            "stage 0 | F0 F1 .  I0 W0 I1 W1\n"
            "stage 1 | .  F0 I0 F1 I1 W0 W1\n");
}

TEST(PlanReportTest, WideTimelinesAreScaledDown) {
  const std::string picture = RenderPicture(Sim(ScheduleKind::kGpipe, 2, 16), 2, 20);
  const std::string first_row = picture.substr(0, picture.find('\n'));
  EXPECT_LE(first_row.size(), std::string("stage 0 |").size() + 20 * 4);
}

TEST(PlanReportTest, ChromeTraceHasStageProcessesAndCompleteEvents) {
  const SimulationResult sim = Sim(ScheduleKind::kOneFOneB, 2, 2);
  const nlohmann::json trace = nlohmann::json::parse(ChromeTrace(sim, 2));
  int names = 0, computes = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "M") {
      EXPECT_EQ(e["name"], "process_name");
      EXPECT_EQ(e["args"]["name"], "stage " + std::to_string(e["pid"].get<int>()));
      ++names;
    } else {
      EXPECT_EQ(e["ph"], "X");
      EXPECT_GE(e["dur"].get<double>(), 0);
      if (e["name"] == "B1" && e["pid"] == 0) {
        EXPECT_DOUBLE_EQ(e["ts"].get<double>(), 7e6);  // B1 on stage 0 starts at 7 units
        EXPECT_DOUBLE_EQ(e["dur"].get<double>(), 2e6);
      }
      if (e["cat"] == "compute") ++computes;
    }
  }
  EXPECT_EQ(names, 2);
  EXPECT_EQ(computes, 2 * (4 + 1));  // F, B per micro-batch and OPT, per stage
}

// A 2-block model on 2 stages, 2 micro-batches of 2 sequences per replica.
PlanOptions TwoStages(int replicas) {
  PlanOptions o;
  o.model = {.vocab_size = 256, .seq_len = 32, .d_model = 64, .n_heads = 4, .n_layers = 2};
  o.stages = 2;
  o.micro_batches = 2;
  o.replicas = replicas;
  o.batch_size = 4 * replicas;
  return o;
}

TEST(PlanReportTest, SnapshotBytesAreShownInTextAndJson) {
  PlanOptions o = TwoStages(1);
  o.snapshots = true;
  auto plan = MakePlan(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const nlohmann::json j = nlohmann::json::parse(PlanJson(*plan));
  EXPECT_TRUE(j["snapshots"].get<bool>());
  for (int s = 0; s < 2; ++s) {
    const nlohmann::json& st = j["stages"][s];
    EXPECT_EQ(st["snapshot_bytes"].get<double>(), plan->stages[s].snapshot_bytes);
    EXPECT_GT(st["snapshot_bytes"].get<double>(), 0);
    EXPECT_EQ(st["peak_memory_bytes"].get<double>(),
              st["state_bytes"].get<double>() + st["snapshot_bytes"].get<double>() +
                  st["peak_activation_bytes"].get<double>());
  }
  const std::string text = RenderPlanText(*plan);
  EXPECT_THAT(text, HasSubstr("snapshots"));
  EXPECT_THAT(text, HasSubstr("snapshots = 2 steps x 12 bytes per parameter"));
}

// The precision's bytes (common/model/precision.h) are in the text and the JSON: fp32
// state a parameter (16 bytes) and, in bf16, the products' 2-byte copy of the weight;
// activations 4 bytes stored (in bf16 2 for those kept only for the products), 4 or 2
// between stages.
TEST(PlanReportTest, PrecisionBytesAreShownInTextAndJson) {
  struct Row {
    const char* name;
    int state, wire;
  };
  for (const auto& [name, state, wire] : {Row{"fp32", 16, 4}, Row{"bf16", 18, 2}}) {
    PlanOptions o = TwoStages(1);
    o.precision = name;
    auto plan = MakePlan(o);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const nlohmann::json j = nlohmann::json::parse(PlanJson(*plan));
    EXPECT_EQ(j["precision"], name);
    EXPECT_EQ(j["precision_bytes"]["per_parameter"], state);
    EXPECT_EQ(j["precision_bytes"]["activation_stored"], 4);
    EXPECT_EQ(j["precision_bytes"]["activation_stored_for_products"], wire);
    EXPECT_EQ(j["precision_bytes"]["activation_wire"], wire);
    EXPECT_THAT(RenderPlanText(*plan),
                HasSubstr(absl::StrCat("Precision ", name, ": ", state,
                                       " bytes of state a parameter; an activation element "
                                       "4 bytes stored for the backward (",
                                       wire, " if kept only for its products), ", wire,
                                       " between stages")));
    EXPECT_THAT(RenderPlanText(*plan),
                HasSubstr(absl::StrCat(state == 16 ? "" : " + the products' copy", ", ", state,
                                       " bytes per parameter")));
    // The planner sizes each stage's state with the same figure.
    for (const StagePlan& sp : plan->stages) EXPECT_EQ(sp.state_bytes, state * sp.params);
  }
}

// Two replicas of a 2-stage plan: the text shows the layout and the reductions, the JSON
// carries the plan's figures, and the trace puts each reduction on its stage's own track.
TEST(PlanReportTest, ReplicasAreShownInTextJsonAndTrace) {
  PlanOptions o = TwoStages(2);
  o.link_bytes_per_s = 1e9;
  auto plan = MakePlan(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string text = RenderPlanText(*plan);
  EXPECT_THAT(text, HasSubstr("Layout: 2 replicas x 2 stages = 4 stage servers; per replica 4 "
                              "sequences in 2 micro-batches of 2"));
  EXPECT_THAT(text, HasSubstr("batch 8 sequences\n"));
  EXPECT_THAT(text, HasSubstr("at 1 GB/s, the links' rate"));
  // Bytes per parameter with and without the optimizer split (fp32: 16, or 8 + 8/2).
  EXPECT_THAT(text, HasSubstr("Optimizer split among the 2 copies of each stage "
                              "(pipeline.shard_optimizer true): 12 bytes of state a parameter "
                              "split (AdamW's two moments for 1/2 of it), 16 whole"));
  EXPECT_THAT(text, HasSubstr("AdamW moments (1/2 of them), 12 bytes per parameter"));
  PlanOptions whole_options = o;
  whole_options.shard_optimizer = false;
  auto whole = MakePlan(whole_options);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_THAT(RenderPlanText(*whole),
              HasSubstr("Optimizer whole on each of the 2 copies of each stage "
                        "(pipeline.shard_optimizer false): 12 bytes of state a parameter split"));
  EXPECT_EQ(nlohmann::json::parse(PlanJson(*whole))["state_bytes_per_param"], 16.0);

  const nlohmann::json j = nlohmann::json::parse(PlanJson(*plan));
  EXPECT_EQ(j["replicas"], 2);
  EXPECT_EQ(j["shard_optimizer"], true);
  EXPECT_EQ(j["state_bytes_per_param"], 12.0);
  EXPECT_EQ(j["state_bytes_per_param_split"], 12.0);
  EXPECT_EQ(j["state_bytes_per_param_whole"], 16.0);
  EXPECT_EQ(j["collective_bytes_per_s"].get<double>(), 1e9);
  ASSERT_EQ(plan->simulation.reductions.size(), 2u);
  for (int s = 0; s < 2; ++s) {
    const nlohmann::json& st = j["stages"][s];
    EXPECT_EQ(st["allreduce_bytes"].get<double>(), plan->stages[s].allreduce_bytes);
    EXPECT_EQ(st["allreduce_s"].get<double>(), plan->stages[s].allreduce_s);
    EXPECT_EQ(st["allreduce_hidden_fraction"].get<double>(),
              plan->simulation.reductions[s].hidden_fraction);
  }
  EXPECT_EQ(j["step_time_without_allreduce_s"].get<double>(),
            plan->simulation.step_time_without_reduction_s);

  const nlohmann::json trace = nlohmann::json::parse(ChromeTrace(plan->simulation, 2));
  int reductions = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] != "X" || e["cat"] != "allreduce") continue;
    EXPECT_EQ(e["tid"], 1);
    const int s = e["pid"].get<int>();
    EXPECT_DOUBLE_EQ(e["ts"].get<double>(), plan->simulation.reductions[s].start_s * 1e6);
    ++reductions;
  }
  EXPECT_EQ(reductions, 2);
  // The picture gives each stage a reduce lane; one replica has none.
  EXPECT_THAT(RenderPicture(plan->simulation, 2), HasSubstr("  reduce| "));
  EXPECT_THAT(RenderPicture(Sim(ScheduleKind::kOneFOneB, 2, 2), 2),
              ::testing::Not(HasSubstr("reduce")));
}

}  // namespace
}  // namespace pipetrain::planner
