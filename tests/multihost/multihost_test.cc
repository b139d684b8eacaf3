// Deploy across nodes, in miniature: a coordinator host and 3-4 stage hosts, each its
// own network namespace with its own address on a private bridge, running the real
// binaries with mutual TLS and a bearer token on every connection. A pipeline across
// hosts trains with the losses of one stage, and a stage host whose link goes down
// mid-job is found lost in bounded time, naming that stage, and the job goes on without
// it (on the two other hosts) to the losses of an uninterrupted run.
// Skips where network namespaces cannot be made (not root).
#include <unistd.h>

#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/multihost/multihost_cluster.h"
#include "tests/testing/corpus_text.h"
#include "tests/testing/loss_comparison.h"
#include "tests/testing/tolerance.h"
#include "tests/testing/status_json.h"
#include "tests/testing/temp_files.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::LossesMatch;
using ::pipetrain::testing::kSameArithmetic;
using ::pipetrain::testing::MultiHostCluster;
using ::pipetrain::testing::MultiHostOptions;
using ::pipetrain::testing::Role;
using ::pipetrain::testing::TempDir;
using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace std::chrono_literals;

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::WriteFileOrDie(dir_.File("corpus.txt"), testing::EnglishLikeCorpus());
    spec_ = {
        {"name", "multihost"},
        {"model", {{"vocab_size", 256}, {"seq_len", 16}, {"d_model", 32}, {"n_heads", 2},
                   {"n_layers", 2}}},
        {"pipeline", {{"stages", 1}, {"micro_batches", 4}, {"schedule", "1f1b"}}},
        {"training", {{"steps", 4}, {"batch_size", 8}, {"seed", 7}, {"lr", 0.01},
                      {"weight_decay", 0.0}}},
        {"data", {{"corpus", dir_.File("corpus.txt")}}}};
  }

  // Mutual TLS on every connection and a bearer token, as across real nodes: a CA and
  // one certificate per host address of the private subnet, from make-dev-certs.sh.
  absl::Status Secure(MultiHostOptions& options) {
    std::vector<std::string> argv = {std::string(PIPETRAIN_SOURCE_DIR) +
                                         "/deploy/certs/make-dev-certs.sh",
                                     dir_.File("certs")};
    for (int host = 1; host <= 10; ++host) argv.push_back(absl::StrCat("10.213.0.", host));
    absl::StatusOr<testing::RunResult> made = testing::RunCommand(argv, 60s);
    if (!made.ok()) return made.status();
    if (made->exit_code != 0) return absl::InternalError("make-dev-certs.sh: " + made->err);
    options.http_token = "multihost-token-42";
    testing::WriteFileOrDie(dir_.File("token"), options.http_token + "\n");
    const std::string certs = dir_.File("certs") + "/", token = dir_.File("token");
    options.extra_args = [certs, token](Role role, const std::string& address) {
      const std::string name = role == Role::kCli ? "client" : address;
      return std::vector<std::string>{"--tls-cert", certs + name + ".pem", "--tls-key",
                                      certs + name + "-key.pem", "--tls-ca", certs + "ca.pem",
                                      "--token-file", token};
    };
    return absl::OkStatus();
  }

  // Starts the hosts (with mTLS and a token), or says why this machine cannot have them.
  std::unique_ptr<MultiHostCluster> StartOrSkip(MultiHostOptions options) {
    if (geteuid() != 0) {
      skip_ = absl::StrCat("needs root and network namespaces (running as uid ", geteuid(), ")");
      return nullptr;
    }
    testing::VirtualNetwork::RemoveLeftovers();
    if (absl::Status s = Secure(options); !s.ok()) {
      ADD_FAILURE() << s;
      return nullptr;
    }
    // The corpus is in dir_, beside the state dir: outside the coordinator's default roots.
    options.coordinator_args.insert(options.coordinator_args.end(), {"--data-root", dir_.path()});
    auto c = MultiHostCluster::Start(dir_.File("state"), std::move(options));
    if (absl::IsFailedPrecondition(c.status())) {
      skip_ = absl::StrCat("needs root and network namespaces (", c.status().message(), ")");
      return nullptr;
    }
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  std::string WriteSpec() {
    testing::WriteFileOrDie(dir_.File("job.json"), spec_.dump(2));
    return dir_.File("job.json");
  }

  json Status(MultiHostCluster& c, const std::string& id) {
    auto r = c.Cli({"status", id, "--json"});
    EXPECT_TRUE(r.ok() && r->exit_code == 0) << (r.ok() ? r->err : r.status().ToString());
    json j = json::parse(r.ok() ? r->out : "", nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << (r.ok() ? r->out : "");
    return j;
  }

  // Submits with `--set` overrides; follows the job to its end unless `no_wait`.
  std::string Submit(MultiHostCluster& c, const std::vector<std::string>& sets, bool no_wait) {
    std::vector<std::string> args = {"submit", WriteSpec()};
    for (const std::string& s : sets) {
      args.push_back("--set");
      args.push_back(s);
    }
    if (no_wait) args.push_back("--no-wait");
    auto r = c.Cli(args);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return "";
    EXPECT_EQ(r->exit_code, 0) << r->out << r->err;
    if (no_wait) return std::string(absl::StripAsciiWhitespace(r->out));
    // "submitted job-000001 (...)" is the first line.
    std::vector<std::string> words = absl::StrSplit(r->out.substr(0, r->out.find('\n')), ' ');
    EXPECT_GT(words.size(), 1u) << r->out;
    return words.size() > 1 ? words[1] : "";
  }

  // Polls status until `pred` holds or `deadline` passes.
  template <typename Pred>
  json WaitFor(MultiHostCluster& c, const std::string& id, std::chrono::seconds deadline,
               Pred pred) {
    const auto end = std::chrono::steady_clock::now() + deadline;
    json s;
    while (std::chrono::steady_clock::now() < end) {
      s = Status(c, id);
      if (pred(s)) return s;
      std::this_thread::sleep_for(200ms);
    }
    ADD_FAILURE() << "job " << id << " did not get there within " << deadline.count()
                  << " s: " << s.dump();
    return s;
  }

  static std::vector<double> Losses(const json& status) {
    std::vector<double> out;
    for (const json& h : status["history"]) out.push_back(h["loss"].get<double>());
    return out;
  }

  // stage id -> address, from `pipetrain cluster --json`.
  static std::map<std::string, std::string> Addresses(MultiHostCluster& c) {
    std::map<std::string, std::string> out;
    auto r = c.Cli({"cluster", "--json"});
    EXPECT_TRUE(r.ok() && r->exit_code == 0);
    if (!r.ok()) return out;
    const json view = json::parse(r->out, nullptr, false);
    if (view.is_discarded()) return out;
    for (const json& s : view["stages"]) out[s["stage_id"]] = s["address"];
    return out;
  }

  TempDir dir_;
  json spec_;
  std::string skip_;
};

TEST_F(MultiHostTest, APipelineAcrossHostsTrainsLikeOneStage) {
  MultiHostOptions options;
  options.stage_hosts = 4;
  std::unique_ptr<MultiHostCluster> cluster = StartOrSkip(options);
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(cluster, nullptr);
  MultiHostCluster& c = *cluster;

  const json one = Status(c, Submit(c, {}, false));
  ASSERT_EQ(one["state"], "SUCCEEDED") << one.dump();
  const std::vector<double> ref = Losses(one);
  ASSERT_EQ(ref.size(), 4u);

  const json four = Status(c, Submit(c, {"pipeline.stages=4"}, false));
  ASSERT_EQ(four["state"], "SUCCEEDED") << four.dump();
  // Every stage of the job on its own host: four distinct addresses off loopback.
  const std::map<std::string, std::string> addresses = Addresses(c);
  std::set<std::string> hosts;
  for (const json& stage_id : four["stage_ids"]) {
    const std::string id = stage_id;
    const std::string address = addresses.count(id) ? addresses.at(id) : "";
    EXPECT_THAT(address, ::testing::StartsWith("10.")) << id;
    hosts.insert(address.substr(0, address.rfind(':')));
  }
  EXPECT_EQ(hosts.size(), 4u);
  EXPECT_TRUE(LossesMatch(Losses(four), ref, kSameArithmetic)) << "4 hosts against 1";

  // The HTTP API answers on the coordinator host's address, from the client host.
  auto api = c.HttpGet("/api/cluster");
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_EQ(api->first, 200);
  const json view = json::parse(api->second, nullptr, false);
  ASSERT_FALSE(view.is_discarded()) << api->second;
  EXPECT_EQ(view["stages"].size(), 4u);

  absl::Status stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

TEST_F(MultiHostTest, AStageHostWhoseLinkGoesDownIsLostInBoundedTimeAndTheJobGoesOn) {
  MultiHostOptions options;
  options.stage_hosts = 3;
  options.coordinator_args = {"--stage-deadline", "5"};
  std::unique_ptr<MultiHostCluster> cluster = StartOrSkip(options);
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(cluster, nullptr);
  MultiHostCluster& c = *cluster;

  // Long enough (a few seconds) to pull the link mid-job.
  spec_["training"]["steps"] = 300;
  const std::vector<double> ref = Losses(Status(c, Submit(c, {"pipeline.stages=3"}, false)));
  ASSERT_EQ(ref.size(), 300u);
  const std::string id = Submit(c, {"pipeline.stages=3"}, true);
  const json running =
      WaitFor(c, id, 60s, [](const json& s) { return s.value("steps_done", "0") != "0"; });
  ASSERT_EQ(running["stage_ids"].size(), 3u) << running.dump();
  const std::string victim = running["stage_ids"][1];
  const std::map<std::string, std::string> addresses = Addresses(c);
  ASSERT_TRUE(addresses.count(victim)) << victim;

  const auto pulled = std::chrono::steady_clock::now();
  absl::Status down = c.TakeStageLinkDown(addresses.at(victim));
  ASSERT_TRUE(down.ok()) << down;
  // --stage-deadline 5: a neighbour gives up on the victim after 5 s, and the
  // coordinator's health check on it takes 3 s more; 30 s bounds it with room for a
  // loaded machine.
  const json lost = WaitFor(c, id, 30s, [](const json& s) {
    return !s.value("recoveries", json::array()).empty();
  });
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - pulled).count();
  ASSERT_FALSE(lost.value("recoveries", json::array()).empty()) << lost.dump();
  EXPECT_LT(took, 30.0);
  EXPECT_EQ(lost["recoveries"][0]["lost_stage_ids"][0], victim);
  auto logs = c.Cli({"logs", id});
  ASSERT_TRUE(logs.ok());
  EXPECT_THAT(logs->out, HasSubstr(victim));
  EXPECT_THAT(logs->out, HasSubstr(addresses.at(victim)));
  EXPECT_THAT(logs->out, HasSubstr("stopped answering"));
  std::cout << "the stage was found lost " << took << " s after the link went down\n";
  // No host is free: it continues on the two it has, to the same losses.
  const json done = WaitFor(c, id, 120s, ::pipetrain::testing::JobHasEnded);
  ASSERT_EQ(done["state"], "SUCCEEDED") << done.dump();
  EXPECT_EQ(done["stage_ids"].size(), 2u);
  EXPECT_TRUE(LossesMatch(Losses(done), ref, kSameArithmetic)) << "after the link went down";

  // The cluster goes on without that host: the victim is LOST, the others take a job.
  absl::Status idle = c.WaitForIdleStages(2);
  ASSERT_TRUE(idle.ok()) << idle;
  spec_["training"]["steps"] = 2;
  const json next = Status(c, Submit(c, {"pipeline.stages=2"}, false));
  EXPECT_EQ(next["state"], "SUCCEEDED") << next.dump();
  auto view = c.Cli({"cluster"});
  ASSERT_TRUE(view.ok());
  EXPECT_THAT(view->out, HasSubstr("LOST"));

  // Nothing hangs: every server, the cut-off one too, stops on SIGTERM.
  absl::Status stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

// Recovery across hosts: the coordinator's host process SIGKILLed mid-job and started
// again on the same --state-dir; the stages on their own hosts keep their snapshots and
// register again, and the job continues from them to the uninterrupted run's losses.
TEST_F(MultiHostTest, AJobGoesOnAfterTheCoordinatorIsKilledAndStartedAgain) {
  MultiHostOptions options;
  options.stage_hosts = 3;
  std::unique_ptr<MultiHostCluster> cluster = StartOrSkip(options);
  if (!skip_.empty()) GTEST_SKIP() << skip_;
  ASSERT_NE(cluster, nullptr);
  MultiHostCluster& c = *cluster;

  spec_["training"]["steps"] = 300;
  const std::vector<double> ref = Losses(Status(c, Submit(c, {"pipeline.stages=3"}, false)));
  ASSERT_EQ(ref.size(), 300u);
  const std::string id = Submit(c, {"pipeline.stages=3"}, true);
  WaitFor(c, id, 60s, [](const json& s) { return s.value("steps_done", "0") != "0"; });
  absl::Status restarted = c.RestartCoordinator(SIGKILL);
  ASSERT_TRUE(restarted.ok()) << restarted;
  const json done = WaitFor(c, id, 120s, ::pipetrain::testing::JobHasEnded);
  ASSERT_EQ(done["state"], "SUCCEEDED") << done.dump();
  ASSERT_EQ(done.value("recoveries", json::array()).size(), 1u) << done.dump();
  EXPECT_EQ(done["recoveries"][0]["source"], "the stages' snapshots") << done.dump();
  EXPECT_EQ(done["stage_ids"].size(), 3u);
  EXPECT_TRUE(LossesMatch(Losses(done), ref, kSameArithmetic)) << "after the coordinator's restart";

  absl::Status stopped = c.Stop();
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace pipetrain
