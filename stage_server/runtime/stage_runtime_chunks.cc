// StageRuntime's chunk state in and out: ExportChunk, ImportChunk (admitted by its
// size before a byte is buffered), GetParam, and the checks that name the job and chunk
// a call is about.
#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/model/checkpoint.h"
#include "common/safetensors.h"
#include "common/status_macros.h"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/runtime/stage_runtime.h"
#include "stage_server/runtime/stage_runtime_job.h"

namespace pipetrain::stage_server {

absl::StatusOr<std::string> SerializeChunk(BackendChunk& chunk, const model::Precision& precision) {
  ASSIGN_OR_RETURN(model::Checkpoint ckpt,
                   compute::CheckpointOfChunk(chunk.layers(), /*with_optimizer=*/true));
  ckpt.precision = std::string(precision.name);  // the coordinator's record needs no rewrite
  return model::SerializeCheckpoint(ckpt);
}

absl::Status StageRuntime::CheckJob(const common::ErrorContext& context,
                                    const std::string& job_id) const {
  if (current_.job && current_.job->config.job_id == job_id) return absl::OkStatus();
  return context.Error(
      absl::StatusCode::kFailedPrecondition,
      absl::StrCat("this stage is configured for ",
                   current_.job ? absl::StrCat("job '", current_.job->config.job_id, "'")
                                : std::string("no job")));
}

absl::StatusOr<BackendChunk*> StageRuntime::ChunkOf(const common::ErrorContext& context,
                                                    const std::string& job_id, int chunk) const {
  RETURN_IF_ERROR(CheckJob(context, job_id));
  const Job& job = *current_.job;
  if (job.emulated) {
    return context.Error(absl::StatusCode::kFailedPrecondition,
                         "an emulated stage has no weights");
  }
  if (chunk < 0 || chunk >= static_cast<int>(job.backend_chunks.size())) {
    return context.Error(absl::StatusCode::kInvalidArgument,
                         absl::StrCat("field chunk ", chunk, " is not in [0, ",
                                      job.backend_chunks.size(), ")"));
  }
  return job.backend_chunks[chunk];
}

absl::StatusOr<std::string> StageRuntime::ExportChunk(const std::string& job_id, int chunk) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(BackendChunk * backend_chunk,
                   ChunkOf(common::ErrorContext("export").Job(job_id), job_id, chunk));
  const Job& job = *current_.job;
  RETURN_IF_ERROR(job.executor->CheckNoPendingOptimizer("export"));
  if (options_.faults && job.last_step) {
    options_.faults->At(FaultPoint::kCheckpoint, job_id, static_cast<int64_t>(*job.last_step));
  }
  return SerializeChunk(*backend_chunk, job.config.precision);
}

absl::Status StageRuntime::AdmitImport(const std::string& job_id, int chunk,
                                       uint64_t total_bytes) const {
  absl::MutexLock lock(&mu_);
  const common::ErrorContext context = common::ErrorContext("import").Job(job_id).Chunk(chunk);
  ASSIGN_OR_RETURN(BackendChunk * backend_chunk, ChunkOf(context, job_id, chunk));
  const uint64_t params = static_cast<uint64_t>(backend_chunk->layers().NumParams());
  const uint64_t largest = MaxChunkCheckpointBytes(params);
  if (total_bytes <= largest) return absl::OkStatus();
  const uint64_t memory =
      options_.memory_limit_bytes > 0 ? options_.memory_limit_bytes : HostMemoryBytes();
  return context.Error(
      absl::StatusCode::kInvalidArgument,
      absl::StrCat("field total_bytes ", total_bytes,
                   " is more than a checkpoint of this chunk can be: ", largest, " bytes (",
                   params, " parameters x ", CheckpointBytesPerParam(),
                   " bytes of weight and AdamW moments, and a safetensors header of at most ",
                   common::kMaxSafetensorsHeaderBytes, " bytes); this stage has ", memory,
                   " bytes of memory",
                   options_.memory_limit_bytes > 0 ? " (--memory-limit)" : " (its host's)"));
}

absl::Status StageRuntime::ImportChunk(const std::string& job_id, int chunk,
                                       const std::string& bytes) {
  absl::MutexLock lock(&mu_);
  const common::ErrorContext context = common::ErrorContext("import").Job(job_id).Chunk(chunk);
  ASSIGN_OR_RETURN(BackendChunk * backend_chunk, ChunkOf(context, job_id, chunk));
  RETURN_IF_ERROR(current_.job->executor->CheckNoPendingOptimizer("import"));
  ASSIGN_OR_RETURN(model::Checkpoint ckpt, model::ParseCheckpoint(bytes, context.Text()));
  RETURN_IF_ERROR(context.Wrap(compute::RestoreChunk(ckpt, backend_chunk->layers())));
  if (options_.faults) options_.faults->Restored(job_id);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> StageRuntime::GetParam(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (!current_.job) return absl::FailedPreconditionError("this stage is not configured");
  for (BackendChunk* s : current_.job->backend_chunks) {
    auto p = s->layers().GetParam(name);
    if (p.ok()) return p;
  }
  return absl::NotFoundError(absl::StrCat("parameter ", name, " is not on stage ",
                                          current_.job->config.stage));
}

}  // namespace pipetrain::stage_server
