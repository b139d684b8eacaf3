#include "stage_server/runtime/job_config.h"

#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/input_limits.h"
#include "common/status_macros.h"
#include "stage_server/link/link_limits.h"

namespace pipetrain::stage_server {
namespace {

// The request's strings, each within its limit.
absl::Status CheckLengths(const JobConfig& c) {
  for (const auto& [field, value, limit] :
       {std::tuple<const char*, const std::string&, int64_t>{
            "upstream_address", c.upstream_address, common::kMaxAddressBytes},
        {"downstream_address", c.downstream_address, common::kMaxAddressBytes},
        {"snapshot_peer_address", c.snapshot_peer_address, common::kMaxAddressBytes},
        {"peer_secret", c.peer_secret, common::kMaxSecretBytes},
        {"rendezvous_prefix", c.rendezvous_prefix, common::kMaxPathBytes}}) {
    RETURN_IF_ERROR(common::CheckLength(absl::StrCat("field ", field), value, limit));
  }
  return absl::OkStatus();
}

// The layer ranges: non-empty ranges of the model, no more of them than it has layers.
absl::Status CheckChunks(const JobConfig& c) {
  const int layers = c.model.num_pipeline_layers();
  if (c.chunks.empty()) return absl::InvalidArgumentError("field chunks is empty");
  // Non-empty ranges of a model this size cannot be more; more would only cost time.
  if (static_cast<int64_t>(c.chunks.size()) > layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field chunks has ", c.chunks.size(), " ranges; the model has only ", layers,
        " pipeline layers"));
  }
  for (size_t i = 0; i < c.chunks.size(); ++i) {
    const auto [begin, end] = c.chunks[i];
    if (begin < 0 || end > layers || begin >= end) {
      return absl::InvalidArgumentError(
          absl::StrCat("field chunks[", i, "] [", begin, ", ", end,
                       ") is not a non-empty range of the model's ", layers, " pipeline layers"));
    }
  }
  return absl::OkStatus();
}

// Where the stage sits: its place in the pipeline and among its replicas.
absl::Status CheckPlacement(const JobConfig& c, bool has_coordinator) {
  if (c.num_stages < 1 || c.num_stages > schedule::kMaxTopologyStages) {
    return absl::InvalidArgumentError(absl::StrCat("field num_stages must be in [1, ",
                                                   schedule::kMaxTopologyStages, "] (got ",
                                                   c.num_stages, ")"));
  }
  if (c.stage < 0 || c.stage >= c.num_stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("field stage must be in [0, ", c.num_stages, ")"));
  }
  if (c.replicas < 1 || c.replica < 0 || c.replica >= c.replicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field replica ", c.replica, " must be in [0, replicas ", c.replicas, ")"));
  }
  if (c.replicas > 1 && !has_coordinator) {
    return absl::InvalidArgumentError(
        "data-parallel replicas meet through the coordinator, and this stage runs without "
        "--coordinator");
  }
  if (c.replicas > 1 && c.rendezvous_prefix.empty()) {
    return absl::InvalidArgumentError("field rendezvous_prefix is empty but the job has replicas");
  }
  return absl::OkStatus();
}

// An address for each neighbour of the pipeline and, with several chunks, of the ring.
// The ring link a tied embedding alone adds is not required here (a request without its
// address fails at the first step, naming it), as before LinksOf existed: tightening it
// would refuse requests that configure today (tests/fuzz corpus huge_micro_batch_size).
absl::Status CheckNeighbours(const JobConfig& c) {
  const schedule::StageLinkNeeds needs = schedule::LinkNeeds(c.topology(), c.stage, false);
  const bool prev = needs.prev, next = needs.next;
  if (prev && c.upstream_address.empty()) {
    return absl::InvalidArgumentError(
        "field upstream_address is empty but this stage has an upstream neighbour");
  }
  if (next && c.downstream_address.empty()) {
    return absl::InvalidArgumentError(
        "field downstream_address is empty but this stage has a downstream neighbour");
  }
  return absl::OkStatus();
}

}  // namespace

StageLinks LinksOf(const JobConfig& c) {
  const schedule::StageLinkNeeds needs =
      schedule::LinkNeeds(c.topology(), c.stage, c.model.tie_embeddings);
  return {.next = needs.next, .prev = needs.prev};
}

absl::Status ValidateJobConfig(const JobConfig& c, bool has_coordinator) {
  if (c.job_id.empty()) return absl::InvalidArgumentError("configure: field job_id is empty");
  RETURN_IF_ERROR(common::CheckLength("configure: field job_id", c.job_id, common::kMaxIdBytes));
  const common::ErrorContext context =
      common::ErrorContext("configure").Job(c.job_id).Stage(c.stage);
  RETURN_IF_ERROR(context.Wrap(CheckLengths(c)));
  RETURN_IF_ERROR(context.Wrap(model::ValidateConfig(c.model)));
  RETURN_IF_ERROR(context.Wrap(CheckPlacement(c, has_coordinator)));
  RETURN_IF_ERROR(context.Wrap(CheckChunks(c)));
  if (c.micro_batch_size < 1) {
    return context.Error(absl::StatusCode::kInvalidArgument, "field micro_batch_size must be >= 1");
  }
  if (c.frame_bytes == 0) {
    return context.Error(absl::StatusCode::kInvalidArgument, "field frame_bytes must be > 0");
  }
  return context.Wrap(CheckNeighbours(c));
}

namespace {

// Per chunk of this stage, what reaches it over the link to stage s+1 (`next_link`) or
// from stage s-1: its input activation arrives against the hop into it, its output's
// gradient comes back along the hop out of it.
std::vector<common::TensorKind> ReceiveKinds(const JobConfig& c, bool next_link) {
  const schedule::Topology t = c.topology();
  std::vector<common::TensorKind> kinds(t.chunks, common::TensorKind::kUnspecified);
  auto on_next = [](schedule::Hop hop, bool along) {
    return hop == (along ? schedule::Hop::kNext : schedule::Hop::kPrev);
  };
  for (int chunk = 0; chunk < t.chunks; ++chunk) {
    const int j = t.Virtual(c.stage, chunk);
    if (j > 0 && t.HopAfter(j - 1) != schedule::Hop::kSelf &&
        on_next(t.HopAfter(j - 1), false) == next_link) {
      kinds[chunk] = common::TensorKind::kActivation;
    }
    if (j < t.Last() && t.HopAfter(j) != schedule::Hop::kSelf &&
        on_next(t.HopAfter(j), true) == next_link) {
      kinds[chunk] = common::TensorKind::kGradient;
    }
  }
  return kinds;
}

}  // namespace

PeerLinkOptions DownstreamLinkOptions(const JobConfig& c) {
  PeerLinkOptions o;
  o.job_id = c.job_id;
  o.local_stage = c.stage;
  o.peer_stage = (c.stage + 1) % c.num_stages;
  o.peer_address = c.downstream_address;
  o.frame_bytes = c.frame_bytes;
  o.limits = LinkLimits(c.model, c.micro_batch_size, c.precision.activations);
  o.receive_kinds = ReceiveKinds(c, /*next_link=*/true);
  return o;
}

PeerLinkOptions UpstreamLinkOptions(const JobConfig& c) {
  PeerLinkOptions o = DownstreamLinkOptions(c);
  o.peer_stage = (c.stage + c.num_stages - 1) % c.num_stages;
  o.peer_address = c.upstream_address;
  o.receive_kinds = ReceiveKinds(c, /*next_link=*/false);
  return o;
}

}  // namespace pipetrain::stage_server
