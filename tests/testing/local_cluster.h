// A real coordinator and K stage servers on 127.0.0.1 for end-to-end tests: started
// from the built binaries on port 0, the stages registered with the coordinator, and
// the `pipetrain` CLI run against it, each with extra flags (TLS, tokens) when given.
// Only the processes it started are stopped.
#pragma once

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc_security.h"
#include "tests/testing/subprocess.h"

namespace pipetrain::testing {

struct LocalClusterOptions {
  std::vector<std::string> coordinator_args;  // extra flags for the coordinator
  // The coordinator's --data-root folders when coordinator_args name none. Tests keep
  // their data in temp folders of their own, outside the coordinator's working folder and
  // state dir (its default roots), so by default "/": any file, as they always could.
  // Empty: no --data-root, the coordinator's own default.
  std::vector<std::string> data_roots = {"/"};
  std::vector<std::string> stage_args;        // ... for every stage server
  std::vector<std::string> cli_args;          // ... for every Cli() run
  common::RpcSecurity security;  // how the cluster itself calls the coordinator
};

class LocalCluster {
 public:
  // Starts a coordinator (state in `state_dir`, HTTP API on) and `stages` stages, and
  // waits until every stage is registered and idle.
  // `stage_args` are extra flags for every stage server.
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(
      const std::string& state_dir, int stages, const std::vector<std::string>& stage_args = {});
  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const std::string& state_dir,
                                                             int stages,
                                                             LocalClusterOptions options);
  ~LocalCluster();  // SIGTERM to every process still running

  const std::string& address() const { return address_; }
  int http_port() const { return http_port_; }
  // The coordinator now running (benchmarks read its memory from /proc); 0 if none.
  pid_t coordinator_pid() const { return coordinator_ ? coordinator_->pid() : 0; }
  const std::vector<std::string>& stage_addresses() const { return stage_addresses_; }
  // The stage processes now running (benchmarks read their CPU time from /proc).
  std::vector<pid_t> stage_pids() const;
  // What the coordinator now running wrote to stderr so far (for a failing test's message).
  std::string coordinator_log() const;
  // ... and what every stage wrote, each under its address.
  std::string stage_logs() const;

  // Runs `pipetrain ARGS --address ADDRESS CLI_ARGS` to completion.
  absl::StatusOr<RunResult> Cli(std::vector<std::string> args,
                                std::chrono::milliseconds deadline = std::chrono::seconds(120));

  // Stops the coordinator (SIGTERM, expecting exit 0) and starts it again on the same
  // port and state dir; waits for `stages` registered stages.
  absl::Status RestartCoordinator(int stages);
  // The same with another signal: SIGKILL is a coordinator that died (no exit code
  // is expected then, only that it ends).
  absl::Status RestartCoordinator(int stages, int signal);
  // The two halves, for a test that acts while no coordinator runs: sends `signal`
  // and waits for the coordinator to end (exit 0 expected after SIGTERM only); then
  // starts it on the same port and state dir and waits for `stages` idle stages.
  absl::Status KillCoordinator(int signal = SIGKILL);
  absl::Status StartCoordinatorAgain(int stages);
  // Sends `signal` to the stage server listening on `address`; false if none of ours
  // does.
  bool SignalStage(const std::string& address, int signal);
  // SIGKILLs the stage server listening on `address`; false if none of ours does.
  bool KillStage(const std::string& address);
  // Waits for the stage server listening on `address` to end (killing it at the
  // deadline, with an error then); its exit code. NOT_FOUND if none of ours does.
  absl::StatusOr<int> WaitForStageExit(const std::string& address,
                                       std::chrono::milliseconds deadline);
  // Sends `signal` to the coordinator and every stage at the same moment, as scancel
  // does to the processes of a job, and waits for all of them to end within
  // `deadline` in all; their exit codes, the coordinator's first. An error names those
  // still running at the deadline (killed then).
  absl::StatusOr<std::vector<int>> SignalAllAndWait(int signal,
                                                    std::chrono::milliseconds deadline);
  // SIGKILLs it if it still runs, then starts a new stage server on the same address
  // (it registers again, as a restarted node would).
  absl::Status RestartStage(const std::string& address);
  // Polls GetCluster until `count` stages are IDLE (deadline 30 s).
  absl::Status WaitForIdleStages(int count);

 private:
  absl::Status StartCoordinator(const std::string& listen);
  absl::Status StartStage(size_t i, const std::string& listen);

  std::string state_dir_;
  LocalClusterOptions options_;
  std::string address_;
  int http_port_ = 0;
  std::unique_ptr<Subprocess> coordinator_;
  std::vector<std::unique_ptr<Subprocess>> stages_;
  std::vector<std::string> stage_addresses_;
};

}  // namespace pipetrain::testing
