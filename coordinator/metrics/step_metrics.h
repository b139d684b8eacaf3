// Turns what the stages report for one step (losses, per-action timings, memory, bytes)
// into the job's StepRecord and timeline. Measured bubble: the share of stage time
// not spent computing, over the step as the slowest stage saw it, the same definition
// the simulator uses for its prediction.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/simulator.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"
#include "pipetrain/v1/stage.pb.h"

namespace pipetrain::coordinator {

// 1 - (compute time summed over stages) / (stages * longest stage span); 0 when no
// timings were reported.
double MeasuredBubble(const std::vector<pipetrain::v1::RunStepResponse>& stages);

// The mean of every loss the stages returned (micro-batches are of equal size).
// INTERNAL naming the step if none came back.
absl::StatusOr<double> MeanLoss(const std::vector<pipetrain::v1::RunStepResponse>& stages,
                                int64_t step);

// responses[s] is stage s's answer. tokens = batch_size * seq_len of the step.
absl::StatusOr<pipetrain::v1::StepRecord> MakeStepRecord(
    int64_t step, const std::vector<pipetrain::v1::RunStepResponse>& responses,
    double wall_seconds, int64_t tokens, double predicted_bubble);

// Every action of every stage of the step, as the timeline API returns it.
std::vector<pipetrain::v1::TimelineEvent> TimelineOf(
    int64_t step, const std::vector<pipetrain::v1::RunStepResponse>& responses);

// The simulated step as timeline events of `step`, in the measured timeline's form: sends
// and receives on the "link" lane, the rest on "compute"; seconds become microseconds.
// A simulated receive lasts from when its stage starts waiting to the arrival, as the
// stages measure it. An optimizer step carries its stage's simulated all-reduce time in
// reduce_total_us.
std::vector<pipetrain::v1::TimelineEvent> PredictedTimelineOf(
    int64_t step, const planner::SimulationResult& simulated);

}  // namespace pipetrain::coordinator
