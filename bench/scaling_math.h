// The arithmetic of `pipetrain-bench scaling`: measured throughput normalised to one
// stage, the textbook ideal K*M/(M+K-1), the simulator's bound for each schedule, the
// share of a schedule's predicted advantage over 1F1B that the run kept, and the targets.
// Pure (no cluster, no clock), so it is tested on fabricated grids.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::bench {

// One measured (K, M, schedule) cell: median training tokens/s after the warm-up step.
struct ScalingMeasurement {
  int k = 1;
  int m = 1;
  std::string schedule;  // a name of the planner's schedule table
  double tokens_per_s = 0;
};

// The simulator's step for the same cell with the same emulated costs.
struct ScalingPrediction {
  int k = 1;
  int m = 1;
  std::string schedule;
  double step_time_s = 0;
};

struct ScalingRow {
  int k = 1;
  int m = 1;
  std::string schedule;
  double tokens_per_s = 0;
  double measured_speedup = 0;  // tokens/s over the K = 1 baseline's at the same M
  double ideal = 0;             // K*M/(M+K-1)
  double bound = 0;             // simulated step at K = 1 over simulated step here
  double efficiency_ideal = 0;  // measured / ideal
  double efficiency_bound = 0;  // measured / bound
  // (measured/measured_1f1b - 1) / (bound/bound_1f1b - 1), for a schedule other than
  // 1f1b and gpipe whose predicted advantage over 1F1B at this (K, M) exceeds 2%.
  std::optional<double> kept_advantage;
};

// The textbook speedup of a fill-drain (GPipe) or 1F1B pipeline of K equal stages with
// M micro-batches and free transfer: K*M/(M+K-1), the bubble being (K-1)/(M+K-1).
double IdealSpeedup(int k, int m);

// Predicted advantages at or under this are too small to measure a share of.
inline constexpr double kMinPredictedAdvantage = 0.02;

// One row per measured cell with K > 1, in the order given; the K = 1 cells are the
// baselines (their row is added too, speedup 1 by construction). `baseline_schedule`
// names which K = 1 measurement and prediction a cell of any schedule is divided by.
// Errors: a K > 1 cell whose M has no K = 1 measurement or no K = 1 prediction under
// `baseline_schedule`, a cell without its own prediction, or a non-positive figure; each
// names the cell.
absl::StatusOr<std::vector<ScalingRow>> BuildScalingTable(
    const std::vector<ScalingMeasurement>& measured,
    const std::vector<ScalingPrediction>& predicted, const std::string& baseline_schedule);

// A target checked over the table: how many cells it covers, which miss, the worst cell.
struct TargetCheck {
  std::string name;
  double threshold = 0;
  int cells = 0;
  std::vector<std::string> misses;  // "k8_m8_gpipe 0.912"
  std::string worst;                // the cell with the lowest value, "" if no cells
  double worst_value = 0;
  bool pass() const { return misses.empty(); }
  std::string Line() const;  // "PASS speedup_vs_ideal >= 0.95: 40 cells, worst ..."
};

// Measured speedup >= threshold * ideal for every row with K > 1 and M >= K.
TargetCheck CheckSpeedupTarget(const std::vector<ScalingRow>& rows, double threshold);
// kept_advantage >= threshold for every row that has one.
TargetCheck CheckKeptAdvantageTarget(const std::vector<ScalingRow>& rows, double threshold);

// "k8_m32_1f1b": the prefix of a row's figure names (a '-' in the schedule becomes '_').
std::string CellName(int k, int m, const std::string& schedule);

// The table as whitespace-separated text for gnuplot: '#' comment lines documenting the
// columns, then one line per row: K M schedule measured_speedup ideal bound tokens_per_s.
std::string ScalingDataText(const std::vector<ScalingRow>& rows);

}  // namespace pipetrain::bench
