// Keeps a stage server registered with its coordinator: registers (again whenever the
// coordinator has forgotten it) and heartbeats on a background thread until stopped.
// Every heartbeat carries the secret of the registration that gave the id, so a
// restarted coordinator that has handed the same id to another stage refuses it and
// this stage registers again instead of passing for the other one. Registering again,
// it sends its last secret, so the same coordinator lets it replace its own live record.
// Failures are logged when the state changes, not on every attempt. Calls carry the
// stage's TLS certificate and bearer token when it has them.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/rpc_security.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::stage_server {

class Registration {
 public:
  // `job_id` returns the job currently configured (sent with each heartbeat).
  Registration(std::string coordinator, pipetrain::v1::RegisterStageRequest request,
               std::function<std::string()> job_id, common::RpcSecurity security);
  ~Registration();  // stops the thread

  std::string stage_id() const;
  // The latest registration's secret ("" while unregistered), for tests.
  std::string registration_secret() const;

 private:
  void Run();

  std::string coordinator_;
  pipetrain::v1::RegisterStageRequest request_;
  std::function<std::string()> job_id_;
  const common::RpcSecurity security_;
  std::unique_ptr<pipetrain::v1::Coordinator::Stub> stub_;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  std::string stage_id_ ABSL_GUARDED_BY(mu_);
  std::string secret_ ABSL_GUARDED_BY(mu_);  // goes with stage_id_; both or neither
  // The secret of the registration a refused heartbeat ended, sent when registering
  // again: the coordinator lets a live stage's record be replaced only with it.
  std::string previous_secret_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace pipetrain::stage_server
