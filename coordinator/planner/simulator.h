// Predicts a step from lowered programs and per-action costs: the timeline of every
// stage, step time, bubble fraction and peak activation memory. Receives block until
// the data arrives, then take recv_busy_s; a send occupies the sender for send_busy_s
// and arrives the link's transfer time after it starts (a tensor may arrive before the
// sender is done with it; links run in parallel, with no contention between messages).
// With data-parallel replicas, each stage's gradient all-reduce runs on a lane of its own
// from the end of its last backward (B or W) to the start of its optimizer step. Stages
// that share a device (CostModel::device_of_stage) take turns on it: a compute action
// waits for one of its device's slots, the earliest asker first.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/stage_program.h"

namespace pipetrain::planner {

// Costs of one model chunk on one stage, per micro-batch.
struct ChunkCost {
  double forward_s = 0;
  double backward_input_s = 0;      // I; a full backward B costs recompute + I + W
  double backward_weight_s = 0;     // W
  double recompute_s = 0;           // the forward rerun before the backward, when recomputing
  double send_activation_s = 0;     // from the start of the send of this chunk's output
                                    // downstream to its arrival
  double send_gradient_s = 0;       // the same for its input gradient upstream
  double stored_bytes = 0;          // kept from the forward until the backward (or W) ends
  double backward_extra_bytes = 0;  // materialised on top while the backward runs
  // Kept from a split backward's input half (I) until its weight half (W).
  double weight_grad_bytes = 0;
  // What a send or a receive costs the stage itself: handing a tensor to the link, and
  // taking one that has arrived. 0 in the analytic model; measured ones are not.
  double send_busy_s = 0;
  double recv_busy_s = 0;
};

struct CostModel {
  std::vector<std::vector<ChunkCost>> chunks;  // [stage][chunk]
  double optimizer_s = 0;
  std::vector<double> optimizer_stage_s;  // per stage; when set, replaces optimizer_s
  // When set, the time of every compute action (F, B, I, W, OPT) of a stage, in place of
  // the figures above (a value < 0 keeps them): one draw of a run whose action times
  // vary (planner/cost_fit.h).
  std::function<double(int stage, const schedule::Action& action)> draw_compute_s;
  // Per stage, the all-reduce of its gradients between the R copies of the stage (R
  // data-parallel replicas; planner.h's RingAllReduceSeconds). Empty: one replica.
  std::vector<double> allreduce_stage_s;
  // Stages that share a device (stage servers on one GPU, or on the cores of one host):
  // per stage, the index of its device, and per device its slots, how many of its stages
  // compute at full speed at once (a GPU 1; a host its cores over a stage's threads). A
  // compute action (F, B, I, W, OPT) starts once a slot is free. Empty: every stage has
  // a device of its own.
  std::vector<int> device_of_stage;
  std::vector<int> device_slots;
};

// Forward 1, backward 2 (I 1, W 1) per stage, split evenly over v chunks; free
// transfer, no bytes: the setting of the textbook bubble formulas.
CostModel EqualStageCost(int stages, int chunks = 1);

struct TimelineEvent {
  int stage = 0;
  schedule::Action action;
  double start_s = 0;
  double end_s = 0;  // a receive lasts from when the stage starts waiting to arrival
};

// One stage's gradient all-reduce: on its own lane, from the end of the stage's last
// B or W (its gradients are final) until done; the optimizer step waits for it, while
// the stage's other actions (the last SEND_B) go on beside it.
struct ReductionEvent {
  int stage = 0;
  double start_s = 0;
  double end_s = 0;
  // The part of its time that does not lengthen the step: 1 when the reduction ends
  // before the step would have without any reduction (hidden behind other stages' tail),
  // 0 when all of it adds to the step. 0 for a reduction of no time.
  double hidden_fraction = 0;
};

struct SimulationResult {
  std::vector<TimelineEvent> events;  // every action, per stage in program order
  double step_time_s = 0;
  // 1 - compute time / (capacity * step time), the capacity being K stages, or with
  // shared devices the stages that can compute at once (per device, at most its slots).
  double bubble_fraction = 0;
  std::vector<double> busy_s;                 // compute and optimizer time per stage
  std::vector<double> peak_activation_bytes;  // per stage
  // With CostModel::allreduce_stage_s: one per stage that runs a backward, by stage.
  std::vector<ReductionEvent> reductions;
  // The step time the same run would have without any reduction (= step_time_s when
  // there is none): the optimizer step ends every program, so a reduction delays only
  // its own stage's optimizer step.
  double step_time_without_reduction_s = 0;
};

// Errors: cost model shape mismatch, or a deadlock (validate the schedule first).
absl::StatusOr<SimulationResult> Simulate(const schedule::Schedule& lowered,
                                          const CostModel& costs);

}  // namespace pipetrain::planner
