// A stage's program (its ordered actions plus the pipeline's shape) and a Schedule, one
// program per stage; conversion to and from the proto StageProgram, the multi-line text
// form used by golden files, and the chunk topology every pass agrees on.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/action.h"
#include "common/schedule/topology.h"
#include "pipetrain/v1/schedule.pb.h"

namespace pipetrain::schedule {

struct StageProgram {
  int stage = 0;
  int num_stages = 1;         // K
  int num_micro_batches = 1;  // M
  int num_chunks = 1;         // v: model chunks per stage (interleaved), else 1
  std::string schedule;       // generator name, for display
  std::vector<Action> actions;
  // Most micro-batch activations (counted per chunk) this stage may hold at once, from
  // a forward until its backward (or its weight-gradient part) is done; 0 = unchecked.
  int max_in_flight = 0;
  // Evaluation: forwards with their sends and receives only (no backward, gradient or
  // optimizer action); the weights stay as they are and the head reports the losses.
  bool forward_only = false;
  // Where its virtual stages live (topology.h); every program of a schedule shares it.
  Placement placement = Placement::kLooped;

  Topology topology() const { return {num_stages, num_chunks, placement}; }
  bool operator==(const StageProgram&) const = default;
};

using Schedule = std::vector<StageProgram>;

pipetrain::v1::StageProgram ToProto(const StageProgram& program);
pipetrain::v1::Action ActionToProto(const Action& action);
// Rejects unknown kinds and out-of-range numbers; errors start with `field`.
absl::StatusOr<Action> ActionFromProto(const pipetrain::v1::Action& proto,
                                       absl::string_view field = "action");
// Rejects unknown action kinds and fields that do not fit in an int.
absl::StatusOr<StageProgram> FromProto(const pipetrain::v1::StageProgram& proto);

// Text form of a whole schedule:
//   schedule 1f1b stages 2 micro_batches 3 chunks 1
//   stage 0 max_in_flight 2: F0 F1 B0 F2 B1 B2 OPT
//   stage 1 max_in_flight 1: F0 B0 F1 B1 F2 B2 OPT
// A forward-only schedule ends its header line with the word `forward_only` (every
// program of a schedule shares the header). Lines starting with '#' and blank lines
// are ignored. Parse(ToText(s)) == s. A placement other than looped follows `chunks V`
// as `placement v`.
std::string ToText(const Schedule& schedule);
absl::StatusOr<Schedule> ParseScheduleText(absl::string_view text);

}  // namespace pipetrain::schedule
