#include "stage_server/stage_runtime.h"

#include "absl/strings/str_cat.h"
#include "common/channel_args.h"
#include "common/model/checkpoint.h"
#include "common/status_macros.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "stage_server/backend_chunk.h"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/emulated_chunk.h"

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
};

StageRuntime::StageRuntime(RuntimeOptions options) : options_(std::move(options)) {}

StageRuntime::~StageRuntime() {
  absl::MutexLock lock(&mu_);
  job_.reset();
}

uint64_t StageRuntime::StateBytes(const JobConfig& config) {
  uint64_t params = 0;
  for (const auto& [begin, end] : config.chunks) {
    for (int l = begin; l < end; ++l) params += model::CostOfLayer(config.model, l).params;
  }
  return params * 16;  // f32 weight, gradient, AdamW m and v
}

absl::Status StageRuntime::ValidateConfig(const JobConfig& c) const {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("configure job '", c.job_id, "' stage ",
                                                   c.stage, ": ", what));
  };
  if (c.job_id.empty()) return absl::InvalidArgumentError("configure: field job_id is empty");
  RETURN_IF_ERROR(model::ValidateConfig(c.model));
  if (c.num_stages < 1) return bad("field num_stages must be >= 1");
  if (c.stage < 0 || c.stage >= c.num_stages) {
    return bad(absl::StrCat("field stage must be in [0, ", c.num_stages, ")"));
  }
  if (c.chunks.empty()) return bad("field layers is empty");
  for (size_t i = 0; i < c.chunks.size(); ++i) {
    const auto [begin, end] = c.chunks[i];
    if (begin < 0 || end > c.model.num_pipeline_layers() || begin >= end) {
      return bad(absl::StrCat("field layers[", i, "] [", begin, ", ", end,
                              ") is not a non-empty range of the model's ",
                              c.model.num_pipeline_layers(), " pipeline layers"));
    }
  }
  if (c.micro_batch_size < 1) return bad("field micro_batch_size must be >= 1");
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
  if (options_.memory_limit_bytes > 0 && state > options_.memory_limit_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "configure job '", config.job_id, "' stage ", config.stage,
        ": its share of the model needs ", state,
        " bytes for weights, gradients and optimizer state, but this stage has ",
        options_.memory_limit_bytes, " (--memory-limit); use more stages or a smaller model"));
  }

  absl::MutexLock lock(&mu_);
  if (job_ && job_->config.job_id == config.job_id) {
    RETURN_IF_ERROR(job_->executor->CheckNoPendingOptimizer("configure"));
  }
  if (job_) acceptor_.Forget(job_->config.job_id);
  job_.reset();  // frees the previous job's memory before allocating the new one
  {
    absl::MutexLock id_lock(&job_id_mu_);
    job_id_.clear();
  }

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
    for (const auto& [begin, end] : config.chunks) {
      chunks.push_back(std::make_unique<EmulatedChunk>(
          config.model, begin, end, config.micro_batch_size, device, config.recompute, job->pool));
    }
  } else {
    if (options_.device.kind == DeviceSpec::Kind::kCuda) {
      ASSIGN_OR_RETURN(job->backend, compute::CreateCudaBackend(options_.device.cuda_index));
    } else {
      ASSIGN_OR_RETURN(job->backend, compute::CpuBackend::Create(options_.threads));
    }
    for (const auto& [begin, end] : config.chunks) {
      compute::ChunkOptions so;
      so.recompute = config.recompute;
      ASSIGN_OR_RETURN(auto layers, compute::ModelChunk::Create(config.model, begin, end,
                                                                job->backend.get(), so));
      RETURN_IF_ERROR(layers->Initialize(config.seed));
      ASSIGN_OR_RETURN(auto backend_chunk,
                       BackendChunk::Create(std::move(layers), config.micro_batch_size, job->pool));
      job->backend_chunks.push_back(backend_chunk.get());
      chunks.push_back(std::move(backend_chunk));
    }
  }
  if (job->has_prev) {
    PeerLinkOptions o;
    o.job_id = config.job_id;
    o.local_stage = config.stage;
    o.peer_stage = (config.stage + K - 1) % K;
    o.peer_address = config.upstream_address;
    o.frame_bytes = config.frame_bytes;
    acceptor_.Expect(o, config.peer_secret);
  }
  ExecutorConfig ec;
  ec.job_id = config.job_id;
  ec.stage = config.stage;
  ec.num_stages = K;
  ec.num_chunks = v;
  ec.recv_timeout = config.recv_timeout;
  ec.optimizer = config.optimizer;
  ec.tie_embeddings = config.model.tie_embeddings;
  // The links are made at the first step; the executor reaches them through these.
  job->executor = std::make_unique<Executor>(ec, std::move(chunks), nullptr, nullptr, job->pool);
  job_ = std::move(job);
  steps_run_ = 0;
  {
    absl::MutexLock id_lock(&job_id_mu_);
    job_id_ = config.job_id;
  }
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
    auto channel =
        grpc::CreateCustomChannel(c.downstream_address, options_.security.ChannelCredentials(),
                                  common::ChannelArgumentsFor(common::ChannelUse::kPeerLink));
    ASSIGN_OR_RETURN(job.next, ConnectPeerLink(channel, o, c.peer_secret, deadline));
  }
  if (job.has_prev && job.prev == nullptr) {
    ASSIGN_OR_RETURN(job.prev,
                     acceptor_.WaitForPeer(c.job_id, (c.stage + K - 1) % K, deadline));
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
  // A failed link is rebuilt at the next step rather than leaving the stage stuck.
  if (job.next && !job.next->status().ok()) job.next.reset();
  if (job.prev && !job.prev->status().ok()) job.prev.reset();
  if (absl::Status s = EnsureLinks(job); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("step ", request.step, " of job '",
                                               request.job_id, "' stage ", job.config.stage,
                                               ": ", s.message()));
  }
  // Rebind the executor to the current links.
  Executor& ex = *job.executor;
  ex.SetNeighbours(job.next.get(), job.prev.get());
  request.inputs.step = request.step;
  ASSIGN_OR_RETURN(StepResult result, ex.RunStep(request.program, std::move(request.inputs)));
  job.last_step = request.step;
  ++steps_run_;
  StepReport report;
  report.peak_memory_bytes = job.state_bytes + result.peak_activation_bytes;
  report.emulated = job.emulated;
  report.result = std::move(result);
  return report;
}

absl::StatusOr<ActionTiming> StageRuntime::ApplyOptimizer(const ApplyOptimizerRequest& request) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJob(request.job_id, absl::StrCat("apply optimizer (step ", request.step, ")")));
  return job_->executor->ApplyOptimizer(request.step, request.global_grad_norm, request.lr);
}

RuntimeStats StageRuntime::Stats() const {
  absl::MutexLock lock(&mu_);
  RuntimeStats s;
  s.memory_limit_bytes = options_.memory_limit_bytes;
  s.steps_run = steps_run_;
  if (job_) {
    s.job_id = job_->config.job_id;
    s.memory_used_bytes = job_->state_bytes;
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
  ASSIGN_OR_RETURN(model::Checkpoint ckpt,
                   compute::CheckpointOfChunk(backend_chunk->layers(), /*with_optimizer=*/true));
  return model::SerializeCheckpoint(ckpt);
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
  return absl::OkStatus();
}


}  // namespace pipetrain::stage_server
