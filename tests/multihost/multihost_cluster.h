// A coordinator host, K stage hosts and a client host, each its own network namespace
// on a private bridge (VirtualNetwork), running the real binaries; the `pipetrain` CLI
// runs on the client host. Only the processes it started are stopped, by pid.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/multihost/virtual_network.h"
#include "tests/testing/subprocess.h"

namespace pipetrain::testing {

enum class Role { kCoordinator, kStage, kCli };

struct MultiHostOptions {
  int stage_hosts = 4;
  std::vector<std::string> coordinator_args;  // e.g. {"--stage-deadline", "5"}
  // Flags for every binary, by role and host address: the one place where mTLS
  // (--tls-cert/--tls-key/--tls-ca, certificates for each host address) and
  // --token-file get switched on for the whole cluster.
  std::function<std::vector<std::string>(Role role, const std::string& host_address)> extra_args;
  std::string http_token;  // sent as "Authorization: Bearer" by HttpGet when set
};

class MultiHostCluster {
 public:
  static constexpr int kCoordinatorPort = 7400;
  static constexpr int kHttpPort = 7401;
  static constexpr int kStagePort = 7500;

  // Makes the hosts, starts the coordinator (state in `state_dir`, HTTP API on) and one
  // stage per stage host, and waits until every stage is registered and idle.
  // FAILED_PRECONDITION where network namespaces cannot be made.
  static absl::StatusOr<std::unique_ptr<MultiHostCluster>> Start(const std::string& state_dir,
                                                                 MultiHostOptions options);
  ~MultiHostCluster();  // SIGTERM to each process, SIGKILL at a deadline; then the hosts go

  const std::string& address() const { return address_; }  // the coordinator's gRPC
  VirtualNetwork& network() { return *network_; }

  // Runs `pipetrain ARGS --address ADDRESS` on the client host to completion.
  absl::StatusOr<RunResult> Cli(std::vector<std::string> args,
                                std::chrono::milliseconds deadline = std::chrono::seconds(120));
  // GET http://COORDINATOR:kHttpPort/PATH from the client host: status and body.
  absl::StatusOr<std::pair<int, std::string>> HttpGet(const std::string& path);
  // Pulls the cable of the stage host serving `stage_address` (HOST:PORT).
  absl::Status TakeStageLinkDown(const std::string& stage_address);
  // Kills the coordinator with `signal`, waits for it, and starts it again on its host
  // with the same flags and --state-dir; returns once it listens.
  absl::Status RestartCoordinator(int signal);
  // Stops every process (SIGTERM, all at once) and waits for each, 15 s at most; an
  // error names any that had to be killed or exited other than 0. Idempotent.
  absl::Status Stop();
  // Polls `pipetrain cluster --json` until `count` stages are IDLE (deadline 30 s).
  absl::Status WaitForIdleStages(int count);

 private:
  MultiHostCluster() = default;
  std::vector<std::string> ExtraArgs(Role role, const std::string& host_address) const;

  MultiHostOptions options_;
  std::unique_ptr<VirtualNetwork> network_;
  std::string coordinator_ip_;
  std::string cli_ip_;
  std::string address_;
  std::vector<std::string> coordinator_argv_;  // in its host, for RestartCoordinator
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> stages_;
};

}  // namespace pipetrain::testing
