// DualPipe-V (DeepSeek's DualPipe "cut in half", 2025): the V placement of ZB-V with
// DualPipe's order: after the fill, each step pairs a forward of one chunk with a full
// backward of the other (F0 B1 F1 B0), which DualPipe overlaps on the device; the
// backward is split into I and W only at the two ends of the step, where the W passes
// fill what would idle. A row of the schedule table (planner/schedule_registry.cc).
#pragma once

#include <vector>

#include "common/schedule/action.h"

namespace pipetrain::planner::generators {

// Stage `stage`'s compute actions for K stages, M >= 2K-1 micro-batches and v = 2.
std::vector<schedule::Action> DualPipeV(int stages, int micro_batches, int chunks, int stage);

}  // namespace pipetrain::planner::generators
