#include "client/costs_from.h"

#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/error_context.h"
#include "common/status_macros.h"

namespace pipetrain::client {

namespace pb = ::pipetrain::v1;

absl::StatusOr<MeasuredJob> MeasuredJobFrom(const pb::JobStatus& job, const pb::Timeline& timeline) {
  const std::string& id = job.job_id();
  absl::StatusOr<planner::PlanOptions> options = planner::OptionsFromJobSpec(job.spec());
  if (!options.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--costs-from ", id, ": its spec: ", options.status().message()));
  }
  absl::StatusOr<planner::Plan> plan = planner::MakePlan(*options);
  if (!plan.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--costs-from ", id, ": planning it again: ", plan.status().message()));
  }
  std::map<int64_t, std::vector<pb::TimelineEvent>> steps;
  for (const pb::TimelineEvent& e : timeline.events()) steps[e.step()].push_back(e);
  if (steps.size() > 1) steps.erase(1);  // warming up links and pools
  if (steps.empty()) {
    const pb::MeasuredCostRates& r = job.measured_costs();
    if (!job.has_measured_costs() || r.steps() == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--costs-from ", id, ": the coordinator has no timeline of it and no measured costs "
          "recorded with it (no step has finished yet, or it ran before this version)"));
    }
    planner::CostRates rates;
    rates.forward_s_per_flop = r.forward_s_per_flop();
    rates.backward_input_s_per_flop = r.backward_input_s_per_flop();
    rates.backward_weight_s_per_flop = r.backward_weight_s_per_flop();
    rates.optimizer_s_per_param = r.optimizer_s_per_param();
    rates.send_busy_s = r.send_busy_s();
    rates.recv_busy_s = r.recv_busy_s();
    rates.transfer_s_per_byte = r.transfer_s_per_byte();
    rates.steps = r.steps();
    return MeasuredJob{*std::move(plan), planner::MeasuredCosts(options->stages, options->chunks),
                       rates, r.first_step(), r.last_step(), /*from_record=*/true};
  }
  const schedule::Placement placement = planner::PlacementOf(*options);
  MeasuredJob out{*std::move(plan), planner::MeasuredCosts(options->stages, options->chunks,
                                                           static_cast<int>(steps.size()),
                                                           placement),
                  {}, steps.begin()->first, steps.rbegin()->first};
  for (const auto& [step, events] : steps) {
    if (absl::Status s = out.costs.AddStep(events); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--costs-from ", id, ": ", s.message()));
    }
  }
  ASSIGN_OR_RETURN(out.rates, common::ErrorContext(absl::StrCat("--costs-from ", id))
                                  .Wrap(planner::RatesFromMeasured(out.plan, out.costs)));
  return out;
}

absl::StatusOr<planner::Plan> PlanWithMeasuredCosts(planner::PlanOptions options,
                                                    const MeasuredJob& measured) {
  options.rates = measured.rates;
  ASSIGN_OR_RETURN(planner::Plan plan, planner::MakePlan(options));
  const planner::PlanOptions& m = measured.plan.options;
  const bool same = options.model == m.model && options.stages == m.stages &&
                    options.micro_batches == m.micro_batches && options.chunks == m.chunks &&
                    options.schedule == m.schedule && options.recompute == m.recompute &&
                    options.batch_size == m.batch_size && options.replicas == m.replicas &&
                    options.partition == m.partition;
  if (same && measured.costs.steps() > 0) {
    plan.costs = measured.costs.Fit(plan.costs);
    ASSIGN_OR_RETURN(plan.simulation, planner::Simulate(plan.programs, plan.costs));
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      plan.stages[s].peak_activation_bytes = plan.simulation.peak_activation_bytes[s];
    }
  }
  return plan;
}

std::string DescribeMeasured(const std::string& job_id, const MeasuredJob& m) {
  const planner::PlanOptions& o = m.plan.options;
  return absl::StrFormat(
      "Costs measured on %s (steps %d-%d%s: %d stages, %s, %d micro-batches): forward %.3g "
      "GFLOP/s, backward %.3g (input) and %.3g (weight) GFLOP/s, links %.3g MB/s, %.3g ms a "
      "send, %.3g ms a receive, optimizer %.3g ns a parameter\n",
      job_id, m.first_step, m.last_step, m.from_record ? ", as recorded with the job" : "",
      o.stages, planner::ScheduleName(o.schedule),
      o.micro_batches, m.rates.forward_s_per_flop > 0 ? 1e-9 / m.rates.forward_s_per_flop : 0,
      m.rates.backward_input_s_per_flop > 0 ? 1e-9 / m.rates.backward_input_s_per_flop : 0,
      m.rates.backward_weight_s_per_flop > 0 ? 1e-9 / m.rates.backward_weight_s_per_flop : 0,
      m.rates.transfer_s_per_byte > 0 ? 1e-6 / m.rates.transfer_s_per_byte : 0,
      m.rates.send_busy_s * 1e3, m.rates.recv_busy_s * 1e3, m.rates.optimizer_s_per_param * 1e9);
}

}  // namespace pipetrain::client
