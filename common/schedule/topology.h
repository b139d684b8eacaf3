// Where a pipeline's virtual stages live: the j-th contiguous run of the model's layers
// (j = 0 .. Kv-1) is chunk c of stage s, by the schedule's placement, and which way a
// tensor moves between virtual stage j and j+1. Lowering, the validator, the simulator,
// cost fitting, the stage's executor and its links all ask this one place.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::schedule {

enum class Placement {
  // Chunk c of stage s is virtual stage c*K + s: the model runs stage 0..K-1 for chunk 0,
  // then wraps from stage K-1 to stage 0 for chunk 1 (Megatron's interleaving). With
  // v = 1 this is the plain pipeline.
  kLooped = 0,
  // Chunks zigzag: even chunks run stage 0..K-1, odd ones back K-1..0, so with v = 2
  // stage 0 holds the first and the last virtual stage and stage K-1 the two middle
  // ones (ZB-V, DualPipe-V). Chunk boundaries stay on one stage: no ring link.
  kV = 1,
};

// "looped" / "v", as the schedule text form and messages write them.
std::string PlacementName(Placement placement);
absl::StatusOr<Placement> ParsePlacement(absl::string_view name);

// How a tensor moves from virtual stage j to j+1, seen from j's stage (the way back is
// the other direction): to stage s+1 (the `next` link, stage K-1 to 0 around the ring),
// to stage s-1 (`prev`), or to another chunk of the same stage.
enum class Hop { kNext, kPrev, kSelf };

// The most stages a pipeline may have: the validator refuses programs of more, so a
// stage configured for more could never run one (and K x v must fit an int).
inline constexpr int kMaxTopologyStages = 4096;

struct Topology {
  int stages = 1;  // K
  int chunks = 1;  // v
  Placement placement = Placement::kLooped;

  int Virtual(int stage, int chunk) const;
  int StageOf(int virtual_stage) const;
  int ChunkOf(int virtual_stage) const;
  int Last() const { return stages * chunks - 1; }
  // The stage whose chunk holds the embedding (always 0) and the one holding the head.
  int HeadStage() const { return StageOf(Last()); }
  int HeadChunk() const { return ChunkOf(Last()); }
  // From virtual stage j to j+1 (0 <= j < Last()).
  Hop HopAfter(int virtual_stage) const;
};

// The links a stage needs: `next` to stage s+1 (mod K), `prev` to stage s-1 (mod K),
// for the pipeline's hops and, with tied embeddings held on two stages, the exchange
// between stage 0 and the head's stage (stage 0's prev, the head stage's next).
struct StageLinkNeeds {
  bool next = false;
  bool prev = false;
};
StageLinkNeeds LinkNeeds(const Topology& topology, int stage, bool tie_embeddings);

}  // namespace pipetrain::schedule
