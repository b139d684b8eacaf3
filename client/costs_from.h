// `pipetrain plan --costs-from JOB_ID`: the costs a job measured (its latest steps'
// timelines, fitted by planner/cost_fit.h) turned into what a plan of another shape of
// the same model on the same hardware uses. Pure: the verb fetches the job and its
// timeline from the coordinator and hands them here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/planner/cost_fit.h"
#include "coordinator/planner/planner.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

struct MeasuredJob {
  planner::Plan plan;  // the measured job's own plan
  planner::MeasuredCosts costs;
  planner::CostRates rates;
  int64_t first_step = 0, last_step = 0;  // the steps measured
  // True when the rates are the ones stored with the job (JobStatus.measured_costs)
  // because the coordinator has no timeline of it any more: no per-chunk figures then.
  bool from_record = false;
};

// From the job's timeline (its latest steps, kept in the coordinator's memory), else
// from the rates stored with it (`measured_costs`, every 20 steps and at its end).
// Errors name the job: nothing measured (no step has finished), a spec the planner
// refuses, a timeline that does not fit the job's shape. The job's first step warms up
// and is left out when others are there.
absl::StatusOr<MeasuredJob> MeasuredJobFrom(const pipetrain::v1::JobStatus& job,
                                            const pipetrain::v1::Timeline& timeline);

// Plans `options` with the measured job's costs: its per-chunk measurements where the
// shape (model, stages, micro-batches, chunks, schedule, recompute, batch) is the same,
// else its rates per FLOP, byte and parameter.
absl::StatusOr<planner::Plan> PlanWithMeasuredCosts(planner::PlanOptions options,
                                                    const MeasuredJob& measured);

// One line on where the costs come from, for the plan's text output.
std::string DescribeMeasured(const std::string& job_id, const MeasuredJob& measured);

}  // namespace pipetrain::client
