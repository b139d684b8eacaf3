// Where each stage's time goes in a measured timeline (GetTimeline): per step and per
// stage, the seconds in forward, backward (B, I, W), recompute, optimizer, sending,
// waiting to receive and idle, adding up to the step time, and their mean over the
// steps given. Pure: a Timeline in, numbers out; `pipetrain timeline --breakdown`
// prints them as a table or JSON.
//
// How time is attributed, per (step, stage):
//  - The step time is the longest span over the stages: the largest end_us of any
//    event of the step (as coordinator/metrics/step_metrics.cc's MeasuredBubble counts it), so
//    a stage that finished early is idle until the slowest one ends.
//  - A B or I event's first recompute_us (clamped to its length) is recompute, the
//    rest backward / backward input; so B and I exclude the recompute. Likewise an
//    OPT event's first reduce_us is allreduce (the data-parallel replicas' averaging
//    it waited for), the rest optimizer.
//  - Every instant of [0, step time) goes to exactly one category: the first active
//    one in the order forward, backward, input, weight, recompute, optimizer, send,
//    recv-wait, else idle. Overlapping events (the executor runs one action at a time,
//    so they should not occur) are thus counted once, never twice, and idle is never
//    negative: the categories add up to the step time exactly (in microseconds).
//  - Events are clamped to [0, step time]; a stage with no event in a step that other
//    steps have is idle for that whole step.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::client {

// In the order of the table's columns (also the attribution order above).
enum class TimeCategory {
  kForward,
  kBackward,        // full B, less its recompute
  kBackwardInput,   // I, less its recompute
  kBackwardWeight,  // W
  kRecompute,       // the forward re-run at the start of B or I
  kAllReduce,       // the replicas' gradient averaging the OPT waited for, at its start
  kOptimizer,
  kSend,      // SEND_* action time
  kRecvWait,  // RECV_* action time: waiting for the neighbour's tensor
  kIdle,      // the rest of the step
};
inline constexpr int kNumTimeCategories = 10;
inline constexpr std::array<TimeCategory, kNumTimeCategories> kAllTimeCategories = {
    TimeCategory::kForward,        TimeCategory::kBackward,  TimeCategory::kBackwardInput,
    TimeCategory::kBackwardWeight, TimeCategory::kRecompute, TimeCategory::kAllReduce,
    TimeCategory::kOptimizer,      TimeCategory::kSend,      TimeCategory::kRecvWait,
    TimeCategory::kIdle};

// The JSON name ("forward", "backward", "backward_input", "backward_weight",
// "recompute", "allreduce", "optimizer", "send", "recv_wait", "idle"; seconds add
// "_s") and the table's column ("forward", "backward", "input", "weight", "recompute",
// "allreduce", "optimizer", "send", "recv-wait", "idle").
absl::string_view TimeCategoryName(TimeCategory c);
absl::string_view TimeCategoryColumn(TimeCategory c);

struct StageTimes {
  int stage = 0;
  std::array<double, kNumTimeCategories> seconds{};  // indexed by TimeCategory
  // All of the replicas' averaging (reduce_total_us), hidden behind the backward or not:
  // seconds[kAllReduce] is the part that was not.
  double allreduce_total_s = 0;
  // The share of allreduce_total_s the step did not wait for (0 without averaging).
  double AllReduceHidden() const;

  double& operator[](TimeCategory c) { return seconds[static_cast<int>(c)]; }
  double operator[](TimeCategory c) const { return seconds[static_cast<int>(c)]; }
  double Total() const;  // every category: the step time
};

struct StepBreakdown {
  int64_t step = 0;
  double step_time_s = 0;
  std::vector<StageTimes> stages;  // by ascending stage
};

struct TimelineBreakdown {
  std::string job_id;
  std::vector<StepBreakdown> steps;  // by ascending step
  double step_time_s = 0;            // mean over the steps
  std::vector<StageTimes> stages;    // mean over the steps, by ascending stage
};

// seconds / step_time_s; 0 when the step took no time.
double ShareOfStep(double seconds, double step_time_s);

// Errors (INVALID_ARGUMENT, naming the job): a timeline without events (no step has
// finished yet); an event with a negative stage or an action kind this build does not
// know (naming its step, stage and index).
absl::StatusOr<TimelineBreakdown> BreakDownTimeline(const pipetrain::v1::Timeline& timeline);

// A first line naming the job, the steps averaged and the mean step time, then a
// header and one row per stage: each category as time and share, e.g. "12.3 ms  41%";
// with data-parallel replicas a last line per stage: its averaging and how much of
// it was hidden.
std::string BreakdownTable(const TimelineBreakdown& breakdown);

// {"job_id", "steps": [...], "step_time_s", "stages": [{"stage", "forward_s", ...,
// "idle_s", "allreduce_total_s", "allreduce_hidden", "shares": {"forward", ...,
// "idle"}}]}: the means over the steps.
std::string BreakdownJson(const TimelineBreakdown& breakdown);

}  // namespace pipetrain::client
