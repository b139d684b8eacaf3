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
#include "common/error_context.h"
#include "common/model/transformer_config.h"
#include "common/rpc_security.h"
#include "common/schedule/stage_program.h"
#include "stage_server/calibration/calibration.h"
#include "stage_server/calibration/link_calibration.h"
#include "stage_server/collective/gradient_reducer.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/compute/backend.h"
#include "stage_server/runtime/device_spec.h"
#include "stage_server/exec/executor.h"
#include "stage_server/runtime/fault_injection.h"
#include "stage_server/runtime/job_config.h"
#include "stage_server/runtime/memory_breakdown.h"
#include "stage_server/link/peer_link.h"
#include "stage_server/snapshots/snapshot_store.h"

namespace pipetrain::stage_server {

class SnapshotPusher;

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
  // --same-host-transport auto: peer links offer and accept shared memory
  // (PeerLinkOptions::same_host).
  bool same_host_transport = false;
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

// One of the configured job's peer links: its neighbour and how each direction moves
// tensors (PeerLink::sending_path, receiving_path).
struct LinkPathInfo {
  int peer_stage = 0;
  std::string sending;
  std::string receiving;
  uint64_t bytes_sent = 0;            // this job's tensor bytes to the neighbour
  uint64_t bytes_sent_same_host = 0;  // of those, through shared memory
};

struct RuntimeStats {
  std::string job_id;
  uint64_t memory_used_bytes = 0;
  uint64_t memory_limit_bytes = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  int64_t steps_run = 0;
  uint64_t last_step_bytes_sent = 0;  // the last RunStep's, 0 before one
  uint64_t last_step_bytes_received = 0;
};

class StageRuntime {
 public:
  explicit StageRuntime(RuntimeOptions options);
  ~StageRuntime();

  // Replaces any configured job, the same one too (a job restarted after a lost stage),
  // even while its optimizer step is pending; a step still running is broken off first
  // (its links closed), so a stage waiting on a lost neighbour is free at once. Bad
  // fields are INVALID_ARGUMENT naming the field; a job over a memory limit is
  // RESOURCE_EXHAUSTED naming the bytes of each part (MemoryBreakdown) and the limit,
  // refused before anything is allocated.
  absl::StatusOr<ConfigureResult> Configure(const JobConfig& config);
  // FAILED_PRECONDITION while an optimizer step is pending.
  absl::StatusOr<StepReport> RunStep(StepRequest request);
  // Applies the optimizer step a deferred RunStep held back; returns its timing.
  // FAILED_PRECONDITION naming job, stage and step when none of that step is pending.
  absl::StatusOr<ActionTiming> ApplyOptimizer(const ApplyOptimizerRequest& request);
  RuntimeStats Stats() const;  // waits for a running step to finish
  // A few passes of one transformer block of `config` on this stage's device, as a job
  // would run it, for the coordinator's automatic planner (calibration.h); waits for a
  // running step. InvalidArgument for rows or repetitions out of range, or a model
  // without a block; ResourceExhausted past --memory-limit.
  static constexpr int kMaxCalibrationRows = 4096;
  static constexpr int kMaxCalibrationRepetitions = 20;
  absl::StatusOr<CalibrationResult> Calibrate(const model::TransformerConfig& config,
                                              const model::Precision& precision, int rows,
                                              int repetitions);
  // The replicas' all-reduce between `ring.size` stages the coordinator calls at once
  // (calibration.h's TimeAllReduce over gloo, rendezvous through the coordinator's store
  // under ring.calibration_id), not holding this stage's step. An emulated stage does
  // not reduce: emulated, 0 s, no connection. InvalidArgument for a size, rank, bytes
  // or repetitions out of range; the ring's errors (a member that never came) in time.
  static constexpr uint64_t kMaxRingCalibrationBytes = 256ull << 20;
  struct RingCalibration {
    std::string calibration_id;
    std::string rendezvous_prefix;
    int rank = 0;
    int size = 0;
    uint64_t bytes = 0;
    int repetitions = 0;
  };
  struct RingTime {
    double allreduce_s = 0;
    bool emulated = false;
  };
  absl::StatusOr<RingTime> CalibrateRing(const RingCalibration& ring);
  // One link between this stage and another the coordinator calls at once
  // (link_calibration.h), not holding this stage's step: the receiver expects the
  // sender's stream under transfer.calibration_id and answers; the sender connects to
  // peer_address (again while the receiver does not expect it yet) and times. The
  // receiver answers zeros. InvalidArgument for bytes or repetitions out of range or no
  // id, secret or (sender) address; the link's errors in time.
  struct TransferCalibration {
    std::string calibration_id;
    std::string peer_secret;
    bool send = false;
    std::string peer_address;
    uint64_t bytes = 0;
    int repetitions = 0;
    absl::Duration deadline = absl::Seconds(30);  // for the link and every answer
  };
  absl::StatusOr<LinkTimes> CalibrateTransfer(const TransferCalibration& transfer);
  // The first field of a calibration request out of range, named as the Calibrate
  // message names it (ring.size, transfer.peer_address, ...): a sender's peer address
  // must be HOST:PORT, refused at once rather than tried until the deadline.
  static absl::Status CheckRing(const RingCalibration& ring);
  static absl::Status CheckTransfer(const TransferCalibration& transfer);
  bool configured() const;
  // The configured job, without waiting for a running step (heartbeats use it).
  std::string current_job_id() const;
  // The configured job's peer links once its first step made them, without waiting for
  // a running step (heartbeats and GetStats use it).
  std::vector<LinkPathInfo> LinkPaths() ABSL_LOCKS_EXCLUDED(abort_mu_);

  // Parameters of the configured job by Hugging Face name, for checkpoints and tests.
  absl::StatusOr<std::vector<float>> GetParam(const std::string& name) const;
  // Model chunk `chunk` (weights, AdamW moments and step) as a safetensors checkpoint
  // file's bytes, and back. Import checks names, shapes and the layer range first.
  // Both are FAILED_PRECONDITION while an optimizer step is pending (the weights are
  // between two steps).
  absl::StatusOr<std::string> ExportChunk(const std::string& job_id, int chunk) const;
  absl::Status ImportChunk(const std::string& job_id, int chunk, const std::string& bytes);
  // Whether an import of `total_bytes` into `chunk` may be buffered at all, asked before
  // a byte is: FAILED_PRECONDITION or INVALID_ARGUMENT as ImportChunk would answer for
  // the job and chunk, and INVALID_ARGUMENT naming field total_bytes past the largest
  // checkpoint the chunk can have (MaxChunkCheckpointBytes) and this stage's memory.
  absl::Status AdmitImport(const std::string& job_id, int chunk, uint64_t total_bytes) const;

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
  // `held` as SnapshotStore::Get takes it.
  absl::StatusOr<std::shared_ptr<const std::string>> FetchSnapshot(
      const std::string& job_id, int owner_stage, int chunk, int64_t step,
      std::optional<bool> held = std::nullopt) const;
  SnapshotFigures snapshot_figures() const;

  LinkAcceptor& acceptor() { return acceptor_; }
  const RuntimeOptions& options() const { return options_; }

 private:
  struct Job;  // stage_runtime_job.h

  // Configure's steps, in order (stage_runtime_configure.cc).
  // RESOURCE_EXHAUSTED naming the parts when `need` exceeds a limit of this stage.
  absl::Status CheckMemory(const JobConfig& config, const MemoryBreakdown& need) const;
  // Forgets the configured job (its running step already broken off) and frees its
  // memory.
  void DropCurrentJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The new job: its chunks on their backend, its executor and snapshot pusher.
  absl::StatusOr<std::unique_ptr<Job>> BuildJob(const JobConfig& config,
                                                const MemoryBreakdown& need)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MakeChunks(Job& job, std::vector<std::unique_ptr<ChunkCompute>>& chunks) const;
  ExecutorConfig ExecutorConfigFor(const Job& job) const;
  std::unique_ptr<SnapshotPusher> SnapshotPusherFor(const Job& job) const;
  // Makes `job` the configured one, for the step lock's holders and for the readers of
  // PublishedJob.
  void InstallJob(std::unique_ptr<Job> job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // RunStep's steps: the request fits the configured job (FAILED_PRECONDITION or
  // INVALID_ARGUMENT naming job, stage and step), then the links are made or remade.
  absl::Status CheckStepRequest(const StepRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReconnectLinks(Job& job, uint64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Connects what is not connected yet: the neighbours, and the replicas (EnsureReplicas).
  absl::Status EnsureLinks(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnsureReplicas(Job& job) const;
  // A gloo ring of this stage through the coordinator (its address, this stage's
  // security and listen host): rank `replica` of `replicas` under `job_id`.
  // A link's options with this stage's --same-host-transport.
  PeerLinkOptions WithTransport(PeerLinkOptions o) const {
    o.same_host = options_.same_host_transport;
    return o;
  }
  collective::ReducerOptions RingOptions(const std::string& job_id, const std::string& prefix,
                                         int replica, int replicas,
                                         absl::Duration deadline) const;
  // The own snapshot of `step`, right after its optimizer update; queues the copy.
  absl::Status TakeSnapshot(Job& job, uint64_t step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION "CONTEXT: this stage is configured for ..." unless `job_id` is
  // the configured job.
  absl::Status CheckJob(const common::ErrorContext& context, const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The configured job's real chunk `chunk` (an emulated stage has none).
  absl::StatusOr<BackendChunk*> ChunkOf(const common::ErrorContext& context,
                                        const std::string& job_id, int chunk) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Closes the configured job's links, so that a step waiting on them fails at once.
  void AbortRunningStep() ABSL_LOCKS_EXCLUDED(abort_mu_);
  void ForgetLinks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(abort_mu_);
  // Destroys a job's link, first taking it out of abortable_ (AbortRunningStep closes those).
  void DropLink(std::unique_ptr<PeerLink>& link) ABSL_LOCKS_EXCLUDED(abort_mu_);
  std::string PublishedJobId() const ABSL_LOCKS_EXCLUDED(published_mu_);

  const RuntimeOptions options_;
  LinkAcceptor acceptor_;

  // The configured job and what it ran, guarded by mu_, which a step holds throughout:
  // one step at a time, and no configure, import or export during one.
  struct Current {
    std::unique_ptr<Job> job;
    int64_t steps_run = 0;
    uint64_t last_step_sent = 0, last_step_received = 0;
  };
  mutable absl::Mutex mu_;
  Current current_ ABSL_GUARDED_BY(mu_);

  // What breaks off a running step without mu_ (Configure's first move), guarded by
  // abort_mu_, never held across a step: the configured job's links and executor (both
  // owned by current_.job), cleared before the job goes.
  struct Abortable {
    std::vector<PeerLink*> links;
    Executor* executor = nullptr;
  };
  absl::Mutex abort_mu_;
  Abortable abortable_ ABSL_GUARDED_BY(abort_mu_);

  // Who the configured job is, guarded by published_mu_, never held across a step, so
  // that heartbeats and snapshot pushes get an answer while a step runs. Empty job_id:
  // none.
  struct PublishedJob {
    std::string job_id;
    int stage = 0;
    int num_stages = 0;
    std::string peer_secret;
    // One stage whose copies split the optimizer: its snapshots go round the replicas
    // (JobConfig::SnapshotsRingReplicas), so it holds the previous copy's.
    bool replica_ring = false;
  };
  mutable absl::Mutex published_mu_;
  PublishedJob published_ ABSL_GUARDED_BY(published_mu_);

  SnapshotStore snapshots_;  // its own lock
};

}  // namespace pipetrain::stage_server
