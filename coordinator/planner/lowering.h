// The lowering pass: turns compute-only programs into programs a stage can run by
// inserting each receive right before the compute that needs it and each send right
// after the compute that produces it (sends do not block, so that order never waits).
#pragma once

#include "common/schedule/stage_program.h"

namespace pipetrain::planner {

// Chunk topology as in common/schedule/stage_program.h: virtual stage j sends
// activations to j + 1 and gradients to j - 1.
schedule::Schedule Lower(const schedule::Schedule& compute_only);

}  // namespace pipetrain::planner
