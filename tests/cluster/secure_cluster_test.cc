// End to end with security on: a coordinator and 2 stages with mutual TLS (certificates
// from deploy/certs/make-dev-certs.sh) and a bearer token train a job through the CLI
// with the losses of a plaintext cluster; clients with a foreign CA, without TLS, or
// without the right token are refused with their exit codes, over gRPC and HTTP, and a
// stage refuses control calls that lack the token without changing its state. A
// plaintext server off loopback warns.
#include <signal.h>

#include <chrono>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "pipetrain/v1/stage.grpc.pb.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/corpus_text.h"
#include "tests/testing/temp_files.h"

namespace pipetrain {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::LocalClusterOptions;
using ::pipetrain::testing::RunResult;
using ::pipetrain::testing::TempDir;
using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr char kToken[] = "e2e-token-4c1f";

std::string Bin(const std::string& name) { return std::string(PIPETRAIN_BIN_DIR) + "/" + name; }

class SecureClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* ca : {"certs", "other"}) {
      auto r = testing::RunCommand(
          {std::string(PIPETRAIN_SOURCE_DIR) + "/deploy/certs/make-dev-certs.sh", dir_.File(ca),
           "127.0.0.1"},
          30s);
      ASSERT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.status().ToString());
    }
    testing::WriteFileOrDie(dir_.File("token"), std::string(kToken) + "\n");
    testing::WriteFileOrDie(dir_.File("wrong-token"), "not-it\n");
    testing::WriteFileOrDie(dir_.File("corpus.txt"), testing::EnglishLikeCorpus());
    json spec = {
        {"name", "secure"},
        {"model", {{"vocab_size", 256}, {"seq_len", 16}, {"d_model", 32}, {"n_heads", 2},
                   {"n_layers", 2}}},
        {"pipeline", {{"stages", 2}, {"micro_batches", 2}, {"schedule", "1f1b"}}},
        {"training", {{"steps", 3}, {"batch_size", 4}, {"seed", 3}, {"lr", 0.01}}},
        {"data", {{"corpus", dir_.File("corpus.txt")}}}};
    testing::WriteFileOrDie(dir_.File("job.json"), spec.dump(2));
  }

  // --tls-cert/--tls-key/--tls-ca for `name`'s certificate of CA folder `ca`.
  std::vector<std::string> Tls(const std::string& name, const std::string& ca = "certs") {
    const std::string d = dir_.File(ca) + "/";
    return {"--tls-cert", d + name + ".pem", "--tls-key", d + name + "-key.pem", "--tls-ca",
            d + "ca.pem"};
  }
  std::vector<std::string> Secured(const std::string& name) {
    std::vector<std::string> args = Tls(name);
    args.insert(args.end(), {"--token-file", dir_.File("token")});
    return args;
  }

  absl::StatusOr<std::unique_ptr<LocalCluster>> StartSecure() {
    LocalClusterOptions o;
    o.coordinator_args = Secured("127.0.0.1");
    o.stage_args = Secured("127.0.0.1");
    o.cli_args = Secured("client");
    common::SecurityFlags f;
    f.tls_cert = dir_.File("certs/client.pem");
    f.tls_key = dir_.File("certs/client-key.pem");
    f.tls_ca = dir_.File("certs/ca.pem");
    f.token_file = dir_.File("token");
    auto security = common::RpcSecurity::Load(f);
    if (!security.ok()) return security.status();
    o.security = *security;
    return LocalCluster::Start(dir_.File("state"), 2, std::move(o));
  }

  // `pipetrain ARGS --address ADDRESS` with exactly the given flags.
  RunResult Cli(const LocalCluster& c, std::vector<std::string> args) {
    args.insert(args.begin(), Bin("pipetrain"));
    args.insert(args.end(), {"--address", c.address()});
    auto r = testing::RunCommand(args, 60s);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : RunResult();
  }

  static std::vector<double> Losses(LocalCluster& c, const std::string& id) {
    auto r = c.Cli({"status", id, "--json"});
    EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.status().ToString());
    std::vector<double> out;
    json j = json::parse(r.ok() ? r->out : "", nullptr, false);
    if (j.is_discarded()) return out;
    EXPECT_EQ(j["state"], "SUCCEEDED") << j.dump();
    for (const json& h : j["history"]) out.push_back(h["loss"].get<double>());
    return out;
  }

  static std::string Submit(LocalCluster& c, const std::string& spec) {
    auto r = c.Cli({"submit", spec});
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
    std::vector<std::string> words = absl::StrSplit(r->out.substr(0, r->out.find('\n')), ' ');
    return words.size() > 1 ? words[1] : "";
  }

  TempDir dir_;
};

TEST_F(SecureClusterTest, TrainsOverMutualTlsWithATokenWithThePlaintextLosses) {
  std::vector<double> secure_losses;
  {
    auto cluster = StartSecure();
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    LocalCluster& c = **cluster;

    // A stage refuses a control call without the token, even over mutual TLS, and
    // stays unconfigured.
    const std::string stage = c.stage_addresses()[0];
    common::SecurityFlags f;
    f.tls_cert = dir_.File("certs/client.pem");
    f.tls_key = dir_.File("certs/client-key.pem");
    f.tls_ca = dir_.File("certs/ca.pem");
    auto tls = common::RpcSecurity::Load(f);
    ASSERT_TRUE(tls.ok()) << tls.status();
    auto stub = pb::Stage::NewStub(grpc::CreateChannel(stage, tls->ChannelCredentials()));
    pb::ConfigureRequest configure;
    configure.set_job_id("intruder");
    pb::ConfigureResponse configured;
    grpc::ClientContext refused;
    refused.set_deadline(std::chrono::system_clock::now() + 10s);
    grpc::Status s = stub->Configure(&refused, configure, &configured);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("missing bearer token"));
    grpc::ClientContext stats_ctx;
    stats_ctx.set_deadline(std::chrono::system_clock::now() + 10s);
    stats_ctx.AddMetadata("authorization", std::string("Bearer ") + kToken);
    pb::StageStats stats;
    s = stub->GetStats(&stats_ctx, {}, &stats);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(stats.job_id(), "");

    const std::string id = Submit(c, dir_.File("job.json"));
    secure_losses = Losses(c, id);
  }
  ASSERT_EQ(secure_losses.size(), 3u);

  auto plain = LocalCluster::Start(dir_.File("plain-state"), 2);
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::string id = Submit(**plain, dir_.File("job.json"));
  std::vector<double> plain_losses = Losses(**plain, id);
  ASSERT_EQ(plain_losses.size(), secure_losses.size());
  for (size_t i = 0; i < plain_losses.size(); ++i) {
    EXPECT_DOUBLE_EQ(secure_losses[i], plain_losses[i]) << "step " << i;
  }
}

TEST_F(SecureClusterTest, RefusesForeignCasPlaintextAndBadTokens) {
  auto cluster = StartSecure();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::string token_file = dir_.File("token");

  // A certificate from another CA: the handshake fails, nothing is reached.
  std::vector<std::string> args = {"list"};
  for (const std::string& a : Tls("client", "other")) args.push_back(a);
  args.insert(args.end(), {"--token-file", token_file});
  RunResult r = Cli(c, args);
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;

  // Plaintext.
  r = Cli(c, {"list", "--token-file", token_file});
  EXPECT_EQ(r.exit_code, 3) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("cannot reach the coordinator"));

  // TLS without a token, then with a wrong one: refused, and nothing is submitted.
  args = {"submit", dir_.File("job.json"), "--no-wait"};
  for (const std::string& a : Tls("client")) args.push_back(a);
  r = Cli(c, args);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("missing bearer token: pass --token-file or set PIPETRAIN_TOKEN"));
  EXPECT_THAT(r.err, HasSubstr("UNAUTHENTICATED"));
  args.insert(args.end(), {"--token-file", dir_.File("wrong-token")});
  r = Cli(c, args);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED"));
  auto listed = c.Cli({"list", "--json"});
  ASSERT_TRUE(listed.ok() && listed->exit_code == 0) << (listed.ok() ? listed->err : "");
  json jobs = json::parse(listed->out, nullptr, false);
  EXPECT_TRUE(jobs.is_discarded() || jobs["jobs"].empty()) << listed->out;

  // The environment variables stand in for the flags.
  const std::string d = dir_.File("certs") + "/";
  auto env = testing::RunCommand(
      {"/usr/bin/env", "PIPETRAIN_TLS_CERT=" + d + "client.pem",
       "PIPETRAIN_TLS_KEY=" + d + "client-key.pem", "PIPETRAIN_TLS_CA=" + d + "ca.pem",
       std::string("PIPETRAIN_TOKEN=") + kToken, Bin("pipetrain"), "cluster", "--address",
       c.address()},
      60s);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->exit_code, 0) << env->err;
  EXPECT_THAT(env->out, HasSubstr("IDLE"));

  // A partial TLS set is a usage error naming what is missing.
  r = Cli(c, {"list", "--tls-cert", d + "client.pem"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--tls-key and --tls-ca missing"));

  // HTTP: 401 without the token or with a wrong one, 200 with it; /metrics alike, as
  // Prometheus sends the token in its scrape config's `authorization`.
  auto get = [&](const std::string& authorization, const char* path = "/api/cluster") {
    httplib::Client http("127.0.0.1", c.http_port());
    httplib::Headers headers;
    if (!authorization.empty()) headers.emplace("Authorization", authorization);
    httplib::Result res = http.Get(path, headers);
    EXPECT_TRUE(res) << httplib::to_string(res.error());
    return res ? std::make_pair(res->status, res->body) : std::make_pair(0, std::string());
  };
  auto [missing_status, missing_body] = get("");
  EXPECT_EQ(missing_status, 401) << missing_body;
  EXPECT_THAT(missing_body, HasSubstr("missing bearer token"));
  auto [wrong_status, wrong_body] = get("Bearer not-it");
  EXPECT_EQ(wrong_status, 401) << wrong_body;
  EXPECT_THAT(wrong_body, HasSubstr("wrong bearer token"));
  auto [ok_status, ok_body] = get(std::string("Bearer ") + kToken);
  EXPECT_EQ(ok_status, 200) << ok_body;
  EXPECT_EQ(get("", "/metrics").first, 401);
  auto [metrics_status, metrics_body] = get(std::string("Bearer ") + kToken, "/metrics");
  EXPECT_EQ(metrics_status, 200) << metrics_body;
  EXPECT_THAT(metrics_body, HasSubstr("pipetrain_stages{state=\"IDLE\"}"));
}

TEST_F(SecureClusterTest, BinariesRefusePartialTlsAndEmptyTokens) {
  const std::string d = dir_.File("certs") + "/";
  testing::WriteFileOrDie(dir_.File("empty"), "\n");
  for (const std::string bin : {"pipetrain-coordinator", "pipetrain-stage"}) {
    std::vector<std::string> argv = {Bin(bin), "--listen", "127.0.0.1:0", "--tls-cert",
                                     d + "127.0.0.1.pem", "--tls-ca", d + "ca.pem"};
    if (bin == "pipetrain-coordinator") argv.insert(argv.end(), {"--state-dir", dir_.File("s")});
    auto r = testing::RunCommand(argv, 30s);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 2) << bin << ": " << r->err;
    EXPECT_THAT(r->err, HasSubstr("--tls-key missing")) << bin;
    argv = {Bin(bin), "--listen", "127.0.0.1:0", "--token-file", dir_.File("empty")};
    if (bin == "pipetrain-coordinator") argv.insert(argv.end(), {"--state-dir", dir_.File("s")});
    r = testing::RunCommand(argv, 30s);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->exit_code, 2) << bin << ": " << r->err;
    EXPECT_THAT(r->err, HasSubstr("--token-file")) << bin;
  }
}

TEST_F(SecureClusterTest, APlaintextServerOffLoopbackWarnsAndATlsOneDoesNot) {
  for (bool tls : {false, true}) {
    std::vector<std::string> argv = {Bin("pipetrain-stage"), "--listen", "0.0.0.0:0"};
    if (tls) {
      for (const std::string& a : Tls("127.0.0.1")) argv.push_back(a);
    }
    auto p = testing::Subprocess::Start(argv);
    ASSERT_TRUE(p.ok()) << p.status();
    auto line = p->WaitForLine("stage listening on ", 30s);
    EXPECT_TRUE(line.ok()) << line.status();
    p->Signal(SIGTERM);
    auto code = p->Wait(20s);
    EXPECT_TRUE(code.ok() && *code == 0)
        << (code.ok() ? std::to_string(*code) : code.status().ToString()) << p->stderr_text();
    const std::string warning = "without TLS: anyone who can reach this port can drive this stage";
    if (tls) {
      EXPECT_THAT(p->stderr_text(), ::testing::Not(HasSubstr(warning)));
    } else {
      EXPECT_THAT(p->stderr_text(), HasSubstr(warning));
      EXPECT_THAT(p->stderr_text(), HasSubstr("pass --tls-cert/--tls-key/--tls-ca"));
    }
  }
}

}  // namespace
}  // namespace pipetrain
