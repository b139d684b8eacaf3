#include "stage_server/stage_runtime.h"

#include <algorithm>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/channel_args.h"
#include "common/checked_math.h"
#include "common/input_limits.h"
#include "common/model/checkpoint.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "stage_server/backend_chunk.h"
#include "stage_server/collective/gradient_reducer.h"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/emulated_chunk.h"
#include "stage_server/link_limits.h"
#include "stage_server/snapshot_pusher.h"

namespace pipetrain::stage_server {

struct StageRuntime::Job {
  JobConfig config;
  std::unique_ptr<compute::Backend> backend;
  std::shared_ptr<common::BufferPool> pool;
  std::vector<BackendChunk*> backend_chunks;  // real chunks, owned by the executor
  std::unique_ptr<Executor> executor;
  std::unique_ptr<PeerLink> next;  // to the downstream stage (this stage connects)
  std::unique_ptr<PeerLink> prev;  // from the upstream stage (it connects to us)
  bool has_next = false, has_prev = false;
  std::optional<uint64_t> last_step;
  bool emulated = false;
  uint64_t state_bytes = 0;
  // A deferred step run with snapshot: ApplyOptimizer takes the snapshot of this step.
  std::optional<uint64_t> snapshot_after_apply;
  // Copies snapshots to the ring successor; last, so it stops before the rest goes.
  std::unique_ptr<SnapshotPusher> pusher;
  // The other replicas of this stage position (replicas > 1), made at the first step.
  // Shared with the executor's averaging, which may finish an all-reduce after the job
  // is gone (a step aborted while it waited in one).
  struct ReducerSlot {
    absl::Mutex mu;
    std::shared_ptr<collective::GradientReducer> reducer ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<ReducerSlot> reducer = std::make_shared<ReducerSlot>();
};

namespace {

// A chunk's weights, AdamW moments and step as a safetensors file's bytes: what
// ExportChunk sends and what a snapshot keeps.
absl::StatusOr<std::string> SerializeChunk(BackendChunk& chunk) {
  ASSIGN_OR_RETURN(model::Checkpoint ckpt,
                   compute::CheckpointOfChunk(chunk.layers(), /*with_optimizer=*/true));
  return model::SerializeCheckpoint(ckpt);
}

// The link this stage accepts from its upstream neighbour.
PeerLinkOptions UpstreamLinkOptions(const JobConfig& config) {
  PeerLinkOptions o;
  o.job_id = config.job_id;
  o.local_stage = config.stage;
  o.peer_stage = (config.stage + config.num_stages - 1) % config.num_stages;
  o.peer_address = config.upstream_address;
  o.frame_bytes = config.frame_bytes;
  o.limits = LinkLimits(config.model, config.micro_batch_size);
  return o;
}

bool HasOptimizerStep(const schedule::StageProgram& program) {
  for (const schedule::Action& a : program.actions) {
    if (a.kind == schedule::ActionKind::kOptimizerStep) return true;
  }
  return false;
}

}  // namespace

StageRuntime::StageRuntime(RuntimeOptions options) : options_(std::move(options)) {}

StageRuntime::~StageRuntime() {
  absl::MutexLock lock(&mu_);
  ForgetLinks();
  job_.reset();
}

void StageRuntime::AbortRunningStep() {
  {
    absl::MutexLock lock(&links_mu_);
    for (PeerLink* link : links_) link->Close();  // idempotent; fails its waits at once
    // A step waiting in the replicas' all-reduce stops waiting (the collective itself
    // cannot be interrupted; its call ends at its own deadline, on its worker).
    if (executor_ != nullptr) {
      executor_->AbortReduction("the stage was configured again while this step waited "
                                "for the other replicas' gradients");
    }
  }
  // A step still waiting for its upstream neighbour to connect stops waiting too.
  std::string job_id;
  {
    absl::MutexLock lock(&job_id_mu_);
    job_id = job_id_;
  }
  if (!job_id.empty()) acceptor_.Forget(job_id);
}

void StageRuntime::DropLink(std::unique_ptr<PeerLink>& link) {
  {
    absl::MutexLock lock(&links_mu_);
    links_.erase(std::remove(links_.begin(), links_.end(), link.get()), links_.end());
  }
  link.reset();
}

void StageRuntime::ForgetLinks() {
  absl::MutexLock lock(&links_mu_);
  links_.clear();
  executor_ = nullptr;  // the job that owns it goes next
}

uint64_t StageRuntime::StateBytes(const JobConfig& config) {
  // In closed form per range (every block has the same parameters), clamped to the
  // model's layers and saturating: a range of 2^31 layers, unvalidated, costs no more to
  // size than one of two (tests/fuzz/configure_fuzz timed out looping over one).
  const auto add = common::SaturatingAdd;
  const auto mul = common::SaturatingMul;
  const model::GptConfig& m = config.model;
  const int64_t head = m.num_pipeline_layers() - 1;  // embedding 0, blocks 1 .. head-1
  if (head < 1) return 0;
  const uint64_t block = head > 1 ? static_cast<uint64_t>(model::ParamsOfLayer(m, 1)) : 0;
  uint64_t params = 0;
  for (const auto& [begin, end] : config.chunks) {
    const int64_t b = std::max<int64_t>(begin, 0), e = std::min<int64_t>(end, head + 1);
    if (b >= e) continue;
    if (b == 0) params = add(params, static_cast<uint64_t>(model::ParamsOfLayer(m, 0)));
    if (e == head + 1) params = add(params, static_cast<uint64_t>(model::ParamsOfLayer(m, head)));
    const int64_t blocks = std::min<int64_t>(e, head) - std::max<int64_t>(b, 1);
    if (blocks > 0) params = add(params, mul(static_cast<uint64_t>(blocks), block));
  }
  return mul(params, 16);  // f32 weight, gradient, AdamW m and v
}

absl::Status StageRuntime::CheckAllocation(const JobConfig& config, uint64_t state) const {
  // Checked before anything is allocated: a request whose buffers cannot be had gets
  // RESOURCE_EXHAUSTED, not a std::bad_alloc in the handler (issue 18). --memory-limit
  // bounds the state and snapshot reserve (Configure's own check; the planner fits the
  // activations within it); this bounds everything a CPU or emulated stage allocates by
  // the host's memory. A CUDA stage's backend refuses what its GPU cannot hold.
  if (options_.device.kind == DeviceSpec::Kind::kCuda) return absl::OkStatus();
  const uint64_t available = HostMemoryBytes();
  if (available == 0) return absl::OkStatus();
  // One micro-batch's activations at least (in double: micro_batch_size x seq_len x
  // bytes per token cannot wrap); an emulated stage holds no weights.
  double activations = 0;
  for (size_t c = 0; c < config.chunks.size(); ++c) {
    const auto& [begin, end] = config.chunks[c];
    const model::ChunkMemory m =
        model::ChunkActivationBytes(config.model, begin, end, config.recomputes(c));
    activations += (m.stored + m.backward_extra) * config.micro_batch_size * config.model.seq_len;
  }
  const bool emulated = options_.device.kind == DeviceSpec::Kind::kEmulated;
  const double weights = emulated ? 0 : static_cast<double>(state);
  const double reserve = static_cast<double>(config.snapshot_reserve_bytes);
  const double asked = weights + activations + reserve;
  if (asked <= static_cast<double>(available)) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "configure job '%s' stage %d: fields model, layers, micro_batch_size (%d rows of %d "
      "tokens) and snapshot_reserve_bytes ask for %.0f bytes (%.0f weights, gradients and "
      "optimizer state, %.0f activations of one micro-batch, %.0f snapshot reserve), but "
      "this stage's host has %d bytes of memory; use more stages, smaller micro-batches or a "
      "smaller model",
      config.job_id, config.stage, config.micro_batch_size, config.model.seq_len, asked, weights,
      activations, reserve, available));
}

absl::Status StageRuntime::ValidateConfig(const JobConfig& c) const {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("configure job '", c.job_id, "' stage ",
                                                   c.stage, ": ", what));
  };
  if (c.job_id.empty()) return absl::InvalidArgumentError("configure: field job_id is empty");
  RETURN_IF_ERROR(common::CheckLength("configure: field job_id", c.job_id, common::kMaxIdBytes));
  for (const auto& [field, value, limit] :
       {std::tuple<const char*, const std::string&, int64_t>{
            "upstream_address", c.upstream_address, common::kMaxAddressBytes},
        {"downstream_address", c.downstream_address, common::kMaxAddressBytes},
        {"snapshot_peer_address", c.snapshot_peer_address, common::kMaxAddressBytes},
        {"peer_secret", c.peer_secret, common::kMaxSecretBytes},
        {"rendezvous_prefix", c.rendezvous_prefix, common::kMaxPathBytes}}) {
    if (absl::Status s = common::CheckLength(absl::StrCat("field ", field), value, limit);
        !s.ok()) {
      return bad(std::string(s.message()));
    }
  }
  RETURN_IF_ERROR(model::ValidateConfig(c.model));
  if (c.num_stages < 1) return bad("field num_stages must be >= 1");
  if (c.stage < 0 || c.stage >= c.num_stages) {
    return bad(absl::StrCat("field stage must be in [0, ", c.num_stages, ")"));
  }
  if (c.chunks.empty()) return bad("field layers is empty");
  // Non-empty ranges of a model this size cannot be more; more would only cost time.
  if (static_cast<int64_t>(c.chunks.size()) > c.model.num_pipeline_layers()) {
    return bad(absl::StrCat("field layers has ", c.chunks.size(), " ranges; the model has only ",
                            c.model.num_pipeline_layers(), " pipeline layers"));
  }
  for (size_t i = 0; i < c.chunks.size(); ++i) {
    const auto [begin, end] = c.chunks[i];
    if (begin < 0 || end > c.model.num_pipeline_layers() || begin >= end) {
      return bad(absl::StrCat("field layers[", i, "] [", begin, ", ", end,
                              ") is not a non-empty range of the model's ",
                              c.model.num_pipeline_layers(), " pipeline layers"));
    }
  }
  if (c.micro_batch_size < 1) return bad("field micro_batch_size must be >= 1");
  if (c.replicas < 1 || c.replica < 0 || c.replica >= c.replicas) {
    return bad(absl::StrCat("field replica ", c.replica, " must be in [0, replicas ", c.replicas,
                            ")"));
  }
  if (c.replicas > 1 && options_.coordinator_address.empty()) {
    return bad("data-parallel replicas meet through the coordinator, and this stage runs "
               "without --coordinator");
  }
  if (c.replicas > 1 && c.rendezvous_prefix.empty()) {
    return bad("field rendezvous_prefix is empty but the job has replicas");
  }
  if (c.frame_bytes == 0) return bad("field frame_bytes must be > 0");
  const int v = static_cast<int>(c.chunks.size());
  const bool ring = v > 1;
  if ((c.stage > 0 || ring) && c.num_stages > 1 && c.upstream_address.empty()) {
    return bad("field upstream_address is empty but this stage has an upstream neighbour");
  }
  if ((c.stage < c.num_stages - 1 || ring) && c.num_stages > 1 && c.downstream_address.empty()) {
    return bad("field downstream_address is empty but this stage has a downstream neighbour");
  }
  return absl::OkStatus();
}

absl::StatusOr<ConfigureResult> StageRuntime::Configure(const JobConfig& config) {
  RETURN_IF_ERROR(ValidateConfig(config));
  const uint64_t state = StateBytes(config);
  const uint64_t reserve = config.snapshot_reserve_bytes;
  // A real backend also allocates each chunk's micro-batch buffers now (BackendChunk);
  // their size grows with micro_batch_size, which the request sets, so they count too
  // (found by tests/fuzz/configure_fuzz: a 16 MiB stage allocated 6 GB).
  uint64_t buffers = 0;
  if (options_.device.kind != DeviceSpec::Kind::kEmulated) {
    for (const auto& [begin, end] : config.chunks) {
      const uint64_t b = BackendChunk::BufferBytes(config.model, begin, end,
                                                   config.micro_batch_size);
      buffers = common::SaturatingAdd(buffers, b);
    }
  }
  auto saturating_sum = [](std::initializer_list<uint64_t> xs) {
    uint64_t sum = 0;
    for (uint64_t x : xs) sum = common::SaturatingAdd(sum, x);
    return sum;
  };
  if (options_.memory_limit_bytes > 0 &&
      saturating_sum({state, reserve, buffers}) > options_.memory_limit_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "configure job '", config.job_id, "' stage ", config.stage,
        ": its share of the model needs ", state,
        " bytes for weights, gradients and optimizer state",
        buffers > 0 ? absl::StrCat(" plus ", buffers,
                                   " for its micro-batch buffers (field micro_batch_size ",
                                   config.micro_batch_size, ")")
                    : "",
        reserve > 0 ? absl::StrCat(" plus ", reserve,
                                   " for in-memory snapshots (field snapshot_reserve_bytes)")
                    : "",
        ", but this stage has ", options_.memory_limit_bytes,
        " (--memory-limit); use more stages or a smaller model",
        reserve > 0 ? ", or turn snapshots off (checkpoint.snapshot_every_steps 0)" : ""));
  }

  RETURN_IF_ERROR(CheckAllocation(config, state));

  // A step still running (waiting on a lost neighbour up to its receive deadline, or for
  // an ApplyOptimizer that will never come) ends now: a job restarted after a lost stage
  // reconfigures its survivors, and breaking their links ends their neighbours' waits too.
  AbortRunningStep();
  absl::MutexLock lock(&mu_);
  if (job_) acceptor_.Forget(job_->config.job_id);
  ForgetLinks();
  job_.reset();  // frees the previous job's memory before allocating the new one
  {
    absl::MutexLock id_lock(&job_id_mu_);
    job_id_.clear();
    peer_secret_.clear();
  }
  // The coordinator fetched what it needed of them before it reconfigured.
  snapshots_.Reset("");

  auto job = std::make_unique<Job>();
  job->config = config;
  job->pool = std::make_shared<common::BufferPool>();
  job->state_bytes = state;
  const int K = config.num_stages, v = static_cast<int>(config.chunks.size());
  // The ring link K-1 -> 0 also exists when the first and last stage share the tied
  // embedding: its gradient goes straight between them over that link.
  const bool ring = v > 1 || config.model.tie_embeddings;
  job->has_next = K > 1 && (config.stage < K - 1 || ring);
  job->has_prev = K > 1 && (config.stage > 0 || ring);

  std::vector<std::unique_ptr<ChunkCompute>> chunks;
  if (options_.device.kind == DeviceSpec::Kind::kEmulated) {
    ASSIGN_OR_RETURN(EmulatedDevice device, EmulatedDeviceByName(options_.device.emulated));
    job->emulated = true;
    for (size_t c = 0; c < config.chunks.size(); ++c) {
      const auto& [begin, end] = config.chunks[c];
      chunks.push_back(std::make_unique<EmulatedChunk>(config.model, begin, end,
                                                       config.micro_batch_size, device,
                                                       config.recomputes(c), job->pool));
    }
  } else {
    if (options_.device.kind == DeviceSpec::Kind::kCuda) {
      ASSIGN_OR_RETURN(job->backend, compute::CreateCudaBackend(options_.device.cuda_index));
    } else {
      ASSIGN_OR_RETURN(job->backend, compute::CpuBackend::Create(options_.threads));
    }
    for (size_t c = 0; c < config.chunks.size(); ++c) {
      const auto& [begin, end] = config.chunks[c];
      compute::ChunkOptions so;
      so.recompute = config.recomputes(c);
      ASSIGN_OR_RETURN(auto layers, compute::ModelChunk::Create(config.model, begin, end,
                                                                job->backend.get(), so));
      RETURN_IF_ERROR(layers->Initialize(config.seed));
      ASSIGN_OR_RETURN(auto backend_chunk,
                       BackendChunk::Create(std::move(layers), config.micro_batch_size, job->pool));
      job->backend_chunks.push_back(backend_chunk.get());
      chunks.push_back(std::move(backend_chunk));
    }
  }
  if (job->has_prev) acceptor_.Expect(UpstreamLinkOptions(config), config.peer_secret);
  ExecutorConfig ec;
  ec.job_id = config.job_id;
  ec.stage = config.stage;
  ec.num_stages = K;
  ec.num_chunks = v;
  ec.recv_timeout = config.recv_timeout;
  ec.optimizer = config.optimizer;
  ec.tie_embeddings = config.model.tie_embeddings;
  if (options_.faults) {
    std::shared_ptr<FaultInjector> faults = options_.faults;
    const std::string job_id = config.job_id;
    ec.before_action = [faults, job_id](const schedule::Action& a, int micro_batches,
                                        uint64_t step) {
      if (auto point = PointOfAction(a, micro_batches)) {
        faults->At(*point, job_id, static_cast<int64_t>(step));
      }
    };
  }
  if (config.replicas > 1) {
    // Set before the executor's first step by EnsureLinks; the job outlives its executor.
    std::shared_ptr<Job::ReducerSlot> slot = job->reducer;
    const float scale = 1.0f / static_cast<float>(config.replicas);
    const absl::Duration deadline = config.recv_timeout;
    ec.average_gradients = [slot, scale, deadline](std::span<float> data) -> absl::Status {
      std::shared_ptr<collective::GradientReducer> reducer;
      {
        absl::MutexLock lock(&slot->mu);
        reducer = slot->reducer;
      }
      if (reducer == nullptr) {
        return absl::FailedPreconditionError("the replicas of this stage are not connected");
      }
      RETURN_IF_ERROR(reducer->AllReduceSum(data, deadline));
      for (float& v : data) v *= scale;
      return absl::OkStatus();
    };
  }
  // The links are made at the first step; the executor reaches them through these.
  job->executor = std::make_unique<Executor>(ec, std::move(chunks), nullptr, nullptr, job->pool);
  if (!job->emulated && K > 1 && !config.snapshot_peer_address.empty()) {
    SnapshotPusherOptions po;
    po.job_id = config.job_id;
    po.stage = config.stage;
    po.peer_stage = (config.stage + 1) % K;
    po.peer_address = config.snapshot_peer_address;
    po.peer_secret = config.peer_secret;
    // A copy may take longer than one tensor, but never longer than a step may wait.
    po.deadline = std::max(config.recv_timeout, absl::Seconds(10));
    if (options_.faults) {
      std::shared_ptr<FaultInjector> faults = options_.faults;
      po.after_first_piece = [faults, job_id = config.job_id](int64_t step) {
        faults->At(FaultPoint::kSnapshot, job_id, step);
      };
    }
    job->pusher = std::make_unique<SnapshotPusher>(po, options_.security.ChannelCredentials());
  }
  {
    absl::MutexLock lock(&links_mu_);
    executor_ = job->executor.get();
  }
  job_ = std::move(job);
  steps_run_ = 0;
  snapshots_.Reset(config.job_id);
  {
    absl::MutexLock id_lock(&job_id_mu_);
    job_id_ = config.job_id;
    stage_ = config.stage;
    num_stages_ = K;
    peer_secret_ = config.peer_secret;
  }
  if (options_.faults) options_.faults->Configured(config.job_id, config.stage, config.replica);
  ConfigureResult r;
  r.weight_bytes = state / 4;
  r.optimizer_bytes = state / 2;
  return r;
}

absl::Status StageRuntime::EnsureLinks(Job& job) {
  const JobConfig& c = job.config;
  const int K = c.num_stages;
  const absl::Time deadline = absl::Now() + c.recv_timeout;
  if (job.has_next && job.next == nullptr) {
    PeerLinkOptions o;
    o.job_id = c.job_id;
    o.local_stage = c.stage;
    o.peer_stage = (c.stage + 1) % K;
    o.peer_address = c.downstream_address;
    o.frame_bytes = c.frame_bytes;
    o.limits = LinkLimits(c.model, c.micro_batch_size);
    auto channel =
        grpc::CreateCustomChannel(c.downstream_address, options_.security.ChannelCredentials(),
                                  common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
    ASSIGN_OR_RETURN(job.next, ConnectPeerLink(channel, o, c.peer_secret, deadline));
  }
  if (job.has_prev && job.prev == nullptr) {
    ASSIGN_OR_RETURN(job.prev,
                     acceptor_.WaitForPeer(c.job_id, (c.stage + K - 1) % K, deadline));
  }
  bool connected = false;
  {
    absl::MutexLock lock(&job.reducer->mu);
    connected = job.reducer->reducer != nullptr;
  }
  if (c.replicas > 1 && !connected && !job.emulated) {
    collective::ReducerOptions ro;
    ro.job_id = c.job_id;
    ro.stage = c.stage;
    ro.replica = c.replica;
    ro.replicas = c.replicas;
    ro.rendezvous_prefix = c.rendezvous_prefix;
    ro.coordinator_address = options_.coordinator_address;
    ro.security = options_.security;
    ro.listen_host = options_.listen_host;
    ro.connect_deadline = c.recv_timeout;
    ASSIGN_OR_RETURN(std::unique_ptr<collective::GradientReducer> reducer,
                     collective::CreateGlooReducer(ro));
    absl::MutexLock lock(&job.reducer->mu);
    job.reducer->reducer = std::move(reducer);
  }
  absl::MutexLock lock(&links_mu_);
  links_.clear();
  for (PeerLink* link : {job.next.get(), job.prev.get()}) {
    if (link != nullptr) links_.push_back(link);
  }
  return absl::OkStatus();
}

absl::StatusOr<StepReport> StageRuntime::RunStep(StepRequest request) {
  absl::MutexLock lock(&mu_);
  if (!job_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", request.step, " of job '", request.job_id, "': this stage is not configured"));
  }
  Job& job = *job_;
  if (request.job_id != job.config.job_id) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", request.step, " of job '", request.job_id, "': this stage is configured for job '",
        job.config.job_id, "' (field job_id)"));
  }
  // An evaluation (forward-only program) may share the number of the training step it
  // follows: that step's frames have all been consumed by then.
  if (job.last_step && (request.step < *job.last_step ||
                        (request.step == *job.last_step && !request.program.forward_only))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", request.step, " of job '", request.job_id, "': step ", *job.last_step,
        " already ran; steps must increase, except an evaluation after its step (field step)"));
  }
  // Before any link work: the pending optimizer step must be applied first.
  RETURN_IF_ERROR(job.executor->CheckNoPendingOptimizer(absl::StrCat("step ", request.step)));
  job.snapshot_after_apply.reset();
  // A failed link is rebuilt at the next step rather than leaving the stage stuck: the
  // upstream neighbour connects again, so it is expected again.
  if (job.next && !job.next->status().ok()) DropLink(job.next);
  if (job.prev && !job.prev->status().ok()) {
    DropLink(job.prev);
    acceptor_.Expect(UpstreamLinkOptions(job.config), job.config.peer_secret);
  }
  if (absl::Status s = EnsureLinks(job); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("step ", request.step, " of job '",
                                               request.job_id, "' stage ", job.config.stage,
                                               ": ", s.message()));
  }
  // Rebind the executor to the current links.
  Executor& ex = *job.executor;
  ex.SetNeighbours(job.next.get(), job.prev.get());
  request.inputs.step = request.step;
  const bool deferred = request.inputs.defer_optimizer;
  ASSIGN_OR_RETURN(StepResult result, ex.RunStep(request.program, std::move(request.inputs)));
  job.last_step = request.step;
  ++steps_run_;
  // Emulated stages hold no weights; an evaluation updates nothing to keep.
  if (request.snapshot && !job.emulated && HasOptimizerStep(request.program)) {
    if (deferred) {
      job.snapshot_after_apply = request.step;
    } else {
      RETURN_IF_ERROR(TakeSnapshot(job, request.step));
    }
  }
  StepReport report;
  report.snapshots = snapshot_figures();
  report.peak_memory_bytes = job.state_bytes + report.snapshots.bytes + result.peak_activation_bytes;
  report.emulated = job.emulated;
  report.result = std::move(result);
  return report;
}

absl::StatusOr<ActionTiming> StageRuntime::ApplyOptimizer(const ApplyOptimizerRequest& request) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJob(request.job_id, absl::StrCat("apply optimizer (step ", request.step, ")")));
  ASSIGN_OR_RETURN(ActionTiming timing, job_->executor->ApplyOptimizer(
                                            request.step, request.global_grad_norm, request.lr));
  if (job_->snapshot_after_apply == request.step) {
    job_->snapshot_after_apply.reset();
    RETURN_IF_ERROR(TakeSnapshot(*job_, request.step));
  }
  return timing;
}

absl::Status StageRuntime::TakeSnapshot(Job& job, uint64_t step) {
  const JobConfig& c = job.config;
  SnapshotPush push;
  push.step = static_cast<int64_t>(step);
  for (size_t i = 0; i < job.backend_chunks.size(); ++i) {
    auto bytes = SerializeChunk(*job.backend_chunks[i]);
    if (!bytes.ok()) {
      return absl::Status(bytes.status().code(),
                          absl::StrCat("snapshot of job '", c.job_id, "' stage ", c.stage, " step ",
                                       step, " chunk ", i, ": ", bytes.status().message()));
    }
    auto blob = std::make_shared<const std::string>(std::move(*bytes));
    SnapshotMeta meta;
    meta.owner_stage = c.stage;
    meta.chunk = static_cast<int>(i);
    meta.step = push.step;
    meta.begin_layer = c.chunks[i].first;
    meta.end_layer = c.chunks[i].second;
    meta.num_stages = c.num_stages;
    meta.bytes = blob->size();
    RETURN_IF_ERROR(snapshots_.Put(c.job_id, meta, blob));
    meta.held = true;  // what it is on the peer
    push.blobs.push_back({meta, std::move(blob)});
  }
  if (job.pusher) job.pusher->Enqueue(std::move(push));
  return absl::OkStatus();
}

absl::Status StageRuntime::AdmitSnapshot(const std::string& job_id, const std::string& peer_secret,
                                         const SnapshotMeta& meta) const {
  absl::MutexLock lock(&job_id_mu_);
  const std::string what = absl::StrCat("snapshot push of job '", job_id, "' stage ",
                                        meta.owner_stage, " step ", meta.step);
  if (job_id_.empty() || job_id != job_id_) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": this stage is configured for ",
        job_id_.empty() ? std::string("no job") : absl::StrCat("job '", job_id_, "'")));
  }
  if (peer_secret != peer_secret_) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": wrong peer_secret"));
  }
  const int K = num_stages_, predecessor = (stage_ + K - 1) % K;
  if (K < 2 || meta.owner_stage != predecessor || meta.num_stages != K) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " of ", meta.num_stages, " stages: stage ", stage_, " of ", K,
        K < 2 ? " has no snapshot peer" : absl::StrCat(" holds only its ring predecessor's, stage ",
                                                       predecessor, "'s")));
  }
  return absl::OkStatus();
}

absl::Status StageRuntime::HoldSnapshot(const std::string& job_id, const std::string& peer_secret,
                                        SnapshotMeta meta, std::shared_ptr<const std::string> blob) {
  RETURN_IF_ERROR(AdmitSnapshot(job_id, peer_secret, meta));
  meta.held = true;
  return snapshots_.Put(job_id, meta, std::move(blob));
}

absl::StatusOr<std::vector<SnapshotMeta>> StageRuntime::ListSnapshots(
    const std::string& job_id) const {
  return snapshots_.List(job_id);
}

absl::StatusOr<std::shared_ptr<const std::string>> StageRuntime::FetchSnapshot(
    const std::string& job_id, int owner_stage, int chunk, int64_t step) const {
  return snapshots_.Get(job_id, owner_stage, chunk, step);
}

SnapshotFigures StageRuntime::snapshot_figures() const {
  return {snapshots_.bytes(), snapshots_.NewestOwnStep().value_or(0)};
}

RuntimeStats StageRuntime::Stats() const {
  absl::MutexLock lock(&mu_);
  RuntimeStats s;
  s.memory_limit_bytes = options_.memory_limit_bytes;
  s.steps_run = steps_run_;
  if (job_) {
    s.job_id = job_->config.job_id;
    s.memory_used_bytes = job_->state_bytes + snapshots_.bytes();
    for (PeerLink* l : {job_->next.get(), job_->prev.get()}) {
      if (l == nullptr) continue;
      s.bytes_sent += l->bytes_sent();
      s.bytes_received += l->bytes_received();
    }
  }
  return s;
}

std::string StageRuntime::current_job_id() const {
  absl::MutexLock lock(&job_id_mu_);
  return job_id_;
}

bool StageRuntime::configured() const {
  absl::MutexLock lock(&mu_);
  return job_ != nullptr;
}

absl::StatusOr<std::vector<float>> StageRuntime::GetParam(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (!job_) return absl::FailedPreconditionError("this stage is not configured");
  for (BackendChunk* s : job_->backend_chunks) {
    auto p = s->layers().GetParam(name);
    if (p.ok()) return p;
  }
  return absl::NotFoundError(absl::StrCat("parameter ", name, " is not on stage ",
                                          job_->config.stage));
}

}  // namespace pipetrain::stage_server

namespace pipetrain::stage_server {

absl::Status StageRuntime::CheckJob(const std::string& job_id, const std::string& what) const {
  if (job_ && job_->config.job_id == job_id) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, " of job '", job_id, "': this stage is configured for ",
      job_ ? absl::StrCat("job '", job_->config.job_id, "'") : std::string("no job")));
}

absl::StatusOr<BackendChunk*> StageRuntime::ChunkOf(const std::string& job_id, int chunk,
                                                    const char* what) const {
  RETURN_IF_ERROR(CheckJob(job_id, what));
  if (job_->emulated) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " of job '", job_id, "': an emulated stage has no weights"));
  }
  if (chunk < 0 || chunk >= static_cast<int>(job_->backend_chunks.size())) {
    return absl::InvalidArgumentError(absl::StrCat(what, " of job '", job_id, "': field chunk ",
                                                   chunk, " is not in [0, ",
                                                   job_->backend_chunks.size(), ")"));
  }
  return job_->backend_chunks[chunk];
}

absl::StatusOr<std::string> StageRuntime::ExportChunk(const std::string& job_id, int chunk) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(BackendChunk * backend_chunk, ChunkOf(job_id, chunk, "export"));
  RETURN_IF_ERROR(job_->executor->CheckNoPendingOptimizer("export"));
  if (options_.faults && job_->last_step) {
    options_.faults->At(FaultPoint::kCheckpoint, job_id, static_cast<int64_t>(*job_->last_step));
  }
  return SerializeChunk(*backend_chunk);
}

absl::Status StageRuntime::ImportChunk(const std::string& job_id, int chunk,
                                       const std::string& bytes) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(BackendChunk * backend_chunk, ChunkOf(job_id, chunk, "import"));
  RETURN_IF_ERROR(job_->executor->CheckNoPendingOptimizer("import"));
  const std::string source = absl::StrCat("job '", job_id, "' chunk ", chunk);
  ASSIGN_OR_RETURN(model::Checkpoint ckpt, model::ParseCheckpoint(bytes, source));
  absl::Status s = compute::RestoreChunk(ckpt, backend_chunk->layers());
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(source, ": ", s.message()));
  if (options_.faults) options_.faults->Restored(job_id);
  return absl::OkStatus();
}


}  // namespace pipetrain::stage_server
