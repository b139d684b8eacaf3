// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's order with the
// backward split into I (input gradient, on the critical path) and W (weight gradient),
// W deferred into the bubbles. A row of the schedule table (planner/schedule_registry.cc).
#pragma once

#include <vector>

#include "common/schedule/action.h"

namespace pipetrain::planner::generators {

// Stage `stage`'s compute actions for K stages and M micro-batches (v = 1).
std::vector<schedule::Action> ZbH1(int stages, int micro_batches, int chunks, int stage);

}  // namespace pipetrain::planner::generators
