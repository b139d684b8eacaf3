// Activation recomputation: the modes a job spec names (pipeline.recompute) in one
// table, and the one rule per mode that says which chunk of which stage re-runs its
// forward before its backward. The planner predicts memory from it and the coordinator
// sends each stage its own yes/no per chunk; no other place decides.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "pipetrain/v1/schedule.pb.h"

namespace pipetrain::planner {

struct RecomputeEntry {
  pipetrain::v1::RecomputeMode mode;
  const char* name;         // as pipeline.recompute and `pipetrain plan --recompute` take it
  const char* description;  // one line
  // Whether chunk `chunk` of stage `stage` (of K stages) recomputes.
  bool (*recomputes)(int stage, int chunk, int stages);
};

// Every mode, in the order help and error messages list them.
absl::Span<const RecomputeEntry> RecomputeTable();

// "never" (or empty), "always", "except-last"; errors name pipeline.recompute and list
// the names.
absl::StatusOr<pipetrain::v1::RecomputeMode> ParseRecompute(absl::string_view name);
// The mode's name; "never" for RECOMPUTE_UNSPECIFIED (and any value not in the table).
std::string RecomputeName(pipetrain::v1::RecomputeMode mode);
// "never, always or except-last".
std::string RecomputeNameList();
// One line per mode: its name and description, for --help.
std::string RecomputeHelp();

// Per stage, per chunk: whether that chunk recomputes, for K stages of v chunks each.
// except-last spares every chunk of the last stage (stage K-1), also with interleaved
// chunks, where only its last chunk holds the last virtual stage: the rule has always
// been per stage, and the stages' measured memory is tested against it.
std::vector<std::vector<bool>> ResolveRecompute(pipetrain::v1::RecomputeMode mode, int stages,
                                                int chunks);

}  // namespace pipetrain::planner
