#include "tests/testing/local_cluster.h"

#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::testing {
namespace {

using namespace std::chrono_literals;

// The built binaries; PIPETRAIN_BIN_DIR in the environment overrides the build's folder
// (bench/gpu.sh runs packed tests on another machine, with the binaries beside them).
std::string Bin(const std::string& name) {
  const char* env = std::getenv("PIPETRAIN_BIN_DIR");
  return std::string(env != nullptr && *env != '\0' ? env : PIPETRAIN_BIN_DIR) + "/" + name;
}

int PortOf(const std::string& line) {
  int port = 0;
  (void)absl::SimpleAtoi(line.substr(line.rfind(':') + 1), &port);
  return port;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(
    const std::string& state_dir, int stages, const std::vector<std::string>& stage_args) {
  LocalClusterOptions options;
  options.stage_args = stage_args;
  return Start(state_dir, stages, std::move(options));
}

absl::StatusOr<std::unique_ptr<LocalCluster>> LocalCluster::Start(const std::string& state_dir,
                                                                  int stages,
                                                                  LocalClusterOptions options) {
  std::unique_ptr<LocalCluster> c(new LocalCluster());
  c->state_dir_ = state_dir;
  c->options_ = std::move(options);
  if (absl::Status s = c->StartCoordinator("127.0.0.1:0"); !s.ok()) return s;
  for (int i = 0; i < stages; ++i) {
    c->stages_.emplace_back();
    c->stage_addresses_.emplace_back();
    if (absl::Status s = c->StartStage(i, "127.0.0.1:0"); !s.ok()) return s;
  }
  if (absl::Status s = c->WaitForIdleStages(stages); !s.ok()) return s;
  return c;
}

absl::Status LocalCluster::StartStage(size_t i, const std::string& listen) {
  std::vector<std::string> argv = {Bin("pipetrain-stage"), "--listen", listen, "--device",
                                   "cpu", "--coordinator", address_};
  argv.insert(argv.end(), options_.stage_args.begin(), options_.stage_args.end());
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv);
  if (!p.ok()) return p.status();
  stages_[i] = std::make_unique<Subprocess>(*std::move(p));
  absl::StatusOr<std::string> line = stages_[i]->WaitForLine("stage listening on ", 30s);
  if (!line.ok()) return line.status();
  stage_addresses_[i] = line->substr(line->rfind(' ') + 1);
  return absl::OkStatus();
}

absl::Status LocalCluster::RestartStage(const std::string& address) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (stage_addresses_[i] != address) continue;
    stages_[i]->Signal(SIGKILL);
    if (absl::StatusOr<int> code = stages_[i]->Wait(30s); !code.ok()) return code.status();
    return StartStage(i, address);
  }
  return absl::NotFoundError(absl::StrCat("no stage of this cluster listens on ", address));
}

absl::Status LocalCluster::StartCoordinator(const std::string& listen) {
  std::vector<std::string> argv = {Bin("pipetrain-coordinator"), "--listen", listen, "--state-dir",
                                   state_dir_, "--http", "127.0.0.1:0", "--heartbeat-timeout", "2"};
  argv.insert(argv.end(), options_.coordinator_args.begin(), options_.coordinator_args.end());
  if (std::find(argv.begin(), argv.end(), "--data-root") == argv.end()) {
    for (const std::string& root : options_.data_roots) {
      argv.insert(argv.end(), {"--data-root", root});
    }
  }
  absl::StatusOr<Subprocess> p = Subprocess::Start(argv);
  if (!p.ok()) return p.status();
  coordinator_ = std::make_unique<Subprocess>(*std::move(p));
  absl::StatusOr<std::string> http = coordinator_->WaitForLine("coordinator http listening on ", 30s);
  if (!http.ok()) return http.status();
  http_port_ = PortOf(*http);
  absl::StatusOr<std::string> line = coordinator_->WaitForLine("coordinator listening on ", 30s);
  if (!line.ok()) return line.status();
  address_ = line->substr(line->rfind(' ') + 1);
  return absl::OkStatus();
}

std::string LocalCluster::coordinator_log() const {
  return coordinator_ ? coordinator_->stderr_text() : std::string();
}

std::vector<pid_t> LocalCluster::stage_pids() const {
  std::vector<pid_t> out;
  for (const auto& p : stages_) {
    if (p) out.push_back(p->pid());
  }
  return out;
}

std::string LocalCluster::stage_logs() const {
  std::string out;
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (!stages_[i]) continue;
    absl::StrAppend(&out, "--- stage at ", i < stage_addresses_.size() ? stage_addresses_[i] : "?",
                    "\n", stages_[i]->stderr_text());
  }
  return out;
}

LocalCluster::~LocalCluster() {
  for (auto& s : stages_) s->Signal(SIGTERM);
  if (coordinator_) coordinator_->Signal(SIGTERM);
  for (auto& s : stages_) (void)s->Wait(20s);
  if (coordinator_) (void)coordinator_->Wait(20s);
}

absl::StatusOr<RunResult> LocalCluster::Cli(std::vector<std::string> args,
                                            std::chrono::milliseconds deadline) {
  args.insert(args.begin(), Bin("pipetrain"));
  args.push_back("--address");
  args.push_back(address_);
  args.insert(args.end(), options_.cli_args.begin(), options_.cli_args.end());
  return RunCommand(args, deadline);
}

absl::Status LocalCluster::WaitForIdleStages(int count) {
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(address_, options_.security.ChannelCredentials()));
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  int idle = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    options_.security.AddToken(ctx);
    v1::ClusterStatus cluster;
    if (stub->GetCluster(&ctx, v1::GetClusterRequest(), &cluster).ok()) {
      idle = 0;
      for (const v1::StageInfo& s : cluster.stages()) idle += s.state() == v1::StageInfo::IDLE;
      if (idle >= count) return absl::OkStatus();
    }
    std::this_thread::sleep_for(100ms);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("only ", idle, " of ", count, " stages became idle within 30 s"));
}

absl::Status LocalCluster::RestartCoordinator(int stages) {
  return RestartCoordinator(stages, SIGTERM);
}

absl::Status LocalCluster::RestartCoordinator(int stages, int signal) {
  if (absl::Status s = KillCoordinator(signal); !s.ok()) return s;
  return StartCoordinatorAgain(stages);
}

absl::Status LocalCluster::KillCoordinator(int signal) {
  if (coordinator_ == nullptr) return absl::FailedPreconditionError("no coordinator is running");
  coordinator_->Signal(signal);
  absl::StatusOr<int> code = coordinator_->Wait(30s);
  if (!code.ok()) return code.status();
  if (signal == SIGTERM && *code != 0) {
    return absl::InternalError(absl::StrCat("coordinator exited with ", *code, ": ",
                                            coordinator_->stderr_text()));
  }
  coordinator_.reset();
  return absl::OkStatus();
}

absl::Status LocalCluster::StartCoordinatorAgain(int stages) {
  if (absl::Status s = StartCoordinator(address_); !s.ok()) return s;
  return WaitForIdleStages(stages);
}

bool LocalCluster::SignalStage(const std::string& address, int signal) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (stage_addresses_[i] != address) continue;
    stages_[i]->Signal(signal);
    return true;
  }
  return false;
}

bool LocalCluster::KillStage(const std::string& address) { return SignalStage(address, SIGKILL); }

absl::StatusOr<int> LocalCluster::WaitForStageExit(const std::string& address,
                                                   std::chrono::milliseconds deadline) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (stage_addresses_[i] == address) return stages_[i]->Wait(deadline);
  }
  return absl::NotFoundError(absl::StrCat("no stage of this cluster listens on ", address));
}

absl::StatusOr<std::vector<int>> LocalCluster::SignalAllAndWait(
    int signal, std::chrono::milliseconds deadline) {
  std::vector<Subprocess*> all;
  if (coordinator_) all.push_back(coordinator_.get());
  for (auto& s : stages_) all.push_back(s.get());
  for (Subprocess* p : all) p->Signal(signal);
  const auto end = std::chrono::steady_clock::now() + deadline;
  std::vector<int> codes;
  std::string late;
  for (Subprocess* p : all) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    absl::StatusOr<int> code = p->Wait(std::max(left, std::chrono::milliseconds(1)));
    if (!code.ok()) absl::StrAppend(&late, late.empty() ? "" : ", ", "pid ", p->pid());
    codes.push_back(code.ok() ? *code : -1);
  }
  if (!late.empty()) {
    return absl::DeadlineExceededError(absl::StrCat(
        late, " still running ", deadline.count(), " ms after signal ", signal, " (killed)"));
  }
  return codes;
}

}  // namespace pipetrain::testing
