// GPipe (Huang et al., 2019), fill-drain: every forward, then every backward. A row of
// the schedule table (planner/schedule_registry.cc).
#pragma once

#include <vector>

#include "common/schedule/action.h"

namespace pipetrain::planner::generators {

// Stage `stage`'s compute actions for K stages and M micro-batches (v = 1).
std::vector<schedule::Action> Gpipe(int stages, int micro_batches, int chunks, int stage);

}  // namespace pipetrain::planner::generators
