// What a stage is configured with for one job (JobConfig, from a ConfigureRequest), and
// the pure rules read from it: whether it is valid, which neighbour links the stage
// has and how they are set up. StageRuntime::Configure applies them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/model/transformer_config.h"
#include "common/model/precision.h"
#include "common/schedule/topology.h"
#include "common/tensor_codec.h"
#include "stage_server/compute/optimizer_settings.h"
#include "stage_server/link/peer_link.h"

namespace pipetrain::stage_server {

struct JobConfig {
  std::string job_id;
  int stage = 0;
  int num_stages = 1;
  model::TransformerConfig model;
  std::vector<std::pair<int, int>> chunks;  // pipeline layers [begin, end) per chunk
  // The schedule's placement of virtual stages (ConfigureRequest.placement).
  schedule::Placement placement = schedule::Placement::kLooped;
  schedule::Topology topology() const {
    return {num_stages, static_cast<int>(chunks.size()), placement};
  }
  uint64_t seed = 0;
  compute::OptimizerSettings optimizer = compute::kStageOptimizerDefaults;
  std::string upstream_address;    // previous stage (ring: stage K-1 for stage 0)
  std::string downstream_address;  // next stage (ring: stage 0 for stage K-1)
  // Per chunk (as `chunks`): whether it re-runs its forward before its backward, as the
  // coordinator's plan decided (ConfigureRequest.chunk_recompute); empty: no chunk does.
  std::vector<bool> chunk_recompute;
  // training.precision (ConfigureRequest.precision): the products' operands.
  model::Precision precision = model::PrecisionTable().front();
  bool recomputes(size_t chunk) const {
    return chunk < chunk_recompute.size() && chunk_recompute[chunk];
  }
  size_t frame_bytes = common::kDefaultFrameBytes;
  int micro_batch_size = 1;
  std::string peer_secret;
  absl::Duration recv_timeout = absl::Seconds(60);
  // Where this stage's snapshots are copied (the ring successor); "" = kept here only.
  std::string snapshot_peer_address;
  uint64_t snapshot_reserve_bytes = 0;  // counted with the state against --memory-limit
  // Data-parallel replicas (ConfigureRequest.replica, replicas, rendezvous_prefix).
  int replica = 0;
  int replicas = 1;
  std::string rendezvous_prefix;
  // ConfigureRequest.shard_optimizer: the replicas split the optimizer between them.
  bool shard_optimizer = false;
  // How the chunks split the optimizer: this copy of `replicas`, or one copy of one (no
  // split) without replicas or without shard_optimizer.
  compute::OptimizerSplit split() const {
    if (!shard_optimizer || replicas < 2) return {};
    return {.copies = replicas, .copy = replica};
  }
  // A one-stage pipeline whose copies split the optimizer has no ring successor to keep
  // its snapshots, and no other copy holds its moments: its snapshots go to the next
  // replica's stage (snapshot_peer_address), which holds them as its predecessor's.
  bool SnapshotsRingReplicas() const { return num_stages == 1 && split().copies > 1; }
};

// The neighbour links a stage has: to stage + 1 (it connects) and from stage - 1 (it
// accepts), modulo K, as schedule::LinkNeeds says: those its chunks' hops use (the ring
// link K-1 -> 0 with several looped chunks per stage), and the ring link when stage 0
// and the head's stage share the tied embedding (its gradient goes straight between
// them over that link).
struct StageLinks {
  bool next = false;
  bool prev = false;
};
StageLinks LinksOf(const JobConfig& config);

// INVALID_ARGUMENT "configure of job 'ID' stage S: ..." naming the field. Replicas meet
// through the coordinator, so they need `has_coordinator`.
absl::Status ValidateJobConfig(const JobConfig& config, bool has_coordinator);

// The link to the downstream neighbour (this stage connects) and from the upstream one
// (this stage accepts it).
PeerLinkOptions DownstreamLinkOptions(const JobConfig& config);
PeerLinkOptions UpstreamLinkOptions(const JobConfig& config);

}  // namespace pipetrain::stage_server
