#include "client/cli.h"

#include <cstdio>
#include <fstream>
#include <sstream>

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
}

}  // namespace
}  // namespace pipetrain::client
