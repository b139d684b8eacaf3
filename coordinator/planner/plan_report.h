// How a plan is shown: the terminal picture of a timeline (one row per stage, one
// column per time slot, idle slots as '.', like the GPipe paper's figures), the plan as
// text and as one JSON object, and the timeline as Chrome trace JSON for Perfetto.
#pragma once

#include <string>

#include "coordinator/planner/planner.h"
#include "coordinator/planner/simulator.h"

namespace pipetrain::planner {

// One slot is the shortest compute action; an action longer than that fills as many
// slots as it lasts, each showing its label. Wide timelines are scaled to <= max_columns.
std::string RenderPicture(const SimulationResult& simulation, int stages, int max_columns = 160);

std::string RenderPlanText(const Plan& plan);

// Keys: schedule, stages[] (stage, layers[][first, end), params, state_bytes,
// peak_activation_bytes, peak_memory_bytes, max_in_flight, recompute), step_time_s,
// bubble_fraction, textbook_bubble, peak_activation_bytes[], time_unit, device_flops,
// link_bytes_per_s.
std::string PlanJson(const Plan& plan);

// Chrome trace event format: pid = stage, ph "X" events in microseconds, and a
// process_name metadata event per stage. Receives appear only when they waited.
std::string ChromeTrace(const SimulationResult& simulation, int stages);

}  // namespace pipetrain::planner
