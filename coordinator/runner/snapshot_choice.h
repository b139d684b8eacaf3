// Which state a job whose stage was lost continues from, when its surviving stages
// hold in-memory snapshots: the newest step at which every chunk of the old layout is
// held by a survivor (its own copy, or the copy its ring neighbour keeps), and the
// check, once the blobs are fetched, that they are all of that one step before they are
// merged into the whole model. Pure: the coordinator lists and fetches over gRPC.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/checkpoint.h"

namespace pipetrain::coordinator {

// One snapshot blob a stage holds.
struct SnapshotEntry {
  int owner_stage = 0;  // the stage (of the old layout) whose chunk it is
  int chunk = 0;
  int64_t step = 0;
  bool held = false;    // a copy of another stage's snapshot
};

struct SnapshotPick {
  int holder = 0;  // index into the listings
  int owner_stage = 0;
  int chunk = 0;
  bool held = false;  // the holder's copy of another's snapshot, not its own
};

struct SnapshotChoice {
  int64_t step = 0;
  std::vector<SnapshotPick> picks;  // one per chunk of the old layout, in layer order
};

// `listings[h]` is what holder h has. The newest step up to `max_step` (the last step
// the job recorded: a later one, finished on the stages but never recorded, would leave
// a step without its record) at which each (owner_stage < stages, chunk < chunks) is
// listed by some holder, taking the owner's own copy over a held one; nullopt when no
// step is complete.
std::optional<SnapshotChoice> ChooseSnapshotStep(
    const std::vector<std::vector<SnapshotEntry>>& listings, int stages, int chunks,
    int64_t max_step);

// Fetches every pick (`fetch` returns the safetensors bytes), checks that each holds
// AdamW state of exactly `choice.step` updates (a blob of another step is an error naming
// the job, owner stage, chunk and both steps: states of two steps are never mixed), and
// merges them into the whole model.
absl::StatusOr<model::Checkpoint> AssembleSnapshot(
    const SnapshotChoice& choice,
    const std::function<absl::StatusOr<std::string>(const SnapshotPick&)>& fetch,
    const std::string& job_id);

}  // namespace pipetrain::coordinator
