// Integration: the real executables answer --help/--version truthfully, reject bad
// flags with exit 2, and the servers start on 127.0.0.1 port 0, answer RPCs and stop
// cleanly on SIGTERM.
#include <signal.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/cuda_probe.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/stage.grpc.pb.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_files.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::RunCommand;
using ::pipetrain::testing::Subprocess;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::string Bin(const std::string& name) { return std::string(PIPETRAIN_BIN_DIR) + "/" + name; }

const char* kBinaries[] = {"pipetrain", "pipetrain-coordinator", "pipetrain-stage",
                           "pipetrain-bench"};

TEST(BinariesTest, HelpAndVersionExitZero) {
  for (const char* b : kBinaries) {
    auto help = RunCommand({Bin(b), "--help"}, 20s);
    ASSERT_TRUE(help.ok()) << help.status();
    EXPECT_EQ(help->exit_code, 0) << b << " --help: " << help->err;
    EXPECT_THAT(help->out, HasSubstr("Usage: ")) << b;
    auto version = RunCommand({Bin(b), "--version"}, 20s);
    ASSERT_TRUE(version.ok()) << version.status();
    EXPECT_EQ(version->exit_code, 0) << b;
    EXPECT_THAT(version->out, HasSubstr("0.1.0")) << b;
  }
}

TEST(BinariesTest, BadFlagsExitTwoWithAHint) {
  for (const char* b : kBinaries) {
    auto r = RunCommand({Bin(b), "--no-such-flag"}, 20s);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 2) << b;
    EXPECT_THAT(r->err, HasSubstr("--help")) << b;
  }
  testing::TempDir dir;
  auto r = RunCommand({Bin("pipetrain-coordinator"), "--listen", "nowhere:99999", "--state-dir",
                       dir.path()},
                      20s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_THAT(r->err, HasSubstr("--listen"));
  auto no_state = RunCommand({Bin("pipetrain-coordinator"), "--listen", "127.0.0.1:0"}, 20s);
  ASSERT_TRUE(no_state.ok());
  EXPECT_EQ(no_state->exit_code, 2);
  EXPECT_THAT(no_state->err, HasSubstr("--state-dir"));
  // What a stop does: a usage error naming the flag, before anything starts.
  auto on_stop = RunCommand({Bin("pipetrain-coordinator"), "--listen", "127.0.0.1:0",
                             "--state-dir", dir.path(), "--on-stop", "fail"},
                            20s);
  ASSERT_TRUE(on_stop.ok());
  EXPECT_EQ(on_stop->exit_code, 2);
  EXPECT_THAT(on_stop->err, HasSubstr("--on-stop must be recover or cancel, not 'fail'"));
  for (const char* grace : {"-1", "1e9", "soon"}) {
    auto stop_grace = RunCommand({Bin("pipetrain-stage"), "--stop-grace", grace}, 20s);
    ASSERT_TRUE(stop_grace.ok());
    EXPECT_EQ(stop_grace->exit_code, 2) << grace;
    EXPECT_THAT(stop_grace->err, HasSubstr("--stop-grace")) << grace;
  }
}

TEST(BinariesTest, StageRefusesAMissingGpu) {
  if (common::HasCudaDevice()) GTEST_SKIP() << "this machine has a GPU";
  auto r = RunCommand({Bin("pipetrain-stage"), "--device", "cuda:0"}, 20s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 2);
  EXPECT_THAT(r->err, HasSubstr("--device cpu"));
}

int PortOf(const std::string& line) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(line.substr(line.rfind(':') + 1), &port)) << line;
  return port;
}

// Starts `argv`, reads the bound port, calls `probe` on a channel to it, then stops
// the server with SIGTERM and expects a clean exit.
template <typename Probe>
void ServeAndStop(const std::vector<std::string>& argv, const std::string& name, Probe probe) {
  auto p = Subprocess::Start(argv);
  ASSERT_TRUE(p.ok()) << p.status();
  auto line = p->WaitForLine(name + " listening on 127.0.0.1:", 30s);
  ASSERT_TRUE(line.ok()) << line.status();
  const int port = PortOf(*line);
  ASSERT_GT(port, 0);
  probe(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                            grpc::InsecureChannelCredentials()));
  p->Signal(SIGTERM);
  auto code = p->Wait(20s);
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << p->stderr_text();
}

TEST(BinariesTest, CoordinatorServesOnAnEphemeralPortAndStopsOnSigterm) {
  testing::TempDir dir;
  ServeAndStop({Bin("pipetrain-coordinator"), "--listen", "127.0.0.1:0", "--state-dir", dir.path()},
               "coordinator",
               [](std::shared_ptr<grpc::Channel> channel) {
                 auto stub = pipetrain::v1::Coordinator::NewStub(channel);
                 grpc::ClientContext ctx;
                 ctx.set_deadline(std::chrono::system_clock::now() + 10s);
                 pipetrain::v1::GetClusterRequest req;
                 pipetrain::v1::ClusterStatus resp;
                 grpc::Status s = stub->GetCluster(&ctx, req, &resp);
                 EXPECT_TRUE(s.ok()) << s.error_message();
                 EXPECT_EQ(resp.stages_size(), 0) << "no stage has registered";
               });
}

TEST(BinariesTest, StageServesOnAnEphemeralPortAndStopsOnSigterm) {
  ServeAndStop({Bin("pipetrain-stage"), "--listen", "127.0.0.1:0", "--device", "cpu"}, "stage",
               [](std::shared_ptr<grpc::Channel> channel) {
                 auto stub = pipetrain::v1::Stage::NewStub(channel);
                 grpc::ClientContext ctx;
                 ctx.set_deadline(std::chrono::system_clock::now() + 10s);
                 pipetrain::v1::GetStatsRequest req;
                 pipetrain::v1::StageStats resp;
                 grpc::Status s = stub->GetStats(&ctx, req, &resp);
                 EXPECT_TRUE(s.ok()) << s.error_message();
                 EXPECT_EQ(resp.job_id(), "") << "no job is configured yet";
                 EXPECT_EQ(resp.steps_run(), 0);
               });
}

// --health-listen: a plaintext port with only gRPC health, for Kubernetes grpc probes.
TEST(BinariesTest, ServersAnswerHealthOnTheirHealthPort) {
  testing::TempDir dir;
  const std::vector<std::vector<std::string>> servers = {
      {Bin("pipetrain-stage"), "--listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"},
      {Bin("pipetrain-coordinator"), "--listen", "127.0.0.1:0", "--state-dir", dir.path(),
       "--health-listen", "127.0.0.1:0"}};
  for (const std::vector<std::string>& argv : servers) {
    auto p = Subprocess::Start(argv);
    ASSERT_TRUE(p.ok()) << p.status();
    auto line = p->WaitForLine(" health listening on 127.0.0.1:", 30s);
    ASSERT_TRUE(line.ok()) << line.status();
    // The channel stays open while the server stops, as a prober's might.
    auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(PortOf(*line)), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    EXPECT_TRUE(s.ok()) << argv[0] << ": " << s.error_message();
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING) << argv[0];
    const auto stop = std::chrono::steady_clock::now();
    p->Signal(SIGTERM);
    auto code = p->Wait(20s);
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0) << argv[0] << ": " << p->stderr_text();
    EXPECT_LT(std::chrono::steady_clock::now() - stop, 5s) << argv[0] << " stops promptly";
  }
}

TEST(BinariesTest, BenchListsItsBenchmarks) {
  auto r = RunCommand({Bin("pipetrain-bench"), "--list"}, 20s);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0);
  EXPECT_THAT(r->out, HasSubstr("codec"));
  auto bad = RunCommand({Bin("pipetrain-bench"), "nope"}, 20s);
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad->exit_code, 2);
  EXPECT_THAT(bad->err, HasSubstr("no benchmark named 'nope'"));
  // A precision the table lacks is refused before any work, naming the flag and the
  // accepted values, and JSON mode prints nothing on stdout.
  auto precision =
      RunCommand({Bin("pipetrain-bench"), "compute", "--precision", "fp16", "--json"}, 20s);
  ASSERT_TRUE(precision.ok());
  EXPECT_EQ(precision->exit_code, 2);
  EXPECT_THAT(precision->err,
              HasSubstr("--precision: unknown precision 'fp16'; accepted: fp32, bf16"));
  EXPECT_EQ(precision->out, "");
  // So is a model compute does not train.
  auto model = RunCommand({Bin("pipetrain-bench"), "compute", "--model", "mistral", "--json"}, 20s);
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->exit_code, 2);
  EXPECT_THAT(model->err, HasSubstr("--model: unknown model 'mistral'; accepted: gpt2, llama"));
  EXPECT_EQ(model->out, "");
  // The scaling bench's knobs are checked before it starts a cluster, naming the variable.
  for (const auto& [set, want] : std::vector<std::pair<std::string, std::string>>{
           {"PIPETRAIN_BENCH_SCALING_ROWS=0",
            "PIPETRAIN_BENCH_SCALING_ROWS must be a row count from 1 to 64, not '0'"},
           {"PIPETRAIN_BENCH_SCALING_TRANSPORT=shm",
            "PIPETRAIN_BENCH_SCALING_TRANSPORT must be auto or off, not 'shm'"}}) {
    auto knob = RunCommand({"/usr/bin/env", set, Bin("pipetrain-bench"), "scaling", "--json"}, 20s);
    ASSERT_TRUE(knob.ok());
    EXPECT_NE(knob->exit_code, 0) << set;
    EXPECT_THAT(knob->err, HasSubstr(want));
    EXPECT_EQ(knob->out, "") << set;
  }
  // So are model-size's copy counts: a list of counts from 1, the baseline.
  for (const auto& [list, want] : std::vector<std::pair<std::string, std::string>>{
           {"2,4", "--replicas='2,4' must start with 1 (the baseline)"},
           {"1,x", "--replicas='1,x': 'x' is not a count"}}) {
    auto knob = RunCommand({Bin("pipetrain-bench"), "model-size", "--replicas", list, "--json"}, 20s);
    ASSERT_TRUE(knob.ok());
    EXPECT_NE(knob->exit_code, 0) << list;
    EXPECT_THAT(knob->err, HasSubstr(want));
    EXPECT_EQ(knob->out, "") << list;
  }
}

}  // namespace
}  // namespace pipetrain
