// Megatron-LM's interleaved 1F1B (Narayanan et al., 2021) with v model chunks per stage:
// 1F1B over the K x v virtual stages, micro-batches going round in groups of K. A row
// of the schedule table (planner/schedule_registry.cc).
#pragma once

#include <vector>

#include "common/schedule/action.h"

namespace pipetrain::planner::generators {

// Stage `stage`'s compute actions for K stages, M micro-batches (a multiple of K) and
// v >= 2 chunks, placed looped (chunk c of stage s is virtual stage cK + s).
std::vector<schedule::Action> Interleaved(int stages, int micro_batches, int chunks, int stage);

}  // namespace pipetrain::planner::generators
