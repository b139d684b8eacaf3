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
// With replicas, a "reduce" row under each stage shows its gradient all-reduce (AR).
std::string RenderPicture(const SimulationResult& simulation, int stages, int max_columns = 160);

std::string RenderPlanText(const Plan& plan);

// Keys: schedule, replicas, stages[] (stage, layers[][first, end), params, state_bytes,
// table_bytes, peak_activation_bytes, peak_memory_bytes, max_in_flight, recompute, allreduce_bytes,
// allreduce_s, allreduce_hidden_fraction: 0, 0, 0 with one replica; shared_device: the
// name of a device other stage servers share, or ""; device_slowdown; speed), device_sharing
// (Plan::sharing), step_time_s,
// step_time_without_allreduce_s, bubble_fraction, textbook_bubble,
// peak_activation_bytes[], time_unit, device_flops, link_bytes_per_s,
// collective_bytes_per_s.
std::string PlanJson(const Plan& plan);

// Chrome trace event format: pid = stage, ph "X" events in microseconds, and a
// process_name metadata event per stage. Receives appear only when they waited. A
// stage's gradient all-reduce is on its own thread (tid 1, "all-reduce").
std::string ChromeTrace(const SimulationResult& simulation, int stages);

}  // namespace pipetrain::planner
