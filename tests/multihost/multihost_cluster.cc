#include "tests/multihost/multihost_cluster.h"

#include <signal.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace pipetrain::testing {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

std::string Bin(const std::string& name) { return std::string(PIPETRAIN_BIN_DIR) + "/" + name; }

// Waits for a process's "... listening on" line; the error carries its stderr.
absl::Status WaitListening(Subprocess& p, const std::string& needle, const std::string& what) {
  absl::StatusOr<std::string> line = p.WaitForLine(needle, 30s);
  if (line.ok()) return absl::OkStatus();
  return absl::Status(line.status().code(),
                      absl::StrCat(what, " did not start: ", line.status().message(),
                                   "; its stderr: ", p.stderr_text()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<MultiHostCluster>> MultiHostCluster::Start(
    const std::string& state_dir, MultiHostOptions options) {
  std::unique_ptr<MultiHostCluster> c(new MultiHostCluster());
  c->options_ = std::move(options);
  absl::StatusOr<std::unique_ptr<VirtualNetwork>> net = VirtualNetwork::Create();
  if (!net.ok()) return net.status();
  c->network_ = *std::move(net);

  absl::StatusOr<std::string> ip = c->network_->AddHost("coord");
  if (!ip.ok()) return ip.status();
  c->coordinator_ip_ = *ip;
  c->address_ = absl::StrCat(*ip, ":", kCoordinatorPort);
  absl::StatusOr<std::string> cli = c->network_->AddHost("cli");
  if (!cli.ok()) return cli.status();
  c->cli_ip_ = *cli;

  std::vector<std::string> argv = {
      Bin("pipetrain-coordinator"), "--listen", c->address_, "--http",
      absl::StrCat(*ip, ":", kHttpPort), "--state-dir", state_dir, "--heartbeat-timeout", "2"};
  argv.insert(argv.end(), c->options_.coordinator_args.begin(), c->options_.coordinator_args.end());
  for (std::string& a : c->ExtraArgs(Role::kCoordinator, *ip)) argv.push_back(std::move(a));
  c->coordinator_argv_ = c->network_->InHost("coord", argv);
  absl::StatusOr<Subprocess> coordinator = Subprocess::Start(c->coordinator_argv_);
  if (!coordinator.ok()) return coordinator.status();
  c->coordinator_ = std::make_unique<Subprocess>(*std::move(coordinator));
  if (absl::Status s =
          WaitListening(*c->coordinator_, "coordinator listening on ", "the coordinator");
      !s.ok()) {
    return s;
  }

  for (int i = 0; i < c->options_.stage_hosts; ++i) {
    const std::string host = absl::StrCat("s", i);
    absl::StatusOr<std::string> stage_ip = c->network_->AddHost(host);
    if (!stage_ip.ok()) return stage_ip.status();
    std::vector<std::string> stage = {Bin("pipetrain-stage"), "--listen",
                                      absl::StrCat(*stage_ip, ":", kStagePort), "--coordinator",
                                      c->address_, "--device", "cpu", "--threads", "1"};
    for (std::string& a : c->ExtraArgs(Role::kStage, *stage_ip)) stage.push_back(std::move(a));
    absl::StatusOr<Subprocess> p = Subprocess::Start(c->network_->InHost(host, stage));
    if (!p.ok()) return p.status();
    c->stages_.push_back(std::make_unique<Subprocess>(*std::move(p)));
    if (absl::Status s = WaitListening(*c->stages_.back(), "stage listening on ",
                                       absl::StrCat("the stage on host ", host));
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = c->WaitForIdleStages(c->options_.stage_hosts); !s.ok()) return s;
  return c;
}

MultiHostCluster::~MultiHostCluster() {
  (void)Stop();
  network_.reset();  // after every process of ours in it has ended
}

absl::Status MultiHostCluster::Stop() {
  std::vector<std::pair<std::string, std::unique_ptr<Subprocess>>> all;
  for (size_t i = 0; i < stages_.size(); ++i) {
    all.emplace_back(absl::StrCat("the stage on host s", i), std::move(stages_[i]));
  }
  if (coordinator_) all.emplace_back("the coordinator", std::move(coordinator_));
  stages_.clear();
  // All at once, so a stage stuck behind a downed link costs one deadline, not one each.
  for (auto& [name, p] : all) p->Signal(SIGTERM);
  std::string problems;
  for (auto& [name, p] : all) {
    absl::StatusOr<int> code = p->Wait(15s);  // kills at the deadline
    if (!code.ok()) {
      absl::StrAppend(&problems, name, " did not stop within 15 s of SIGTERM; ");
    } else if (*code != 0) {
      absl::StrAppend(&problems, name, " exited with ", *code, ": ", p->stderr_text(), "; ");
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InternalError(problems);
}

absl::Status MultiHostCluster::RestartCoordinator(int signal) {
  if (!coordinator_) return absl::FailedPreconditionError("no coordinator is running");
  coordinator_->Signal(signal);
  absl::StatusOr<int> code = coordinator_->Wait(15s);  // kills at the deadline
  if (!code.ok()) return code.status();
  coordinator_.reset();
  absl::StatusOr<Subprocess> again = Subprocess::Start(coordinator_argv_);
  if (!again.ok()) return again.status();
  coordinator_ = std::make_unique<Subprocess>(*std::move(again));
  return WaitListening(*coordinator_, "coordinator listening on ", "the restarted coordinator");
}

std::vector<std::string> MultiHostCluster::ExtraArgs(Role role,
                                                     const std::string& host_address) const {
  if (!options_.extra_args) return {};
  return options_.extra_args(role, host_address);
}

absl::StatusOr<RunResult> MultiHostCluster::Cli(std::vector<std::string> args,
                                                std::chrono::milliseconds deadline) {
  args.insert(args.begin(), Bin("pipetrain"));
  args.push_back("--address");
  args.push_back(address_);
  for (std::string& a : ExtraArgs(Role::kCli, cli_ip_)) args.push_back(std::move(a));
  return RunCommand(network_->InHost("cli", args), deadline);
}

absl::StatusOr<std::pair<int, std::string>> MultiHostCluster::HttpGet(const std::string& path) {
  absl::StatusOr<std::pair<int, std::string>> out =
      absl::UnavailableError(absl::StrCat("GET ", path, " got no answer"));
  absl::Status entered = network_->RunInHost("cli", [&] {
    httplib::Client http(coordinator_ip_, kHttpPort);
    http.set_connection_timeout(5);
    http.set_read_timeout(10);
    httplib::Headers headers;
    if (!options_.http_token.empty()) {
      headers.emplace("Authorization", "Bearer " + options_.http_token);
    }
    if (auto r = http.Get(path.c_str(), headers)) out = std::make_pair(r->status, r->body);
  });
  if (!entered.ok()) return entered;
  return out;
}

absl::Status MultiHostCluster::TakeStageLinkDown(const std::string& stage_address) {
  const std::string host = network_->HostOf(stage_address.substr(0, stage_address.rfind(':')));
  if (host.empty()) return absl::NotFoundError("no stage host has address " + stage_address);
  return network_->SetLink(host, false);
}

absl::Status MultiHostCluster::WaitForIdleStages(int count) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  int idle = 0;
  std::string last;
  while (std::chrono::steady_clock::now() < deadline) {
    absl::StatusOr<RunResult> r = Cli({"cluster", "--json"}, 10s);
    if (r.ok() && r->exit_code == 0) {
      const json view = json::parse(r->out, nullptr, false);
      idle = 0;
      if (!view.is_discarded()) {
        for (const json& s : view.value("stages", json::array())) idle += s["state"] == "IDLE";
      }
      if (idle >= count) return absl::OkStatus();
    }
    last = r.ok() ? r->out + r->err : r.status().ToString();
    std::this_thread::sleep_for(200ms);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "only ", idle, " of ", count, " stages became idle within 30 s; last answer: ", last));
}

}  // namespace pipetrain::testing
