#include "coordinator/planner/forward_only.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/schedule/validator.h"
#include "common/status_macros.h"
#include "coordinator/planner/generators.h"
#include "coordinator/planner/lowering.h"

namespace pipetrain::planner {
namespace {

absl::Status CheckRange(const char* field, int value, int max) {
  if (value >= 1 && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be in 1..", max, " (got ", value, ")"));
}

}  // namespace

absl::StatusOr<schedule::Schedule> ForwardOnlySchedule(int k, int m, int v,
                                                       schedule::Placement placement) {
  RETURN_IF_ERROR(CheckRange("pipeline.stages", k, kMaxStages));
  RETURN_IF_ERROR(CheckRange("pipeline.micro_batches", m, kMaxMicroBatches));
  RETURN_IF_ERROR(CheckRange("pipeline.chunks", v, kMaxChunks));
  schedule::Schedule compute_only;
  for (int s = 0; s < k; ++s) {
    schedule::StageProgram& p = compute_only.emplace_back(EmptyProgram("eval", s, k, m, v));
    p.forward_only = true;
    p.placement = placement;
    // A forward frees its activations as it ends: one micro-batch at a time.
    p.max_in_flight = 1;
    // Every stage walks the same (micro-batch, chunk) sequence, and each forward
    // depends only on one earlier in it (the previous virtual stage), so the programs
    // cannot deadlock (in either placement: the chain of a (chunk, micro-batch) only
    // ever goes back to an earlier one).
    for (int first = 0; first < m; first += k) {
      const int end = std::min(first + k, m);
      for (int c = 0; c < v; ++c) {
        for (int mb = first; mb < end; ++mb) p.actions.push_back(schedule::Forward(mb, c));
      }
    }
  }
  schedule::Schedule lowered = Lower(compute_only);
  RETURN_IF_ERROR(schedule::Validate(lowered));
  return lowered;
}

}  // namespace pipetrain::planner
