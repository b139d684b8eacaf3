#include "coordinator/metrics/step_metrics.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/schedule/stage_program.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

double MeasuredBubble(const std::vector<pb::RunStepResponse>& stages) {
  double busy = 0;
  int64_t span = 0;
  for (const pb::RunStepResponse& r : stages) {
    for (const pb::ActionTiming& t : r.timings()) {
      if (t.lane() == "compute") busy += static_cast<double>(t.end_us() - t.start_us());
      span = std::max(span, t.end_us());
    }
  }
  if (span <= 0 || stages.empty()) return 0;
  const double total = static_cast<double>(span) * static_cast<double>(stages.size());
  return std::clamp(1.0 - busy / total, 0.0, 1.0);
}

absl::StatusOr<double> MeanLoss(const std::vector<pb::RunStepResponse>& stages, int64_t step) {
  double sum = 0;
  int n = 0;
  for (const pb::RunStepResponse& r : stages) {
    for (float l : r.losses()) {
      sum += l;
      ++n;
    }
  }
  if (n == 0) {
    return absl::InternalError(
        absl::StrCat("step ", step, ": no stage returned a loss (the last stage should)"));
  }
  return sum / n;
}

absl::StatusOr<pb::StepRecord> MakeStepRecord(int64_t step,
                                              const std::vector<pb::RunStepResponse>& responses,
                                              double wall_seconds, int64_t tokens,
                                              double predicted_bubble) {
  pb::StepRecord record;
  record.set_step(step);
  absl::StatusOr<double> loss = MeanLoss(responses, step);
  if (!loss.ok()) return loss.status();
  record.set_loss(*loss);
  record.set_step_time_s(wall_seconds);
  record.set_tokens_per_s(wall_seconds > 0 ? static_cast<double>(tokens) / wall_seconds : 0);
  record.set_bubble_measured(MeasuredBubble(responses));
  record.set_bubble_predicted(predicted_bubble);
  for (size_t s = 0; s < responses.size(); ++s) {
    const pb::RunStepResponse& r = responses[s];
    pb::StageStepStats* st = record.add_stages();
    st->set_stage(static_cast<int>(s));
    st->set_peak_memory_bytes(r.peak_memory_bytes());
    st->set_peak_activation_bytes(r.peak_activation_bytes());
    st->set_bytes_sent(r.bytes_sent());
    st->set_bytes_received(r.bytes_received());
    double compute_us = 0, reduce_us = 0, reduce_total_us = 0;
    for (const pb::ActionTiming& t : r.timings()) {
      if (t.lane() == "compute") compute_us += static_cast<double>(t.end_us() - t.start_us());
      reduce_us += static_cast<double>(t.reduce_us());
      reduce_total_us += static_cast<double>(t.reduce_total_us());
    }
    st->set_compute_s(compute_us * 1e-6);
    st->set_reduce_s(reduce_us * 1e-6);
    st->set_reduce_total_s(reduce_total_us * 1e-6);
    st->set_emulated(r.emulated());
  }
  return record;
}

std::vector<pb::TimelineEvent> TimelineOf(int64_t step,
                                          const std::vector<pb::RunStepResponse>& responses) {
  std::vector<pb::TimelineEvent> events;
  for (size_t s = 0; s < responses.size(); ++s) {
    for (const pb::ActionTiming& t : responses[s].timings()) {
      pb::TimelineEvent& e = events.emplace_back();
      e.set_step(step);
      e.set_stage(static_cast<int>(s));
      *e.mutable_action() = t.action();
      e.set_lane(t.lane());
      e.set_start_us(t.start_us());
      e.set_end_us(t.end_us());
      e.set_bytes(t.bytes());
      e.set_recompute_us(t.recompute_us());
      e.set_reduce_us(t.reduce_us());
      e.set_reduce_total_us(t.reduce_total_us());
    }
  }
  return events;
}

std::vector<pb::TimelineEvent> PredictedTimelineOf(int64_t step,
                                                   const planner::SimulationResult& simulated) {
  const auto us = [](double s) { return static_cast<int64_t>(std::llround(s * 1e6)); };
  std::map<int, const planner::ReductionEvent*> reduction;  // by stage
  for (const planner::ReductionEvent& r : simulated.reductions) reduction[r.stage] = &r;
  std::vector<pb::TimelineEvent> events;
  events.reserve(simulated.events.size());
  for (const planner::TimelineEvent& t : simulated.events) {
    pb::TimelineEvent& e = events.emplace_back();
    e.set_step(step);
    e.set_stage(t.stage);
    *e.mutable_action() = schedule::ActionToProto(t.action);
    e.set_lane(schedule::IsCommunication(t.action.kind) ? "link" : "compute");
    e.set_start_us(us(t.start_s));
    e.set_end_us(us(t.end_s));
    const auto r = reduction.find(t.stage);
    if (t.action.kind == schedule::ActionKind::kOptimizerStep && r != reduction.end()) {
      const planner::ReductionEvent& red = *r->second;
      e.set_reduce_total_us(us(red.end_s - red.start_s));
    }
  }
  return events;
}

}  // namespace pipetrain::coordinator
