// ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): two chunks a stage in the V placement (stage s holds virtual
// stages s and 2K-1-s), the backward split into I and W, W passes filling the gaps.
// Each stage holds at most 2K chunk activations, 1F1B's K of a whole stage. A row of
// the schedule table (planner/schedule_registry.cc).
#pragma once

#include <vector>

#include "common/schedule/action.h"

namespace pipetrain::planner::generators {

// Stage `stage`'s compute actions for K stages, M >= 2K-1 micro-batches and v = 2.
std::vector<schedule::Action> ZbV(int stages, int micro_batches, int chunks, int stage);

}  // namespace pipetrain::planner::generators
