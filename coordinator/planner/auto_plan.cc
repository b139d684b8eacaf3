#include "coordinator/planner/auto_plan.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/planner/recompute_policy.h"
#include "coordinator/planner/schedule_registry.h"
#include "nlohmann/json.hpp"

namespace pipetrain::planner {
namespace {

namespace pb = ::pipetrain::v1;

constexpr pb::RecomputeMode kModes[] = {pb::RECOMPUTE_NEVER, pb::RECOMPUTE_EXCEPT_LAST,
                                        pb::RECOMPUTE_ALWAYS};

std::vector<int> Divisors(int n, int most) {
  std::vector<int> out;
  for (int d = 1; d <= std::min(n, most); ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// The chunks tried with a schedule: 1, or 2 for a chunked one (the V takes only 2;
// interleaved is tried at its default).
int ChunksFor(const ScheduleEntry& e) { return e.chunked ? 2 : 1; }

Candidate Evaluate(PlanOptions o) {
  Candidate c;
  c.options = o;
  absl::StatusOr<Plan> plan = MakePlan(o);
  if (!plan.ok()) {
    c.why_not = std::string(plan.status().message());
    return c;
  }
  c.fits = true;
  c.step_s = plan->simulation.step_time_s;
  c.bubble = plan->simulation.bubble_fraction;
  for (const StagePlan& sp : plan->stages) {
    c.peak_memory_bytes = std::max(c.peak_memory_bytes, sp.peak_memory_bytes());
  }
  c.plan = std::make_shared<const Plan>(*std::move(plan));
  return c;
}

// The ranking: a shorter step, then fewer devices, then less peak memory.
bool Better(const Candidate& a, const Candidate& b) {
  if (a.step_s != b.step_s) return a.step_s < b.step_s;
  if (a.devices() != b.devices()) return a.devices() < b.devices();
  return a.peak_memory_bytes < b.peak_memory_bytes;
}

// Keeps the plan of the best candidate so far only (the earlier on a tie, as the
// stable ranking keeps it first).
void KeepBestPlan(std::vector<Candidate>& all, int& best) {
  Candidate& c = all.back();
  if (!c.fits) return;
  if (best >= 0 && !Better(c, all[best])) {
    c.plan.reset();
    return;
  }
  if (best >= 0) all[best].plan.reset();
  best = static_cast<int>(all.size()) - 1;
}

// The search's own order, for ties.
std::vector<Candidate> Enumerate(const PlanOptions& base, const AutoSpace& space) {
  std::vector<Candidate> all;
  int best = -1;
  const int layers = base.model.num_pipeline_layers();
  for (int k = 1; k <= space.max_devices; ++k) {
    for (int r = 1; k * r <= space.max_devices; ++r) {
      if (base.batch_size % r != 0) continue;
      for (int m : Divisors(base.batch_size / r, space.max_micro_batches)) {
        for (const ScheduleEntry& e : ScheduleTable()) {
          const int v = ChunksFor(e);
          if (k * v > layers) continue;
          if (!CheckShape(*ParseScheduleKind(e.name), k, m, v).ok()) continue;
          for (pb::RecomputeMode mode : kModes) {
            PlanOptions o = base;
            o.stages = k;
            o.replicas = r;
            o.micro_batches = m;
            o.schedule = *ParseScheduleKind(e.name);
            o.chunks = v;
            o.recompute = mode;
            o.schedule_program = nullptr;
            all.push_back(Evaluate(std::move(o)));
            KeepBestPlan(all, best);
          }
        }
      }
    }
  }
  return all;
}

}  // namespace

std::string DescribeShape(const PlanOptions& o) {
  return absl::StrCat("K=", o.stages, " R=", o.replicas, " M=", o.micro_batches, " ",
                      ScheduleName(o.schedule), o.chunks > 1 ? absl::StrCat(" v=", o.chunks) : "",
                      " recompute ", RecomputeName(o.recompute));
}

absl::StatusOr<AutoResult> SearchPlans(const PlanOptions& base, const AutoSpace& space) {
  if (space.max_devices < 1) {
    return absl::InvalidArgumentError("auto plan: no stage server to plan for");
  }
  // Equal stage costs give every stage one unit whatever it holds: steps of different
  // K or M are not comparable.
  if (base.equal_stage_cost) {
    return absl::InvalidArgumentError(
        "auto plan: needs costs that follow the shape (analytic, measured with --costs-from, "
        "or calibrated), not equal stage costs");
  }
  AutoResult result;
  for (Candidate& c : Enumerate(base, space)) {
    (c.fits ? result.ranked : result.refused).push_back(std::move(c));
  }
  if (result.ranked.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "auto plan: no way to run the job on ", space.max_devices, " stage servers fits",
        result.refused.empty() ? "" : absl::StrCat("; e.g. ", DescribeShape(result.refused.back().options),
                                                   ": ", result.refused.back().why_not)));
  }
  std::stable_sort(result.ranked.begin(), result.ranked.end(), Better);
  return result;
}

namespace {
// The refusals grouped by their kind (the refusal's text before its first colon).
std::map<std::string, int> RefusalKinds(const AutoResult& result) {
  std::map<std::string, int> reasons;
  for (const Candidate& c : result.refused) {
    reasons[c.why_not.substr(0, c.why_not.find(':'))]++;
  }
  return reasons;
}
}  // namespace

std::string RenderAutoReport(const AutoResult& result, int top) {
  const Candidate& best = result.best();
  std::string out = absl::StrFormat(
      "Auto plan: %s, predicted step %.6g s (bubble %.4f, peak %.1f MiB a stage), best of "
      "%d plans that fit (%d did not)\n\n",
      DescribeShape(best.options), best.step_s, best.bubble, best.peak_memory_bytes / (1 << 20),
      result.ranked.size(), result.refused.size());
  absl::StrAppend(&out, "  rank  plan                                          step (s)   vs best  bubble  peak MiB\n");
  for (int i = 0; i < std::min<int>(top, result.ranked.size()); ++i) {
    const Candidate& c = result.ranked[i];
    absl::StrAppend(&out, absl::StrFormat("  %4d  %-44s  %-9.4g  %6.3fx  %6.4f  %8.1f\n", i + 1,
                                          DescribeShape(c.options), c.step_s, c.step_s / best.step_s,
                                          c.bubble, c.peak_memory_bytes / (1 << 20)));
  }
  // Why the rest lost: slower (ranked below), or refused, grouped by the refusal's kind.
  const std::map<std::string, int> reasons = RefusalKinds(result);
  if (result.ranked.size() > static_cast<size_t>(top)) {
    absl::StrAppend(&out, "  ... ", result.ranked.size() - top, " more fit, all slower\n");
  }
  for (const auto& [reason, n] : reasons) {
    absl::StrAppend(&out, "  refused: ", n, " (", reason, ")\n");
  }
  return out;
}

std::string AddAutoReportJson(const std::string& plan_json, const AutoResult& result,
                              int top) {
  nlohmann::json j = nlohmann::json::parse(plan_json);
  nlohmann::json candidates = nlohmann::json::array();
  const double best = result.best().step_s;
  for (int i = 0; i < std::min<int>(top, result.ranked.size()); ++i) {
    const Candidate& c = result.ranked[i];
    const PlanOptions& o = c.options;
    candidates.push_back({{"rank", i + 1},
                          {"shape", DescribeShape(o)},
                          {"stages", o.stages},
                          {"replicas", o.replicas},
                          {"micro_batches", o.micro_batches},
                          {"schedule", ScheduleName(o.schedule)},
                          {"chunks", o.chunks},
                          {"recompute", RecomputeName(o.recompute)},
                          {"step_time_s", c.step_s},
                          {"vs_best", c.step_s / best},
                          {"bubble", c.bubble},
                          {"peak_memory_bytes", c.peak_memory_bytes}});
  }
  nlohmann::json refusals = nlohmann::json::object();
  for (const auto& [kind, n] : RefusalKinds(result)) refusals[kind] = n;
  j["auto"] = {{"fit", result.ranked.size()},
               {"refused", result.refused.size()},
               {"refusals", refusals},
               {"candidates", candidates}};
  return j.dump();
}

}  // namespace pipetrain::planner
