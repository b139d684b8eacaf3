#include "client/cli.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "coordinator/planner/recompute_policy.h"
#include "coordinator/planner/schedule_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::client {
namespace {

using ::testing::HasSubstr;

int Cli(std::vector<std::string> args, std::string* out, std::string* err) {
  std::ostringstream o, e;
  int code = RunCli(args, o, e);
  *out = o.str();
  *err = e.str();
  return code;
}

TEST(CliTest, HelpListsEveryVerbAndExitsZero) {
  std::string out, err;
  EXPECT_EQ(Cli({"--help"}, &out, &err), kExitOk);
  for (const Verb& v : Verbs()) EXPECT_THAT(out, HasSubstr(v.name));
  EXPECT_THAT(out, HasSubstr("Exit codes"));
}

TEST(CliTest, VersionPrintsTheProjectVersion) {
  std::string out, err;
  EXPECT_EQ(Cli({"--version"}, &out, &err), kExitOk);
  EXPECT_THAT(out, HasSubstr("pipetrain 0."));
  EXPECT_THAT(out, HasSubstr("grpc"));
  EXPECT_EQ(Cli({"version"}, &out, &err), kExitOk);
  EXPECT_THAT(out, HasSubstr("pipetrain 0."));
}

TEST(CliTest, UsageErrorsExitTwoAndSayWhatToDo) {
  std::string out, err;
  EXPECT_EQ(Cli({}, &out, &err), kExitUsage);
  EXPECT_EQ(Cli({"frobnicate"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("unknown verb 'frobnicate'"));
  EXPECT_THAT(err, HasSubstr("pipetrain --help"));
  EXPECT_EQ(Cli({"version", "extra"}, &out, &err), kExitUsage);
}

const std::string kJob = std::string(PIPETRAIN_TESTDATA_DIR) + "/plan_job.json";

std::string TempFile(const std::string& name, const std::string& content) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << content;
  return path;
}

TEST(CliPlanTest, PrintsPartitionBubbleAndPicture) {
  std::string out, err;
  ASSERT_EQ(Cli({"plan", kJob, "--equal-stage-cost"}, &out, &err), kExitOk) << err;
  EXPECT_THAT(out, HasSubstr("1f1b schedule, K=4 stages, M=8"));
  EXPECT_THAT(out, HasSubstr("embedding"));
  EXPECT_THAT(out, HasSubstr("Bubble fraction: 0.2727 simulated, 0.2727 textbook (K-1)/(M+K-1)"));
  EXPECT_THAT(out, HasSubstr("stage 0 | F0 F1 F2 F3 .  .  .  .  .  .  B0 B0 F4"));
  EXPECT_THAT(out, HasSubstr("stage 3 | .  .  .  F0 B0 B0 F1"));
  // Without equal costs it states its device and link assumptions.
  ASSERT_EQ(Cli({"plan", kJob}, &out, &err), kExitOk) << err;
  EXPECT_THAT(out, HasSubstr("TFLOP/s per device (--device-flops)"));
  EXPECT_THAT(out, HasSubstr("GB/s"));
}

TEST(CliPlanTest, FlagsOverrideTheSpec) {
  std::string out, err;
  ASSERT_EQ(Cli({"plan", kJob, "--stages", "2", "--micro-batches", "4", "--schedule",
                 "interleaved", "--chunks", "2", "--recompute", "always", "--equal-stage-cost"},
                &out, &err),
            kExitOk)
      << err;
  EXPECT_THAT(out, HasSubstr("interleaved schedule, K=2 stages, M=4 micro-batches, v=2"));
  EXPECT_THAT(out, HasSubstr("recompute always"));
  EXPECT_THAT(out, HasSubstr("F0@1"));
}

TEST(CliPlanTest, JsonHasTheFiguresAndTraceIsWritten) {
  std::string out, err;
  const std::string trace = ::testing::TempDir() + "plan_trace.json";
  ASSERT_EQ(Cli({"plan", kJob, "--schedule", "zb-h1", "--json", "--trace", trace}, &out, &err),
            kExitOk)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_TRUE(j["stages"].is_array());
  EXPECT_EQ(j["stages"].size(), 4u);
  EXPECT_TRUE(j["step_time_s"].is_number());
  EXPECT_GT(j["step_time_s"].get<double>(), 0);
  EXPECT_TRUE(j["bubble_fraction"].is_number());
  ASSERT_EQ(j["peak_activation_bytes"].size(), 4u);
  EXPECT_GT(j["peak_activation_bytes"][0].get<double>(), 0);
  EXPECT_EQ(j["schedule"], "zb-h1");
  std::ifstream in(trace);
  ASSERT_TRUE(in);
  const nlohmann::json t = nlohmann::json::parse(in);
  EXPECT_FALSE(t["traceEvents"].empty());
}

TEST(CliPlanTest, AutoRanksTheCandidatesInTextAndJson) {
  std::string out, err;
  ASSERT_EQ(Cli({"plan", kJob, "--auto", "--devices", "4"}, &out, &err), kExitOk) << err;
  EXPECT_THAT(out, HasSubstr("Auto plan: "));
  EXPECT_THAT(out, HasSubstr("rank  plan"));
  ASSERT_EQ(Cli({"plan", kJob, "--auto", "--devices", "4", "--json"}, &out, &err), kExitOk)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);  // JSON only
  const nlohmann::json& a = j["auto"];
  ASSERT_TRUE(a["candidates"].is_array()) << out;
  ASSERT_GE(a["candidates"].size(), 2u);
  EXPECT_LE(a["candidates"].size(), 10u);
  EXPECT_GT(a["fit"].get<int>(), 1);
  const nlohmann::json& best = a["candidates"][0];
  EXPECT_EQ(best["rank"], 1);
  EXPECT_DOUBLE_EQ(best["vs_best"].get<double>(), 1.0);
  // The plan printed is the best candidate's.
  EXPECT_EQ(j["num_stages"], best["stages"]);
  EXPECT_EQ(j["micro_batches"], best["micro_batches"]);
  EXPECT_DOUBLE_EQ(j["step_time_s"].get<double>(), best["step_time_s"].get<double>());
  double previous = 0;
  for (const nlohmann::json& c : a["candidates"]) {
    EXPECT_GE(c["step_time_s"].get<double>(), previous) << "ranked by predicted step";
    previous = c["step_time_s"].get<double>();
    EXPECT_LE(c["stages"].get<int>() * c["replicas"].get<int>(), 4);
  }
}

TEST(CliPlanTest, DevicesWithoutAutoIsRefused) {
  std::string out, err;
  EXPECT_EQ(Cli({"plan", kJob, "--devices", "4"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("--devices"));
  EXPECT_THAT(err, HasSubstr("--auto"));
}

// Four stages on one device of two slots: the plan says so, in text and JSON, and
// predicts a longer step than four devices of their own would take.
TEST(CliPlanTest, StagesSharingADeviceAreSaidAndTakeTurns) {
  std::string out, err, apart;
  ASSERT_EQ(Cli({"plan", kJob, "--stages-per-device", "4", "--device-slots", "2"}, &out, &err),
            kExitOk)
      << err;
  EXPECT_THAT(out, HasSubstr("Devices: stages 0-3 share device 0 (2 at once)"));
  ASSERT_EQ(Cli({"plan", kJob, "--json"}, &apart, &err), kExitOk) << err;
  ASSERT_EQ(Cli({"plan", kJob, "--json", "--stages-per-device", "4"}, &out, &err), kExitOk)
      << err;
  const nlohmann::json shared = nlohmann::json::parse(out), own = nlohmann::json::parse(apart);
  EXPECT_EQ(shared["device_sharing"], "stages 0-3 share device 0 (1 at once)");
  EXPECT_EQ(shared["stages"][1]["shared_device"], "device 0");
  EXPECT_EQ(own["device_sharing"], "");
  EXPECT_GT(shared["step_time_s"].get<double>(), own["step_time_s"].get<double>());
  EXPECT_EQ(Cli({"plan", kJob, "--stages-per-device", "0"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("--stages-per-device"));
}

// plan_job.json: K = 4, M = 8, batch 32, no replicas.
TEST(CliPlanTest, ReplicasShowTheLayoutAndEachStagesAllReduce) {
  std::string out, err;
  ASSERT_EQ(Cli({"plan", kJob, "--replicas", "2", "--link-gbps", "1"}, &out, &err), kExitOk)
      << err;
  EXPECT_THAT(out, HasSubstr("2 replicas x 4 stages = 8 stage servers; per replica 16 "
                             "sequences in 8 micro-batches"));
  EXPECT_THAT(out, HasSubstr("Gradient all-reduce between the 2 copies of each stage"));
  EXPECT_THAT(out, HasSubstr("with the all-reduce ("));
  EXPECT_THAT(out, HasSubstr("  reduce|"));
  // In the formulas' setting the reduction is free, as the links are, and says so.
  ASSERT_EQ(Cli({"plan", kJob, "--replicas", "2", "--equal-stage-cost"}, &out, &err), kExitOk)
      << err;
  EXPECT_THAT(out, HasSubstr("free with equal stage costs"));
  EXPECT_THAT(out, HasSubstr("Predicted step time: 33 units\n"));
  // Without replicas none of it is shown.
  ASSERT_EQ(Cli({"plan", kJob}, &out, &err), kExitOk) << err;
  EXPECT_THAT(out, Not(HasSubstr("Layout:")));
  EXPECT_THAT(out, Not(HasSubstr("all-reduce")));

  // The spec's pipeline.replicas is read, and the flag overrides it.
  const std::string four = TempFile(
      "replicas.json",
      R"({"model": {"vocab_size": 256, "seq_len": 16, "d_model": 32, "n_heads": 4,
          "n_layers": 2}, "pipeline": {"stages": 2, "micro_batches": 2, "schedule": "1f1b",
          "replicas": 4}, "training": {"batch_size": 16}})");
  ASSERT_EQ(Cli({"plan", four, "--json"}, &out, &err), kExitOk) << err;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["replicas"], 4);
  ASSERT_EQ(j["stages"].size(), 2u);
  for (const auto& st : j["stages"]) {
    EXPECT_EQ(st["allreduce_bytes"].get<double>(), 4 * st["params"].get<double>());
    EXPECT_GT(st["allreduce_s"].get<double>(), 0);
    EXPECT_GE(st["allreduce_hidden_fraction"].get<double>(), 0);
    EXPECT_LE(st["allreduce_hidden_fraction"].get<double>(), 1);
  }
  EXPECT_GT(j["step_time_s"].get<double>(), j["step_time_without_allreduce_s"].get<double>());
  ASSERT_EQ(Cli({"plan", four, "--json", "--replicas", "1"}, &out, &err), kExitOk) << err;
  j = nlohmann::json::parse(out);
  EXPECT_EQ(j["replicas"], 1);
  EXPECT_EQ(j["stages"][0]["allreduce_s"].get<double>(), 0);
  EXPECT_EQ(j["step_time_s"].get<double>(), j["step_time_without_allreduce_s"].get<double>());

  // A split the batch does not allow names the counts; so does a replica count out of range.
  EXPECT_EQ(Cli({"plan", kJob, "--replicas", "3"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("training.batch_size: 32 is not divisible by pipeline.replicas 3 "
                             "x pipeline.micro_batches 8 = 24"));
  EXPECT_EQ(Cli({"plan", kJob, "--replicas", "-1"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("pipeline.replicas: must be in [1, 1024]"));
  EXPECT_EQ(Cli({"plan", kJob, "--replicas", "2", "--collective-gbps", "-1"}, &out, &err),
            kExitUsage);
  EXPECT_THAT(err, HasSubstr("--collective-gbps"));
}

// The schedules and recompute modes --help lists are their tables' rows.
TEST(CliPlanTest, HelpListsEveryScheduleAndRecomputeModeFromTheTables) {
  std::string out, err;
  ASSERT_EQ(Cli({"plan", "--help"}, &out, &err), kExitOk) << err;
  for (const planner::ScheduleEntry& e : planner::ScheduleTable()) {
    EXPECT_THAT(out, HasSubstr(std::string("  ") + e.name + "  ")) << out;
    EXPECT_THAT(out, HasSubstr(e.description));
  }
  for (const planner::RecomputeEntry& e : planner::RecomputeTable()) {
    EXPECT_THAT(out, HasSubstr(std::string("  ") + e.name + "  ")) << out;
    EXPECT_THAT(out, HasSubstr(e.description));
  }
  EXPECT_THAT(out, HasSubstr("--schedule NAME"));
  EXPECT_THAT(out, HasSubstr(planner::ScheduleNameList()));
  EXPECT_THAT(out, HasSubstr(planner::RecomputeNameList()));
}

TEST(CliPlanTest, BadSpecsExitTwoNamingTheField) {
  std::string out, err;
  const std::string bad_schedule = TempFile(
      "bad_schedule.json",
      R"({"model": {"vocab_size": 256, "seq_len": 16, "d_model": 32, "n_heads": 4,
          "n_layers": 2}, "pipeline": {"stages": 2, "micro_batches": 2, "schedule": "fifo"},
          "training": {"batch_size": 4}})");
  EXPECT_EQ(Cli({"plan", bad_schedule}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("pipeline.schedule"));
  const std::string no_model = TempFile(
      "no_model.json", R"({"pipeline": {"stages": 2, "micro_batches": 2, "schedule": "1f1b"}})");
  EXPECT_EQ(Cli({"plan", no_model}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("model"));
  EXPECT_EQ(Cli({"plan", bad_schedule, "--schedule", "1f1b", "--stages", "0"}, &out, &err),
            kExitOk);  // 0 keeps the spec's value
  EXPECT_EQ(Cli({"plan", bad_schedule, "--schedule", "1f1b", "--stages", "5"}, &out, &err),
            kExitUsage);
  EXPECT_THAT(err, HasSubstr("pipeline.stages (5) is more than the model's 4 pipeline layers"));
  const std::string typo = TempFile("typo.json", R"({"modle": {}})");
  EXPECT_EQ(Cli({"plan", typo}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("modle"));
  EXPECT_EQ(Cli({"plan", "/nonexistent/job.json"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("cannot read"));
  EXPECT_EQ(Cli({"plan"}, &out, &err), kExitUsage);
  EXPECT_EQ(Cli({"plan", kJob, "--stages", "two"}, &out, &err), kExitUsage);
  EXPECT_THAT(err, HasSubstr("--stages"));
  EXPECT_EQ(Cli({"plan", "--help"}, &out, &err), kExitOk);
  EXPECT_THAT(out, HasSubstr("--equal-stage-cost"));
  EXPECT_THAT(out, HasSubstr("--replicas"));
  EXPECT_THAT(out, HasSubstr("gradient ring\nall-reduce between its R copies"));
}

}  // namespace
}  // namespace pipetrain::client
