// The in-memory snapshots one stage keeps for its configured job: its own chunks' state
// after a step (the bytes ExportChunk gives) and the copies its ring predecessor pushed
// to it. Pure and thread-safe with its own lock, so that the coordinator can list and
// fetch snapshots while a step holds the runtime's lock.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/error_context.h"

namespace pipetrain::stage_server {

// What one snapshot blob is: whose slice, of which step, in which layout.
struct SnapshotMeta {
  int owner_stage = 0;  // the stage whose chunk it is
  int chunk = 0;
  int64_t step = 0;
  bool held = false;  // a copy of another stage's snapshot
  int begin_layer = 0, end_layer = 0;  // pipeline layers [begin, end)
  int num_stages = 1;                  // K of the layout it was taken in
  uint64_t bytes = 0;                  // size of the blob
  bool operator==(const SnapshotMeta&) const = default;
};

class SnapshotStore {
 public:
  // Steps kept per (owner_stage, chunk, held): a stage lost while the newer copy was
  // still in flight leaves the previous step complete on every survivor.
  static constexpr int kStepsKept = 2;

  // Drops every snapshot and holds those of `job_id` from now on ("" = no job).
  void Reset(const std::string& job_id);
  std::string job_id() const;

  // Adds a complete blob (meta.bytes is set from it), replacing one of the same step,
  // and drops that key's steps older than the two newest. FAILED_PRECONDITION when
  // `job_id` is not the store's job or the step is older than both kept.
  absl::Status Put(const std::string& job_id, SnapshotMeta meta,
                   std::shared_ptr<const std::string> blob);
  // Every snapshot held, ordered by (owner_stage, chunk, step, held).
  absl::StatusOr<std::vector<SnapshotMeta>> List(const std::string& job_id) const;
  // The blob of (owner_stage, chunk, step): own or held as `held` says, or (nullopt)
  // own first, else held; NOT_FOUND names what is there.
  absl::StatusOr<std::shared_ptr<const std::string>> Get(
      const std::string& job_id, int owner_stage, int chunk, int64_t step,
      std::optional<bool> held = std::nullopt) const;
  uint64_t bytes() const;  // of every blob held
  // The newest step of the store's own (not held) snapshots; none before the first.
  std::optional<int64_t> NewestOwnStep() const;

 private:
  absl::Status CheckJob(const std::string& job_id, const common::ErrorContext& about) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  struct Entry {
    SnapshotMeta meta;
    std::shared_ptr<const std::string> blob;
  };
  using Key = std::tuple<int, int, bool>;  // owner_stage, chunk, held

  mutable absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  std::map<Key, std::map<int64_t, Entry>> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// Puts a pushed snapshot back together from its pieces: every piece must carry the same
// job and meta and continue where the previous one ended, and Finish succeeds only
// with all meta.bytes received, so a half-received push never reaches the store.
class SnapshotAssembler {
 public:
  explicit SnapshotAssembler(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  // INVALID_ARGUMENT (naming job, owner stage, chunk, step and offset) for a piece that
  // does not continue the blob; RESOURCE_EXHAUSTED when meta.bytes exceeds max_bytes.
  absl::Status Add(const std::string& job_id, const SnapshotMeta& meta, uint64_t offset,
                   std::string_view data);
  bool started() const { return started_; }
  const std::string& job_id() const { return job_id_; }
  const SnapshotMeta& meta() const { return meta_; }
  // The whole blob; INVALID_ARGUMENT when the stream ended early.
  absl::StatusOr<std::shared_ptr<const std::string>> Finish();

 private:
  std::string Describe() const;

  const uint64_t max_bytes_;
  bool started_ = false;
  std::string job_id_;
  SnapshotMeta meta_;
  std::string data_;
};

}  // namespace pipetrain::stage_server
