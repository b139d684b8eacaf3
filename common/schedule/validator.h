// Proves a schedule is runnable before any stage runs it: each (stage, micro-batch,
// chunk) does its forward once and its backward once after it, every send has exactly
// one matching receive, no deadlock, and the in-flight activations stay in bound.
// Forward-only (evaluation) programs do each forward once and nothing but forwards and
// their activation sends and receives. The stage server runs this on every program it
// is handed.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/schedule/stage_program.h"

namespace pipetrain::schedule {

struct ValidateOptions {
  // Lowered programs carry their sends and receives and are executed with blocking
  // receives; compute-only programs (before lowering) must have none, and their
  // cross-stage order is checked from the data dependencies directly.
  bool lowered = true;
};

// OK, or InvalidArgument whose message names the offending stage, position and action
// ("stage 2 position 5 (F3)") and ends with the position-by-stage table of the schedule,
// offending cells in [brackets]. A position is an action's index in its stage's program
// ("step" is only ever a training step).
absl::Status Validate(const Schedule& schedule, const ValidateOptions& options = {});

// A cell of a schedule: programs[stage].actions[position].
struct Cell {
  int stage = 0;
  int position = 0;
};

// Checks one stage's program on its own, as a stage server can when it receives it:
// its header, every action in range and in order, each of its forwards and backwards
// done once, the sends and receives its place in the pipeline needs, and its in-flight
// bound. Matching sends with the peers' receives and deadlock need every program:
// Validate. Errors have the same form as Validate's, with this stage's row.
absl::Status ValidateProgram(const StageProgram& program, const ValidateOptions& options = {});

// One row per stage, one column per position, marked cells in [brackets].
std::string RenderTable(const Schedule& schedule, const std::vector<Cell>& marked = {});

// Most activations stage `stage`'s program holds at once (forward done, backward or its
// weight part not yet), counting each chunk separately. A forward-only program keeps
// nothing past a forward, so it holds one (the micro-batch being forwarded) at most.
int PeakInFlight(const StageProgram& program);

}  // namespace pipetrain::schedule
