// The automatic planner: every way to run a job on up to N stage servers (stages K,
// replicas R with K x R <= N, micro-batches M dividing the replica's batch, every
// schedule of the table with its chunks, every recompute mode) planned with the same
// costs and memory cap as one plan would be, and the one with the shortest predicted
// step chosen. The caller supplies the costs: analytic (--device-flops, --link-gbps),
// measured (--costs-from) or calibrated on the stages.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/planner/planner.h"

namespace pipetrain::planner {

struct AutoSpace {
  int max_devices = 1;  // N: stage servers free for the job
  // Largest M tried (divisors of the replica's batch up to it).
  int max_micro_batches = 64;
};

struct Candidate {
  PlanOptions options;  // the shape (MakePlan(options) gives its plan when it fits)
  bool fits = false;
  std::string why_not;  // the planner's refusal when it does not fit (memory, shape)
  double step_s = 0;    // predicted step time, the ranking key
  double bubble = 0;
  double peak_memory_bytes = 0;  // the largest stage's
  // The best candidate's plan, as the search made it (so that no caller plans it
  // again); null for the others, whose plans are not kept.
  std::shared_ptr<const Plan> plan;
  int devices() const { return options.stages * options.replicas; }
};

// One line: "K=4 R=1 M=8 zb-v v=2 recompute never".
std::string DescribeShape(const PlanOptions& options);

struct AutoResult {
  // Every candidate that fits, best first: shortest step, then fewer devices, then less
  // peak memory, then the order of the search (K, R, M, schedule table, v, recompute
  // table), so the same inputs always give the same choice. The first holds its plan.
  std::vector<Candidate> ranked;
  // The ones that do not fit, with the planner's reason, in search order.
  std::vector<Candidate> refused;
  const Candidate& best() const { return ranked.front(); }
};

// `base` holds the model, batch, precision, costs and cap; its shape fields are what
// the search replaces. Errors: no candidate fits (naming the closest refusal).
absl::StatusOr<AutoResult> SearchPlans(const PlanOptions& base, const AutoSpace& space);

// The report `pipetrain plan --auto` prints: the best `top` candidates (step, bubble,
// peak memory per stage at most) and why the rest lost.
std::string RenderAutoReport(const AutoResult& result, int top = 10);

// The same for `pipetrain plan --auto --json`: `plan_json` (PlanJson of the choice) with
// an "auto" object added: "fit" and "refused" counts, "refusals" (kind: count) and
// "candidates", the best `top` in rank order, each with rank, shape, stages, replicas,
// micro_batches, schedule, chunks, recompute, step_time_s, vs_best, bubble and
// peak_memory_bytes.
std::string AddAutoReportJson(const std::string& plan_json, const AutoResult& result,
                              int top = 10);

}  // namespace pipetrain::planner
