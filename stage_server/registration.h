// Keeps a stage server registered with its coordinator: registers (again whenever the
// coordinator has forgotten it) and heartbeats on a background thread until stopped.
// Every heartbeat carries the secret of the registration that gave the id, so a
// restarted coordinator that has handed the same id to another stage refuses it and
// this stage registers again instead of passing for the other one. Registering again,
// it sends its last secret, so the same coordinator lets it replace its own live record.
// Failures are logged when the state changes, not on every attempt. Calls carry the
// stage's TLS certificate and bearer token when it has them. Each answered heartbeat
// also says whether the coordinator holds the stage for a job (held(), or
// HeartbeatNow() for an answer of this moment), which a stage told to stop waits on
// (stop_drain.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/rpc_security.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::stage_server {

class Registration {
 public:
  // `job_id` returns the job currently configured and `links` its peer links' paths
  // (both sent with each heartbeat; no links without it).
  using Links = std::function<std::vector<pipetrain::v1::LinkPath>()>;
  Registration(std::string coordinator, pipetrain::v1::RegisterStageRequest request,
               std::function<std::string()> job_id, common::RpcSecurity security,
               Links links = nullptr);
  ~Registration();  // stops the thread

  std::string stage_id() const;
  // Whether the latest heartbeat said the coordinator holds this stage for a job
  // (running or recovering onto it). False before the first answered heartbeat, after a
  // failed or refused one (a coordinator gone cannot finish a step on this stage), and
  // while registering again.
  bool held() const;
  // Heartbeats at once from the calling thread (deadline 2 s) and returns what that
  // answer says of `held` (false if it failed): a stage told to stop must not go on an
  // answer one interval old, from before a job took it. False while unregistered.
  bool HeartbeatNow();
  // The latest registration's secret ("" while unregistered), for tests.
  std::string registration_secret() const;

 private:
  void Run();
  // One heartbeat of the registration `id` with `secret`, waiting at most `deadline`
  // for its answer; held_ set from it unless the stage has registered again meanwhile.
  grpc::Status Beat(const std::string& id, const std::string& secret, absl::Duration deadline,
                    pipetrain::v1::HeartbeatResponse* response);

  std::string coordinator_;
  pipetrain::v1::RegisterStageRequest request_;
  std::function<std::string()> job_id_;
  Links links_;
  const common::RpcSecurity security_;
  std::unique_ptr<pipetrain::v1::Coordinator::Stub> stub_;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  std::string stage_id_ ABSL_GUARDED_BY(mu_);
  std::string secret_ ABSL_GUARDED_BY(mu_);  // goes with stage_id_; both or neither
  // The secret of the registration a refused heartbeat ended, sent when registering
  // again: the coordinator lets a live stage's record be replaced only with it.
  std::string previous_secret_ ABSL_GUARDED_BY(mu_);
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pipetrain::stage_server
