// StageRuntime's configured job, private to the runtime's files: what Configure builds
// and the steps, snapshots and chunk imports and exports use.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/buffer_pool.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/collective/gradient_reducer.h"
#include "stage_server/compute/backend.h"
#include "stage_server/exec/executor.h"
#include "stage_server/runtime/job_config.h"
#include "stage_server/link/peer_link.h"
#include "stage_server/snapshots/snapshot_pusher.h"
#include "stage_server/runtime/stage_runtime.h"

namespace pipetrain::stage_server {

// The other replicas of a stage position (replicas > 1), connected at the job's first
// step. Shared with the executor's averaging, which may finish an all-reduce after the
// job is gone (a step aborted while it waited in one).
struct ReducerSlot {
  absl::Mutex mu;
  std::shared_ptr<collective::GradientReducer> reducer ABSL_GUARDED_BY(mu);
};

struct StageRuntime::Job {
  JobConfig config;
  StageLinks links;  // which of next and prev this stage has
  bool emulated = false;
  uint64_t state_bytes = 0;
  uint64_t table_bytes = 0;  // its chunks' shared tables (MemoryBreakdown::tables)
  std::unique_ptr<compute::Backend> backend;
  std::shared_ptr<common::BufferPool> pool;
  std::vector<BackendChunk*> backend_chunks;  // real chunks, owned by the executor
  std::unique_ptr<Executor> executor;
  std::unique_ptr<PeerLink> next;  // to the downstream stage (this stage connects)
  std::unique_ptr<PeerLink> prev;  // from the upstream stage (it connects to us)
  std::optional<uint64_t> last_step;
  // A deferred step run with snapshot: ApplyOptimizer takes the snapshot of this step.
  std::optional<uint64_t> snapshot_after_apply;
  // Copies snapshots to the ring successor; last, so it stops before the rest goes.
  std::unique_ptr<SnapshotPusher> pusher;
  std::shared_ptr<ReducerSlot> reducer = std::make_shared<ReducerSlot>();
};

// A chunk's weights, AdamW moments and step as a safetensors file's bytes, recording the
// job's precision: what ExportChunk sends and what a snapshot keeps.
absl::StatusOr<std::string> SerializeChunk(BackendChunk& chunk, const model::Precision& precision);

}  // namespace pipetrain::stage_server
