// 1F1B, PipeDream-Flush (Narayanan et al., 2021): warm-up forwards, then one forward and
// one backward in turn, then the remaining backwards. A row of the schedule table
// (planner/schedule_registry.cc).
#pragma once

#include <vector>

#include "common/schedule/action.h"

namespace pipetrain::planner::generators {

// Stage `stage`'s compute actions for K stages and M micro-batches (v = 1).
std::vector<schedule::Action> OneFOneB(int stages, int micro_batches, int chunks, int stage);

}  // namespace pipetrain::planner::generators
