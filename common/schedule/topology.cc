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
  for (int j = 0; j < t.Last(); ++j) {
    const Hop hop = t.HopAfter(j);
    if (hop == Hop::kSelf) continue;
    const bool forward_next = hop == Hop::kNext;
    // The sender of j -> j+1 uses the hop's link; the receiver the opposite one.
    if (t.StageOf(j) == stage) (forward_next ? needs.next : needs.prev) = true;
    if (t.StageOf(j + 1) == stage) (forward_next ? needs.prev : needs.next) = true;
  }
  if (tie_embeddings && t.HeadStage() != 0) {
    if (stage == 0) needs.prev = true;
    if (stage == t.HeadStage()) needs.next = true;
  }
  return needs;
}

}  // namespace pipetrain::schedule
