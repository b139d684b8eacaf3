// StageRuntime::Configure and its steps: validate, check the memory, end the current
// job, build the new one (chunks on their backend, executor, snapshot pusher) and
// install it.
#include <algorithm>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/checked_math.h"
#include "common/logging.h"
#include "common/model/optimizer_split.h"
#include "common/status_macros.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/onednn_matmul.h"
#include "stage_server/exec/emulated_chunk.h"
#include "stage_server/runtime/stage_runtime.h"

#include <mutex>
#include "stage_server/runtime/stage_runtime_job.h"

namespace pipetrain::stage_server {
namespace {

// --fail-at: the stage dies before the action its point names (training steps only).
std::function<void(const schedule::Action&, int, uint64_t)> FaultHook(
    std::shared_ptr<FaultInjector> faults, const std::string& job_id) {
  return [faults = std::move(faults), job_id](const schedule::Action& a, int micro_batches,
                                               uint64_t step) {
    if (auto point = PointOfAction(a, micro_batches)) {
      faults->At(*point, job_id, static_cast<int64_t>(step));
    }
  };
}

// The reducer EnsureLinks puts in `slot` before the first step (the job outlives its
// executor, and the slot outlives a collective aborted with the job).
absl::StatusOr<std::shared_ptr<collective::GradientReducer>> ReducerIn(ReducerSlot& slot) {
  absl::MutexLock lock(&slot.mu);
  if (slot.reducer == nullptr) {
    return absl::FailedPreconditionError("the replicas of this stage are not connected");
  }
  return slot.reducer;
}

// Replicas: the mean of a buffer over this stage position's replicas. With a split
// optimizer, of this copy's piece only (reduce-scatter): the rest is never read.
GradientAverage ReplicaAverage(std::shared_ptr<ReducerSlot> slot, compute::OptimizerSplit split,
                               int replicas, absl::Duration deadline) {
  const float scale = 1.0f / static_cast<float>(replicas);
  return [slot = std::move(slot), split, scale, deadline](std::span<float> data) -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<collective::GradientReducer> reducer, ReducerIn(*slot));
    if (split.copies <= 1) {
      RETURN_IF_ERROR(reducer->AllReduceSum(data, deadline));
      for (float& v : data) v *= scale;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(reducer->ReduceScatterSum(data, deadline));
    const model::CopyRange own = model::RangeOfCopy(data.size(), split.copies, split.copy);
    for (float& v : data.subspan(own.begin, own.size())) v *= scale;
    return absl::OkStatus();
  };
}

// A split optimizer: every copy's updated piece of a layer's weights, in place.
WeightGather ReplicaGather(std::shared_ptr<ReducerSlot> slot, absl::Duration deadline) {
  return [slot = std::move(slot), deadline](std::span<float> data) -> absl::Status {
    ASSIGN_OR_RETURN(std::shared_ptr<collective::GradientReducer> reducer, ReducerIn(*slot));
    return reducer->AllGather(data, deadline);
  };
}

}  // namespace

absl::StatusOr<ConfigureResult> StageRuntime::Configure(const JobConfig& config) {
  RETURN_IF_ERROR(ValidateJobConfig(config, !options_.coordinator_address.empty()));
  if (config.split().copies > 1) {
    RETURN_IF_ERROR(
        model::CheckSplit(config.job_id, config.stage, ParamsOf(config), config.split().copies));
  }
  const MemoryBreakdown need =
      MemoryOf(config, options_.device.kind, options_.same_host_transport);
  RETURN_IF_ERROR(CheckMemory(config, need));
  // A step still running (waiting on a lost neighbour up to its receive deadline, or for
  // an ApplyOptimizer that will never come) ends now: a job restarted after a lost stage
  // reconfigures its survivors, and breaking their links ends their neighbours' waits too.
  AbortRunningStep();
  absl::MutexLock lock(&mu_);
  DropCurrentJob();
  ASSIGN_OR_RETURN(std::unique_ptr<Job> job, BuildJob(config, need));
  InstallJob(std::move(job));
  const uint64_t params = ParamsOf(config);
  return ConfigureResult{
      .weight_bytes = common::SaturatingMul(params, WeightBytesPerParam()),
      .optimizer_bytes = common::SaturatingMul(MomentParamsOf(config), OptimizerBytesPerParam())};
}

absl::Status StageRuntime::CheckMemory(const JobConfig& config, const MemoryBreakdown& need) const {
  // Checked before anything is allocated: a request whose buffers cannot be had gets
  // RESOURCE_EXHAUSTED, not a std::bad_alloc in the handler.
  for (const MemoryLimit& limit : MemoryLimitsOf(need, options_.device.kind,
                                                 options_.memory_limit_bytes, HostMemoryBytes())) {
    RETURN_IF_ERROR(CheckFits(config, limit));
  }
  return absl::OkStatus();
}

void StageRuntime::DropCurrentJob() {
  if (current_.job) acceptor_.Forget(current_.job->config.job_id);
  ForgetLinks();
  current_.job.reset();  // frees the previous job's memory before allocating the new one
  {
    absl::MutexLock lock(&published_mu_);
    published_ = PublishedJob();
  }
  // The coordinator fetched what it needed of them before it reconfigured.
  snapshots_.Reset("");
}

absl::StatusOr<std::unique_ptr<StageRuntime::Job>> StageRuntime::BuildJob(
    const JobConfig& config, const MemoryBreakdown& need) {
  auto job = std::make_unique<Job>();
  job->config = config;
  job->links = LinksOf(config);
  job->emulated = options_.device.kind == DeviceSpec::Kind::kEmulated;
  job->state_bytes = need.state;
  job->table_bytes = need.tables;
  job->pool = std::make_shared<common::BufferPool>();
  std::vector<std::unique_ptr<ChunkCompute>> chunks;
  RETURN_IF_ERROR(MakeChunks(*job, chunks));
  if (job->links.prev) acceptor_.Expect(WithTransport(UpstreamLinkOptions(config)), config.peer_secret);
  // The links are made at the first step (EnsureLinks); the executor gets them then.
  job->executor = std::make_unique<Executor>(ExecutorConfigFor(*job), std::move(chunks),
                                             nullptr, nullptr, job->pool);
  job->pusher = SnapshotPusherFor(*job);
  return job;
}

absl::Status StageRuntime::MakeChunks(Job& job,
                                      std::vector<std::unique_ptr<ChunkCompute>>& chunks) const {
  const JobConfig& config = job.config;
  if (job.emulated) {
    ASSIGN_OR_RETURN(EmulatedDevice device, EmulatedDeviceByName(options_.device.emulated));
    device.shared = options_.device.shared;
    for (size_t c = 0; c < config.chunks.size(); ++c) {
      const auto [begin, end] = config.chunks[c];
      chunks.push_back(std::make_unique<EmulatedChunk>(config.model, begin, end,
                                                       config.micro_batch_size, device,
                                                       config.recomputes(c), job.pool,
                                                       config.precision));
    }
    return absl::OkStatus();
  }
  if (options_.device.kind == DeviceSpec::Kind::kCuda) {
    ASSIGN_OR_RETURN(job.backend, compute::CreateCudaBackend(options_.device.cuda_index));
  } else {
    ASSIGN_OR_RETURN(job.backend, compute::CpuBackend::Create(options_.threads));
  }
  RETURN_IF_ERROR(job.backend->SetProductOperands(config.precision.products));
  if (config.precision.products == common::DType::kBF16 &&
      options_.device.kind != DeviceSpec::Kind::kCuda && !compute::OneDnnMatmul::bf16_native()) {
    static std::once_flag said;  // once per process, not per job
    std::call_once(said, [] {
      common::LogWarning("stage", "bf16 products on a processor without bf16 instructions: "
                                  "oneDNN computes the same numbers on a slower path");
    });
  }
  for (size_t c = 0; c < config.chunks.size(); ++c) {
    const auto [begin, end] = config.chunks[c];
    ASSIGN_OR_RETURN(auto layers,
                     compute::ModelChunk::Create(config.model, begin, end, job.backend.get(),
                                                 {.recompute = config.recomputes(c),
                                                  .boundary = config.precision.activations,
                                                  .split = config.split()}));
    RETURN_IF_ERROR(layers->Initialize(config.seed));
    ASSIGN_OR_RETURN(auto backend_chunk,
                     BackendChunk::Create(std::move(layers), config.micro_batch_size, job.pool));
    job.backend_chunks.push_back(backend_chunk.get());
    chunks.push_back(std::move(backend_chunk));
  }
  return absl::OkStatus();
}

ExecutorConfig StageRuntime::ExecutorConfigFor(const Job& job) const {
  const JobConfig& config = job.config;
  ExecutorConfig ec;
  ec.job_id = config.job_id;
  ec.stage = config.stage;
  ec.num_stages = config.num_stages;
  ec.num_chunks = static_cast<int>(config.chunks.size());
  ec.placement = config.placement;
  ec.recv_timeout = config.recv_timeout;
  ec.optimizer = config.optimizer;
  ec.tie_embeddings = config.model.tie_embeddings;
  if (options_.faults) ec.before_action = FaultHook(options_.faults, config.job_id);
  if (config.replicas > 1) {
    ec.average_gradients =
        ReplicaAverage(job.reducer, config.split(), config.replicas, config.recv_timeout);
    if (config.split().copies > 1) ec.gather_weights = ReplicaGather(job.reducer, config.recv_timeout);
  }
  return ec;
}

std::unique_ptr<SnapshotPusher> StageRuntime::SnapshotPusherFor(const Job& job) const {
  const JobConfig& config = job.config;
  const int K = config.num_stages;
  // Emulated stages hold no weights to copy.
  if (job.emulated || (K < 2 && !config.SnapshotsRingReplicas()) ||
      config.snapshot_peer_address.empty()) {
    return nullptr;
  }
  SnapshotPusherOptions po;
  po.job_id = config.job_id;
  po.stage = config.stage;
  po.peer_stage = (config.stage + 1) % K;
  po.peer_address = config.snapshot_peer_address;
  po.peer_secret = config.peer_secret;
  // A copy may take longer than one tensor, but never longer than a step may wait.
  po.deadline = std::max(config.recv_timeout, absl::Seconds(10));
  if (options_.faults) {
    po.after_first_piece = [faults = options_.faults, job_id = config.job_id](int64_t step) {
      faults->At(FaultPoint::kSnapshot, job_id, step);
    };
  }
  return std::make_unique<SnapshotPusher>(po, options_.security.ChannelCredentials());
}

void StageRuntime::InstallJob(std::unique_ptr<Job> job) {
  const JobConfig& config = job->config;
  {
    absl::MutexLock lock(&abort_mu_);
    abortable_.executor = job->executor.get();
  }
  snapshots_.Reset(config.job_id);
  {
    absl::MutexLock lock(&published_mu_);
    published_ = {.job_id = config.job_id,
                  .stage = config.stage,
                  .num_stages = config.num_stages,
                  .peer_secret = config.peer_secret,
                  .replica_ring = config.SnapshotsRingReplicas()};
  }
  if (options_.faults) options_.faults->Configured(config.job_id, config.stage, config.replica);
  current_ = {.job = std::move(job), .steps_run = 0};
}

}  // namespace pipetrain::stage_server
