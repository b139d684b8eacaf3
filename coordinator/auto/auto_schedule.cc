#include "coordinator/auto/auto_schedule.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/transformer_config.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/planner/recompute_policy.h"
#include "coordinator/planner/schedule_registry.h"
#include "coordinator/stages/stage_costs.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

// The plan a user who names nothing gets on `devices` stages: 1f1b, K = the devices (at
// most the model's layers), M = K (or the largest divisor of the batch below it), no
// recompute. Its predicted step, or 0 when it does not fit.
double DefaultPlanStep(planner::PlanOptions o, int devices) {
  o.stages = std::min(devices, o.model.num_pipeline_layers());
  o.replicas = 1;
  o.micro_batches = 1;
  for (int m = o.stages; m >= 1; --m) {
    if (o.batch_size % m == 0) {
      o.micro_batches = m;
      break;
    }
  }
  o.schedule = planner::ScheduleKind::kOneFOneB;
  o.chunks = 1;
  o.recompute = pb::RECOMPUTE_NEVER;
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(o);
  return plan.ok() ? plan->simulation.step_time_s : 0;
}

void WriteShape(const planner::PlanOptions& o, pb::PipelineSpec& p) {
  p.set_stages(o.stages);
  p.set_replicas(o.replicas);
  p.set_micro_batches(o.micro_batches);
  p.set_schedule(planner::ScheduleName(o.schedule));
  p.set_chunks(o.chunks);
  p.set_recompute(planner::RecomputeName(o.recompute));
}

std::string Reason(const planner::AutoResult& result, double default_step_s) {
  const planner::Candidate& best = result.best();
  std::string reason = absl::StrFormat("shortest predicted step of %d plans that fit",
                                       result.ranked.size());
  if (result.ranked.size() > 1) {
    const planner::Candidate& next = result.ranked[1];
    absl::StrAppend(&reason, absl::StrFormat("; next %s at %.4g s (%+.1f%%)",
                                             planner::DescribeShape(next.options), next.step_s,
                                             100 * (next.step_s / best.step_s - 1)));
  }
  if (default_step_s > 0) {
    absl::StrAppend(&reason, absl::StrFormat("; the default 1f1b M=K plan %.4g s (%.2fx)",
                                             default_step_s, default_step_s / best.step_s));
  } else {
    absl::StrAppend(&reason, "; the default 1f1b M=K plan does not fit");
  }
  if (!result.refused.empty()) {
    absl::StrAppend(&reason, "; ", result.refused.size(), " did not fit the stages' memory "
                                                          "or shape");
  }
  return reason;
}

}  // namespace

void AddRuntimeCosts(const std::vector<pb::JobStatus>& recent, AutoCosts& costs) {
  if (!costs.rates) return;
  for (const pb::JobStatus& job : recent) {
    const pb::MeasuredCostRates& r = job.measured_costs();
    if (!job.has_measured_costs() || r.steps() == 0) continue;
    costs.rates->send_busy_s = r.send_busy_s();
    costs.rates->recv_busy_s = r.recv_busy_s();
    if (r.transfer_s_per_byte() > 0) costs.rates->transfer_s_per_byte = r.transfer_s_per_byte();
    absl::StrAppend(&costs.source, "; sends, receives and the wire as ", job.job_id(),
                    " measured them");
    return;
  }
}

uint64_t RingCalibrationBytes(const pb::JobSpec& spec) {
  constexpr uint64_t kMin = 1 << 20, kMax = 64 << 20;
  absl::StatusOr<planner::PlanOptions> o = planner::OptionsFromJobSpec(WithPlaceholderShape(spec));
  if (!o.ok()) return kMin;
  double params = 0;
  for (int l = 0; l < o->model.num_pipeline_layers(); ++l) {
    params += static_cast<double>(model::ParamsOfLayer(o->model, l));
  }
  const double bytes = std::clamp(planner::GradientBytesPerParam() * params,
                                  static_cast<double>(kMin), static_cast<double>(kMax));
  return static_cast<uint64_t>(bytes) / 4 * 4;
}

uint64_t TransferCalibrationBytes(const pb::JobSpec& spec, int rows) {
  constexpr double kMin = 4 << 10, kMax = 64 << 20;
  absl::StatusOr<planner::PlanOptions> o = planner::OptionsFromJobSpec(WithPlaceholderShape(spec));
  if (!o.ok()) return static_cast<uint64_t>(kMin);
  const double wire = static_cast<double>(planner::PrecisionBytesOf(*o).activation_wire) /
                      static_cast<double>(common::DTypeSize(common::DType::kF32));
  const double tokens = static_cast<double>(std::max(1, rows)) * o->model.seq_len;
  // Pipeline layer 1, the first block: every block's output is the same (fp32's bytes).
  const double bytes = model::CostOfLayer(o->model, 1).output_bytes * wire * tokens;
  return static_cast<uint64_t>(std::clamp(bytes, kMin, kMax)) / 4 * 4;
}

double RingRateFromTime(double bytes, int members, double seconds) {
  const double sent = 2.0 * (members - 1) / std::max(1, members) * bytes;
  if (seconds <= 0 || sent <= 0) return kFreeCollectiveRate;
  const double moving = std::max(seconds - planner::kAllReduceCallLatencyS, seconds / 2);
  return std::min(kFreeCollectiveRate, sent / moving);
}

int CalibrationRows(const pb::JobSpec& spec, int devices) {
  return std::max(1, spec.training().batch_size() / std::max(1, 2 * devices));
}

absl::StatusOr<AutoChoice> ChooseAutoPlan(const pb::JobSpec& spec,
                                          const std::vector<pb::DeviceInfo>& devices,
                                          const AutoCosts& costs) {
  if (devices.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pipeline.schedule \"", kAutoSchedule, "\": no free stage server to plan for; start "
        "stages (pipetrain-stage --coordinator ...) or name a schedule and pipeline.stages"));
  }
  ASSIGN_OR_RETURN(planner::PlanOptions base, planner::OptionsFromJobSpec(WithPlaceholderShape(spec)));
  SetCostsFromDevices(devices, base);
  if (costs.rates) {
    base.rates = *costs.rates;
    // The rates are the first stage's (its device calibrated): the others' speeds are
    // against it.
    if (!base.server_speed.empty()) {
      const double first = base.server_speed.front();
      for (double& v : base.server_speed) v /= first;
    }
    // A calibration times compute only; the wire keeps the devices' link rate unless a
    // job measured it (AddRuntimeCosts).
    if (base.rates->transfer_s_per_byte == 0) {
      base.rates->transfer_s_per_byte = 1.0 / base.link_bytes_per_s;
    }
  }
  // The replicas' all-reduce at the rate a ring of these stages was timed at, else the
  // link's: a ring's bandwidth is not what a pipeline's one-tensor transfers measure
  // (taking it from them made "auto" slower in pipetrain-bench autoplan).
  if (costs.collective_bytes_per_s) base.collective_bytes_per_s = *costs.collective_bytes_per_s;
  const int n = static_cast<int>(devices.size());
  ASSIGN_OR_RETURN(const planner::AutoResult result,
                   planner::SearchPlans(base, {.max_devices = n}));
  const planner::Candidate& best = result.best();
  const double default_step_s = DefaultPlanStep(base, n);
  AutoChoice choice;
  choice.spec = spec;
  WriteShape(best.options, *choice.spec.mutable_pipeline());
  pb::AutoPlan& r = choice.record;
  r.set_shape(planner::DescribeShape(best.options));
  r.set_reason(Reason(result, default_step_s));
  r.set_predicted_step_s(best.step_s);
  r.set_predicted_bubble(best.bubble);
  r.set_candidates(static_cast<int>(result.ranked.size()));
  r.set_refused(static_cast<int>(result.refused.size()));
  r.set_cost_source(costs.source);
  r.set_default_step_s(default_step_s);
  choice.log.push_back(absl::StrFormat(
      "auto plan: %s on %d of %d free stages, predicted step %.4g s (bubble %.3f), costs %s",
      r.shape(), best.devices(), n, best.step_s, best.bubble, costs.source));
  choice.log.push_back(absl::StrCat("auto plan: why: ", r.reason()));
  return choice;
}

}  // namespace pipetrain::coordinator
