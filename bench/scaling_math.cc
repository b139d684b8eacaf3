#include "bench/scaling_math.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace pipetrain::bench {
namespace {

using Key = std::tuple<int, int, std::string>;  // (K, M, schedule)

std::string CellText(int k, int m, const std::string& schedule) {
  return absl::StrCat("K = ", k, ", M = ", m, ", schedule ", schedule);
}

void Consider(TargetCheck& check, const ScalingRow& row, double value) {
  ++check.cells;
  const std::string cell = CellName(row.k, row.m, row.schedule);
  if (check.worst.empty() || value < check.worst_value) {
    check.worst = cell;
    check.worst_value = value;
  }
  if (value < check.threshold) check.misses.push_back(absl::StrFormat("%s %.3f", cell, value));
}

}  // namespace

double IdealSpeedup(int k, int m) {
  return static_cast<double>(k) * m / (m + k - 1);
}

std::string CellName(int k, int m, const std::string& schedule) {
  return absl::StrCat("k", k, "_m", m, "_", absl::StrReplaceAll(schedule, {{"-", "_"}}));
}

absl::StatusOr<std::vector<ScalingRow>> BuildScalingTable(
    const std::vector<ScalingMeasurement>& measured,
    const std::vector<ScalingPrediction>& predicted, const std::string& baseline_schedule) {
  std::map<Key, double> step_s, tokens_s;
  for (const ScalingPrediction& p : predicted) {
    if (!(p.step_time_s > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("scaling: the predicted step of ",
                                                     CellText(p.k, p.m, p.schedule),
                                                     " is not positive (", p.step_time_s, " s)"));
    }
    step_s[{p.k, p.m, p.schedule}] = p.step_time_s;
  }
  for (const ScalingMeasurement& c : measured) {
    if (!(c.tokens_per_s > 0)) {
      return absl::InvalidArgumentError(absl::StrCat("scaling: the measured tokens/s of ",
                                                     CellText(c.k, c.m, c.schedule),
                                                     " is not positive (", c.tokens_per_s, ")"));
    }
    tokens_s[{c.k, c.m, c.schedule}] = c.tokens_per_s;
  }
  std::vector<ScalingRow> rows;
  for (const ScalingMeasurement& c : measured) {
    auto base_tokens = tokens_s.find({1, c.m, baseline_schedule});
    if (base_tokens == tokens_s.end()) {
      return absl::NotFoundError(absl::StrCat(
          "scaling: ", CellText(c.k, c.m, c.schedule), " has no K = 1 baseline: no ",
          baseline_schedule, " cell with K = 1, M = ", c.m, " was measured"));
    }
    auto base_step = step_s.find({1, c.m, baseline_schedule});
    if (base_step == step_s.end()) {
      return absl::NotFoundError(absl::StrCat(
          "scaling: ", CellText(c.k, c.m, c.schedule), " has no K = 1 baseline: no ",
          baseline_schedule, " cell with K = 1, M = ", c.m, " was simulated"));
    }
    auto own_step = step_s.find({c.k, c.m, c.schedule});
    if (own_step == step_s.end()) {
      return absl::NotFoundError(
          absl::StrCat("scaling: ", CellText(c.k, c.m, c.schedule), " was not simulated"));
    }
    ScalingRow r;
    r.k = c.k;
    r.m = c.m;
    r.schedule = c.schedule;
    r.tokens_per_s = c.tokens_per_s;
    r.measured_speedup = c.tokens_per_s / base_tokens->second;
    r.ideal = IdealSpeedup(c.k, c.m);
    r.bound = base_step->second / own_step->second;
    r.efficiency_ideal = r.measured_speedup / r.ideal;
    r.efficiency_bound = r.measured_speedup / r.bound;
    rows.push_back(std::move(r));
  }
  // The kept share of the advantage over 1F1B, where a 1F1B cell of the same shape ran.
  for (ScalingRow& r : rows) {
    if (r.schedule == "1f1b" || r.schedule == "gpipe" || r.k == 1) continue;
    auto ref = std::find_if(rows.begin(), rows.end(), [&](const ScalingRow& o) {
      return o.k == r.k && o.m == r.m && o.schedule == "1f1b";
    });
    if (ref == rows.end()) continue;
    const double predicted_gain = r.bound / ref->bound - 1;
    if (predicted_gain <= kMinPredictedAdvantage) continue;
    r.kept_advantage = (r.measured_speedup / ref->measured_speedup - 1) / predicted_gain;
  }
  return rows;
}

std::string TargetCheck::Line() const {
  std::string line = absl::StrFormat("%s %s >= %.2f: %d cells", pass() ? "PASS" : "MISS", name,
                                     threshold, cells);
  if (!worst.empty()) absl::StrAppendFormat(&line, ", worst %s %.3f", worst, worst_value);
  if (!misses.empty()) absl::StrAppend(&line, "; missed by ", absl::StrJoin(misses, ", "));
  return line;
}

TargetCheck CheckSpeedupTarget(const std::vector<ScalingRow>& rows, double threshold) {
  TargetCheck check;
  check.name = "measured_speedup/ideal (M >= K)";
  check.threshold = threshold;
  for (const ScalingRow& r : rows) {
    if (r.k > 1 && r.m >= r.k) Consider(check, r, r.efficiency_ideal);
  }
  return check;
}

TargetCheck CheckKeptAdvantageTarget(const std::vector<ScalingRow>& rows, double threshold) {
  TargetCheck check;
  check.name = "kept share of the predicted advantage over 1f1b";
  check.threshold = threshold;
  for (const ScalingRow& r : rows) {
    if (r.kept_advantage) Consider(check, r, *r.kept_advantage);
  }
  return check;
}

std::string ScalingDataText(const std::vector<ScalingRow>& rows) {
  std::string out =
      "# pipetrain-bench scaling: stages vs speed, EMULATED stages (no arithmetic; every\n"
      "# action sleeps its modelled time), one row per (K, M, schedule). Columns:\n"
      "#  1 K                 pipeline stages\n"
      "#  2 M                 micro-batches per step\n"
      "#  3 schedule          a row of the schedule table (chunked ones with 2 chunks)\n"
      "#  4 measured_speedup  median tokens/s over the K = 1 gpipe run's at the same M\n"
      "#  5 ideal             K*M/(M+K-1), the textbook GPipe/1F1B speedup\n"
      "#  6 bound             the planner's simulated speedup for this schedule, same costs\n"
      "#  7 tokens_per_s      median training tokens/s after the warm-up step\n"
      "# K M schedule measured_speedup ideal bound tokens_per_s\n";
  for (const ScalingRow& r : rows) {
    absl::StrAppendFormat(&out, "%d %d %s %.4f %.4f %.4f %.1f\n", r.k, r.m, r.schedule,
                          r.measured_speedup, r.ideal, r.bound, r.tokens_per_s);
  }
  return out;
}

}  // namespace pipetrain::bench
