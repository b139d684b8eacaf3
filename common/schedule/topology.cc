#include "common/schedule/topology.h"

#include "absl/strings/str_cat.h"

namespace pipetrain::schedule {

std::string PlacementName(Placement placement) {
  return placement == Placement::kV ? "v" : "looped";
}

absl::StatusOr<Placement> ParsePlacement(absl::string_view name) {
  if (name == "looped") return Placement::kLooped;
  if (name == "v") return Placement::kV;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown placement '", name, "' (expected looped or v)"));
}

int Topology::Virtual(int stage, int chunk) const {
  const bool reversed = placement == Placement::kV && chunk % 2 == 1;
  return chunk * stages + (reversed ? stages - 1 - stage : stage);
}

int Topology::StageOf(int virtual_stage) const {
  const int position = virtual_stage % stages, chunk = virtual_stage / stages;
  const bool reversed = placement == Placement::kV && chunk % 2 == 1;
  return reversed ? stages - 1 - position : position;
}

int Topology::ChunkOf(int virtual_stage) const { return virtual_stage / stages; }

Hop Topology::HopAfter(int virtual_stage) const {
  const int from = StageOf(virtual_stage), to = StageOf(virtual_stage + 1);
  if (from == to) return Hop::kSelf;
  if (placement == Placement::kV && ChunkOf(virtual_stage) % 2 == 1) return Hop::kPrev;
  return Hop::kNext;  // K = 2 looped: stage 1 reaches stage 0 by its next link too
}

StageLinkNeeds LinkNeeds(const Topology& t, int stage, bool tie_embeddings) {
  StageLinkNeeds needs;
  // Only this stage's chunks: the hop into each (its receiver uses the link opposite the
  // hop's direction) and the hop out of it (its sender uses the hop's own).
  for (int c = 0; c < t.chunks; ++c) {
    const int j = t.Virtual(stage, c);
    if (j > 0) {
      const Hop in = t.HopAfter(j - 1);
      if (in == Hop::kNext) needs.prev = true;
      if (in == Hop::kPrev) needs.next = true;
    }
    if (j < t.Last()) {
      const Hop out = t.HopAfter(j);
      if (out == Hop::kNext) needs.next = true;
      if (out == Hop::kPrev) needs.prev = true;
    }
  }
  if (tie_embeddings && t.HeadStage() != 0) {
    if (stage == 0) needs.prev = true;
    if (stage == t.HeadStage()) needs.next = true;
  }
  return needs;
}

}  // namespace pipetrain::schedule
