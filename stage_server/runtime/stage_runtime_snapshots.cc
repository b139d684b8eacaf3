// StageRuntime's in-memory snapshots: its own, taken right after an optimizer update
// and copied to the ring successor, and the predecessor's it holds. None of these but
// TakeSnapshot take the step lock: they answer while a step waits.
#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/status_macros.h"
#include "stage_server/runtime/stage_runtime.h"
#include "stage_server/runtime/stage_runtime_job.h"

namespace pipetrain::stage_server {

absl::Status StageRuntime::TakeSnapshot(Job& job, uint64_t step) {
  const JobConfig& c = job.config;
  SnapshotPush push;
  push.step = static_cast<int64_t>(step);
  for (size_t i = 0; i < job.backend_chunks.size(); ++i) {
    const common::ErrorContext context =
        common::ErrorContext("snapshot").Job(c.job_id).Stage(c.stage).Step(push.step).Chunk(i);
    ASSIGN_OR_RETURN(std::string bytes, context.Wrap(SerializeChunk(*job.backend_chunks[i], job.config.precision)));
    auto blob = std::make_shared<const std::string>(std::move(bytes));
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
  absl::MutexLock lock(&published_mu_);
  const PublishedJob& p = published_;
  const common::ErrorContext context =
      common::ErrorContext("snapshot push").Job(job_id).Stage(meta.owner_stage).Step(meta.step);
  if (p.job_id.empty() || job_id != p.job_id) {
    return context.Error(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("this stage is configured for ",
                     p.job_id.empty() ? std::string("no job") : absl::StrCat("job '", p.job_id, "'")));
  }
  if (peer_secret != p.peer_secret) {
    return context.Error(absl::StatusCode::kPermissionDenied, "wrong peer_secret");
  }
  const int K = p.num_stages, predecessor = (p.stage + K - 1) % K;
  const bool has_peer = K >= 2 || p.replica_ring;  // one stage: the previous copy's
  if (!has_peer || meta.owner_stage != predecessor || meta.num_stages != K) {
    return absl::FailedPreconditionError(absl::StrCat(
        context.Text(), " of ", meta.num_stages, " stages: stage ", p.stage, " of ", K,
        !has_peer ? " has no snapshot peer"
                  : absl::StrCat(" holds only its ring predecessor's, stage ", predecessor, "'s")));
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
    const std::string& job_id, int owner_stage, int chunk, int64_t step,
    std::optional<bool> held) const {
  return snapshots_.Get(job_id, owner_stage, chunk, step, held);
}

SnapshotFigures StageRuntime::snapshot_figures() const {
  return {snapshots_.bytes(), snapshots_.NewestOwnStep().value_or(0)};
}

}  // namespace pipetrain::stage_server
