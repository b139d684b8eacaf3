#include "coordinator/planner/generators.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::planner {
namespace {

// "only interleaved uses model chunks": the chunked schedules, from the table.
std::string OnlyChunkedUseChunks() {
  std::vector<std::string> names;
  for (const ScheduleEntry& e : ScheduleTable()) {
    if (e.chunked) names.emplace_back(e.name);
  }
  return absl::StrCat("only ", absl::StrJoin(names, " and "), names.size() == 1 ? " uses" : " use",
                      " model chunks");
}

absl::Status CheckRanges(int k, int m, int v) {
  if (k < 1 || k > kMaxStages) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.stages must be in 1..", kMaxStages, " (got ", k, ")"));
  }
  if (m < 1 || m > kMaxMicroBatches) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.micro_batches must be in 1..", kMaxMicroBatches, " (got ", m, ")"));
  }
  if (v > kMaxChunks) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.chunks must be at most ", kMaxChunks, " (got ", v, ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckChunks(const ScheduleEntry& e, int v) {
  if (e.chunked && v < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.chunks must be >= 2 for the ", e.name, " schedule (got ", v, ")"));
  }
  if (!e.chunked && v != 1) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline.chunks must be 1 for the ", e.name,
                                                   " schedule (got ", v, "); ",
                                                   OnlyChunkedUseChunks()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckShape(ScheduleKind kind, int k, int m, int v) {
  if (absl::Status s = CheckRanges(k, m, v); !s.ok()) return s;
  const ScheduleEntry& e = EntryOf(kind);
  if (absl::Status s = CheckChunks(e, v); !s.ok()) return s;
  return e.check_shape ? e.check_shape(e.name, k, m, v) : absl::OkStatus();
}

schedule::StageProgram EmptyProgram(absl::string_view schedule, int s, int k, int m, int v) {
  schedule::StageProgram p;
  p.stage = s;
  p.num_stages = k;
  p.num_micro_batches = m;
  p.num_chunks = v;
  p.schedule = std::string(schedule);
  return p;
}

absl::StatusOr<schedule::Schedule> Generate(ScheduleKind kind, int k, int m, int v) {
  if (absl::Status s = CheckShape(kind, k, m, v); !s.ok()) return s;
  const ScheduleEntry& e = EntryOf(kind);
  schedule::Schedule out;
  for (int s = 0; s < k; ++s) {
    schedule::StageProgram& p = out.emplace_back(EmptyProgram(e.name, s, k, m, v));
    p.max_in_flight = e.in_flight_bound(k, m, v, s);
    p.placement = e.placement;
    p.actions = e.stage_order(k, m, v, s);
    p.actions.push_back(schedule::OptimizerStep());
  }
  return out;
}

}  // namespace pipetrain::planner
