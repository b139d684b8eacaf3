// The data-parallel gradient reduction the stage runtime calls before its optimizer
// step: the R replicas of one stage position sum their gradient buffers. Two
// implementations, both rendezvousing through the coordinator (CoordinatorStore): gloo
// over TCP (CPU stages, and CUDA stages that share a GPU), which turns every gloo
// exception into a status, and NCCL (nccl_reducer.h: CUDA stages on GPUs of their own).
// reducer_choice.h picks one.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc_security.h"

namespace pipetrain::stage_server::collective {

class CoordinatorStore;

// Sums float buffers across the R replicas of one stage position; each call a
// deadline; errors name the job, the stage position, this replica and the peer.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  // In place: afterwards every replica's `data` holds the element-wise sum of all
  // replicas' buffers. Every replica must call it with the same length, in the same
  // order of calls. After an error the reducer is broken (its connections are in an
  // unknown state): later calls fail at once; make a new one (with a new prefix).
  virtual absl::Status AllReduceSum(std::span<float> data, absl::Duration deadline) = 0;
  // The two halves of an all-reduce, for copies that split the optimizer between them
  // (common/model/optimizer_split.h: copy r owns piece RangeOfCopy(data.size(), R, r)).
  // ReduceScatterSum: afterwards this replica's own piece of `data` holds the sum of all
  // replicas' pieces, added in replica order; the rest of `data` is left as it was.
  virtual absl::Status ReduceScatterSum(std::span<float> data, absl::Duration deadline) = 0;
  // AllGather: afterwards every piece of `data` holds its owner's piece (this replica's
  // own piece is what it was). Same rules as AllReduceSum: equal lengths, same order.
  virtual absl::Status AllGather(std::span<float> data, absl::Duration deadline) = 0;
  virtual int rank() const = 0;  // this replica
  virtual int size() const = 0;  // R
  // "gloo", "nccl", or "none" (R = 1), for logs and benches.
  virtual const char* library() const = 0;
};

struct ReducerOptions {
  std::string job_id;
  int stage = 0;    // the stage position; the replicas of one position reduce together
  int replica = 0;  // this replica, 0 .. replicas - 1
  int replicas = 1;
  // Unique per attempt of the job (e.g. "run-3"): a restarted job must not find the
  // addresses its previous attempt published. The stage position is appended.
  std::string rendezvous_prefix;
  std::string coordinator_address;
  common::RpcSecurity security;
  // The host this stage listens on for its peers (gloo binds an ephemeral TCP port).
  std::string listen_host = "127.0.0.1";
  // How long to wait for every replica to arrive and connect.
  absl::Duration connect_deadline = absl::Seconds(60);
};

// Connects this replica to the others of its stage position (blocking up to
// connect_deadline): INVALID_ARGUMENT for bad options naming the field,
// DEADLINE_EXCEEDED naming the replicas that did not arrive, UNAVAILABLE when the
// coordinator or a peer cannot be reached. With replicas = 1: a no-op reducer, no
// connection at all.
absl::StatusOr<std::unique_ptr<GradientReducer>> CreateGlooReducer(const ReducerOptions& options);

// CreateGlooReducer's second half, for a caller that has already exchanged every
// replica's listen_host (`hosts`, in replica order) through `store`: gloo's full mesh,
// connected by `deadline`. UNAVAILABLE naming the hosts when it cannot be.
absl::StatusOr<std::unique_ptr<GradientReducer>> ConnectGlooReducer(const ReducerOptions& options,
                                                                    CoordinatorStore& store,
                                                                    std::vector<std::string> hosts,
                                                                    absl::Time deadline);

// INVALID_ARGUMENT naming the field when `options` are unusable (the check every
// Create*Reducer makes first).
absl::Status CheckReducerOptions(const ReducerOptions& options);

// "job J, stage S, replica r of R": how every message of a reducer begins.
std::string ReducerWho(const ReducerOptions& options);

// The keys' prefix in the coordinator's store for this stage position's replicas.
std::string StageRendezvousPrefix(const ReducerOptions& options);

// Every replica of this stage position publishes `value` under `key` + its replica
// number in `store` and reads the others', waiting until `deadline`: the values in
// replica order. DEADLINE_EXCEEDED names the replicas that did not arrive.
absl::StatusOr<std::vector<std::string>> ExchangeWithReplicas(const ReducerOptions& options,
                                                              CoordinatorStore& store,
                                                              const std::string& key,
                                                              const std::string& value,
                                                              absl::Time deadline);

}  // namespace pipetrain::stage_server::collective
