// gloo's rendezvous store on the coordinator's RendezvousSet / RendezvousGet RPCs, so
// that the replicas of a stage position find each other through the coordinator they
// already know. Every key carries a prefix (job attempt, stage position); every wait
// has a deadline.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_security.h"
#include "gloo/rendezvous/store.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::stage_server::collective {

class CoordinatorStore : public gloo::rendezvous::Store {
 public:
  // Keys are "<prefix><key>" in the coordinator's store of `job_id`. `timeout` bounds
  // get() and the wait(keys) without a timeout of their own.
  CoordinatorStore(const std::string& coordinator_address, const common::RpcSecurity& security,
                   std::string job_id, std::string prefix, absl::Duration timeout);

  // The absl forms, for callers outside gloo. Get waits up to `wait` for the key; a
  // coordinator that does not answer is retried until then (it may be restarting).
  absl::Status Set(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration wait);

  // gloo's interface: the same calls, throwing gloo::IoException on any error (gloo
  // expects that; GradientReducer catches it at its boundary).
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  const std::string& job_id() const { return job_id_; }

 private:
  std::unique_ptr<pipetrain::v1::Coordinator::Stub> stub_;
  const common::RpcSecurity security_;
  const std::string address_;
  const std::string job_id_;
  const std::string prefix_;
  const absl::Duration timeout_;
};

}  // namespace pipetrain::stage_server::collective
