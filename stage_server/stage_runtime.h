// What a stage server is, minus gRPC translation: at most one configured job (its
// device backend, model chunks, executor and neighbour links) and the steps run on it.
// Configure checks everything, including memory, before it allocates; RunStep connects
// the links on first use (all stages are configured by then) and runs the program.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model/gpt_config.h"
#include "common/rpc_security.h"
#include "common/schedule/stage_program.h"
#include "stage_server/backend_chunk.h"
#include "stage_server/compute/backend.h"
#include "stage_server/device_spec.h"
#include "stage_server/executor.h"
#include "stage_server/fault_injection.h"
#include "stage_server/peer_link.h"
#include "stage_server/snapshot_store.h"

namespace pipetrain::stage_server {

namespace collective {
class GradientReducer;
}

struct RuntimeOptions {
  DeviceSpec device;
  int threads = 1;                // CPU compute threads
  uint64_t memory_limit_bytes = 0;  // 0 = no limit
  // Where replicas of a stage position meet (its --coordinator; "" without one) and the
  // host its gloo connections listen on.
  std::string coordinator_address;
  std::string listen_host = "127.0.0.1";
  // TLS for the peer links this stage opens, and the token its control calls require.
  common::RpcSecurity security;
  // --fail-at: dies at one point of one step of one job (tests); null: never.
  std::shared_ptr<FaultInjector> faults;
};

struct JobConfig {
  std::string job_id;
  int stage = 0;
  int num_stages = 1;
  model::GptConfig model;
  std::vector<std::pair<int, int>> chunks;  // pipeline layers [begin, end) per chunk
  uint64_t seed = 0;
  OptimizerSettings optimizer;
  std::string upstream_address;    // previous stage (ring: stage K-1 for stage 0)
  std::string downstream_address;  // next stage (ring: stage 0 for stage K-1)
  // Per chunk (as `chunks`): whether it re-runs its forward before its backward, as the
  // coordinator's plan decided (ConfigureRequest.chunk_recompute); empty: no chunk does.
  std::vector<bool> chunk_recompute;
  bool recomputes(size_t chunk) const {
    return chunk < chunk_recompute.size() && chunk_recompute[chunk];
  }
  size_t frame_bytes = common::kDefaultFrameBytes;
  int micro_batch_size = 1;
  std::string peer_secret;
  absl::Duration recv_timeout = absl::Seconds(60);
  // Where this stage's snapshots are copied (the ring successor); "" = kept here only.
  std::string snapshot_peer_address;
  uint64_t snapshot_reserve_bytes = 0;  // counted with the state against --memory-limit
  // Data-parallel replicas (ConfigureRequest.replica, replicas, rendezvous_prefix).
  int replica = 0;
  int replicas = 1;
  std::string rendezvous_prefix;
};

struct ConfigureResult {
  uint64_t weight_bytes = 0;
  uint64_t optimizer_bytes = 0;
};

struct StepRequest {
  std::string job_id;
  uint64_t step = 0;
  schedule::StageProgram program;
  StepInputs inputs;
  // After the step's optimizer update (ApplyOptimizer's when deferred), keep a snapshot
  // of every chunk and copy it to the snapshot peer.
  bool snapshot = false;
};

// Phase 2 of a deferred step (StepInputs::defer_optimizer).
struct ApplyOptimizerRequest {
  std::string job_id;
  uint64_t step = 0;
  double global_grad_norm = 0;
  std::optional<float> lr;  // default: the one the step ran with
};

// What the stage's snapshots take now, own and held, and the newest own step.
struct SnapshotFigures {
  uint64_t bytes = 0;
  int64_t newest_step = 0;  // 0 = none
};

struct StepReport {
  StepResult result;
  uint64_t peak_memory_bytes = 0;
  bool emulated = false;
  SnapshotFigures snapshots;
};

struct RuntimeStats {
  std::string job_id;
  uint64_t memory_used_bytes = 0;
  uint64_t memory_limit_bytes = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  int64_t steps_run = 0;
};

class StageRuntime {
 public:
  explicit StageRuntime(RuntimeOptions options);
  ~StageRuntime();

  // Replaces any configured job, the same one too (a job restarted after a lost stage),
  // even while its optimizer step is pending; a step still running is broken off first
  // (its links closed), so a stage waiting on a lost neighbour is free at once. Bad
  // fields are INVALID_ARGUMENT naming the field; a
  // job over the memory limit is RESOURCE_EXHAUSTED naming bytes needed and available,
  // refused before anything is allocated.
  absl::StatusOr<ConfigureResult> Configure(const JobConfig& config);
  // FAILED_PRECONDITION while an optimizer step is pending.
  absl::StatusOr<StepReport> RunStep(StepRequest request);
  // Applies the optimizer step a deferred RunStep held back; returns its timing.
  // FAILED_PRECONDITION naming job, stage and step when none of that step is pending.
  absl::StatusOr<ActionTiming> ApplyOptimizer(const ApplyOptimizerRequest& request);
  RuntimeStats Stats() const;  // waits for a running step to finish
  bool configured() const;
  // The configured job, without waiting for a running step (heartbeats use it).
  std::string current_job_id() const;

  // Parameters of the configured job by Hugging Face name, for checkpoints and tests.
  absl::StatusOr<std::vector<float>> GetParam(const std::string& name) const;
  // Model chunk `chunk` (weights, AdamW moments and step) as a safetensors checkpoint
  // file's bytes, and back. Import checks names, shapes and the layer range first.
  // Both are FAILED_PRECONDITION while an optimizer step is pending (the weights are
  // between two steps).
  absl::StatusOr<std::string> ExportChunk(const std::string& job_id, int chunk) const;
  absl::Status ImportChunk(const std::string& job_id, int chunk, const std::string& bytes);

  // Snapshots. None of these take the step lock: they answer while a step waits.
  // Whether a push of `meta` from a peer is admitted: the configured job's id and
  // peer_secret, from the ring predecessor, in this layout (PERMISSION_DENIED for a
  // wrong secret, FAILED_PRECONDITION otherwise, naming job and stages).
  absl::Status AdmitSnapshot(const std::string& job_id, const std::string& peer_secret,
                             const SnapshotMeta& meta) const;
  // Keeps a pushed blob, received whole, as a held copy (admitted again first).
  absl::Status HoldSnapshot(const std::string& job_id, const std::string& peer_secret,
                            SnapshotMeta meta, std::shared_ptr<const std::string> blob);
  absl::StatusOr<std::vector<SnapshotMeta>> ListSnapshots(const std::string& job_id) const;
  absl::StatusOr<std::shared_ptr<const std::string>> FetchSnapshot(const std::string& job_id,
                                                                   int owner_stage, int chunk,
                                                                   int64_t step) const;
  SnapshotFigures snapshot_figures() const;

  LinkAcceptor& acceptor() { return acceptor_; }
  const RuntimeOptions& options() const { return options_; }

  // Bytes a job needs on this stage: weights, gradients and AdamW's two moments.
  static uint64_t StateBytes(const JobConfig& config);

 private:
  struct Job;
  absl::Status ValidateConfig(const JobConfig& config) const;
  // RESOURCE_EXHAUSTED when the job's weights, one micro-batch's activations and the
  // snapshot reserve exceed the host's memory (CPU and emulated stages).
  absl::Status CheckAllocation(const JobConfig& config, uint64_t state) const;
  absl::Status EnsureLinks(Job& job);
  // The own snapshot of `step`, right after its optimizer update; queues the copy.
  absl::Status TakeSnapshot(Job& job, uint64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION "WHAT of job 'ID': ..." unless `job_id` is the configured job.
  absl::Status CheckJob(const std::string& job_id, const std::string& what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<BackendChunk*> ChunkOf(const std::string& job_id, int chunk,
                                        const char* what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RuntimeOptions options_;
  LinkAcceptor acceptor_;
  mutable absl::Mutex mu_;  // held for a whole step: one step at a time
  std::unique_ptr<Job> job_ ABSL_GUARDED_BY(mu_);
  int64_t steps_run_ ABSL_GUARDED_BY(mu_) = 0;
  // Closes the configured job's links, so that a step waiting on them fails at once.
  void AbortRunningStep() ABSL_LOCKS_EXCLUDED(links_mu_);
  void ForgetLinks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(links_mu_);
  // Destroys a job's link, first taking it out of links_ (AbortRunningStep closes those).
  void DropLink(std::unique_ptr<PeerLink>& link) ABSL_LOCKS_EXCLUDED(links_mu_);
  // The configured job's links (owned by job_), reachable without mu_: Configure
  // breaks a running step with them. Cleared before job_ goes.
  absl::Mutex links_mu_;  // never held across a step
  std::vector<PeerLink*> links_ ABSL_GUARDED_BY(links_mu_);
  Executor* executor_ ABSL_GUARDED_BY(links_mu_) = nullptr;  // the job's, for its aborts
  mutable absl::Mutex job_id_mu_;  // never held across a step
  std::string job_id_ ABSL_GUARDED_BY(job_id_mu_);
  // What admits a snapshot push, readable while a step runs.
  int stage_ ABSL_GUARDED_BY(job_id_mu_) = 0;
  int num_stages_ ABSL_GUARDED_BY(job_id_mu_) = 0;
  std::string peer_secret_ ABSL_GUARDED_BY(job_id_mu_);
  SnapshotStore snapshots_;  // its own lock
};

}  // namespace pipetrain::stage_server
