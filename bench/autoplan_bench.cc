// `pipetrain-bench autoplan` (autoplan_bench.h): for each cell of a grid (two models x two
// stage memories on 4 emulated stages, one model on 2 cpu stages) a cluster, one job with
// pipeline.schedule "auto" (the coordinator calibrates a stage, times a transfer and the
// ring, and picks the shape), then a sample of the same search space measured by hand:
// the 4 plans the planner ranks best, the default plan (1f1b, K = M = the stages, no
// recompute) and 3 others drawn at random. "auto" runs first, on the cluster as started:
// what it knows is what the stages calibrate. Each plan's measured step is the median of
// its steps after the first.
#include "bench/autoplan_bench.h"

#include <algorithm>
#include <iostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/cluster_jobs.h"
#include "bench/scratch_dir.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "coordinator/auto/auto_schedule.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/planner/auto_plan.h"
#include "coordinator/planner/recompute_policy.h"
#include "coordinator/planner/schedule_registry.h"
#include "coordinator/stages/stage_costs.h"
#include "tests/testing/corpus_text.h"

namespace pipetrain::bench {
namespace {

using json = nlohmann::json;
namespace pb = ::pipetrain::v1;

constexpr int kStages = 4;
constexpr int kCpuStages = 2;
constexpr double kFlops = 5e10;  // the emulated device: a step of tens of milliseconds
constexpr int kSteps = 6;
constexpr int kTopRanked = 4;
constexpr int kRandom = 3;

struct ModelCell {
  std::string name;
  json model;
};

std::vector<ModelCell> Models() {
  return {{"narrow", {{"vocab_size", 256}, {"seq_len", 64}, {"d_model", 64}, {"n_heads", 4},
                      {"n_layers", 8}}},
          {"wide", {{"vocab_size", 256}, {"seq_len", 64}, {"d_model", 128}, {"n_heads", 4},
                    {"n_layers", 6}}}};
}

json Spec(const ModelCell& m, const ScratchDir& dir, const json& pipeline) {
  return {{"name", absl::StrCat("autoplan-", m.name)},
          {"model", m.model},
          {"pipeline", pipeline},
          {"training", {{"steps", kSteps}, {"batch_size", 16}, {"seed", 1}, {"lr", 1e-3}}},
          {"data", {{"corpus", dir.File("corpus.txt")}, {"validate_every_steps", 0}}},
          {"checkpoint", {{"every_steps", 0}, {"snapshot_every_steps", 0}}}};
}

json PipelineOf(const planner::PlanOptions& o) {
  return {{"stages", o.stages},
          {"replicas", o.replicas},
          {"micro_batches", o.micro_batches},
          {"schedule", planner::ScheduleName(o.schedule)},
          {"chunks", o.chunks},
          {"recompute", planner::RecomputeName(o.recompute)}};
}

// One cell of the grid: a model on `stages` stage servers of one memory, emulated
// (kFlops, whose replicas do not reduce) or cpu (one thread each: real compute and a
// real gloo all-reduce).
struct Cell {
  std::string name;
  ModelCell model;
  uint64_t memory = 0;
  bool emulated = true;
  int stages = kStages;
};

// The search the coordinator makes, here with the emulated device's exact rate (on cpu
// stages, their guessed rate: the sample's top only, "auto" calibrates).
absl::StatusOr<planner::AutoResult> Search(const json& spec, const Cell& cell) {
  ASSIGN_OR_RETURN(pb::JobSpec parsed, coordinator::ParseJobSpec(spec.dump()));
  parsed = coordinator::WithDefaults(parsed);
  ASSIGN_OR_RETURN(planner::PlanOptions base,
                   planner::OptionsFromJobSpec(coordinator::WithPlaceholderShape(parsed)));
  pb::DeviceInfo d;
  if (cell.emulated) d.set_peak_flops(kFlops);
  d.set_threads(1);
  d.set_memory_bytes(cell.memory);
  coordinator::SetCostsFromDevices(std::vector<pb::DeviceInfo>(cell.stages, d), base);
  // Emulated stages' replicas hold no gradients: their all-reduce costs nothing.
  if (cell.emulated) base.collective_bytes_per_s = coordinator::kFreeCollectiveRate;
  return planner::SearchPlans(base, {.max_devices = cell.stages});
}

struct Measured {
  double step_s = 0;
  json status;
};

// Submits `spec`, follows it, and reads the median step after the first.
absl::StatusOr<Measured> Run(testing::LocalCluster& c, const ScratchDir& dir, const json& spec,
                             const std::string& label) {
  const std::string file = dir.File(absl::StrCat("job-", label, ".json"));
  RETURN_IF_ERROR(common::WriteFileAtomically(file, spec.dump(2)));
  ASSIGN_OR_RETURN(std::string id, SubmitJob(c, file, /*wait=*/true));
  ASSIGN_OR_RETURN(json status, JobStatus(c, id));
  const size_t steps = status.value("history", json::array()).size();
  if (steps < static_cast<size_t>(kSteps)) {
    return absl::InternalError(absl::StrCat("autoplan: ", label, " (", id, ") recorded ", steps,
                                            " of ", kSteps, " steps: ", status.value("state", ""),
                                            ": ", status.value("reason", "")));
  }
  Measured m;
  m.step_s = MedianStepSeconds(status, 1);
  m.status = std::move(status);
  return m;
}

// The default plan's shape as planner::DescribeShape writes it: 1f1b, K = M = the
// stages, R = 1, no recompute.
bool IsDefault(const std::string& shape, int stages) {
  return shape == absl::StrCat("K=", stages, " R=1 M=", stages, " 1f1b recompute never");
}

// The plans measured besides "auto": the best ranked, the default one, a few at random.
std::vector<planner::PlanOptions> Sample(const planner::AutoResult& result, int stages,
                                         uint64_t seed) {
  std::vector<planner::PlanOptions> out;
  std::set<std::string> seen;
  const auto add = [&](const planner::PlanOptions& o) {
    if (seen.insert(planner::DescribeShape(o)).second) out.push_back(o);
  };
  for (int i = 0; i < std::min<int>(kTopRanked, result.ranked.size()); ++i) {
    add(result.ranked[i].options);
  }
  for (const planner::Candidate& c : result.ranked) {
    if (IsDefault(planner::DescribeShape(c.options), stages)) add(c.options);
  }
  std::mt19937_64 rng(seed);
  for (int i = 0; i < kRandom && result.ranked.size() > 1; ++i) {
    add(result.ranked[rng() % result.ranked.size()].options);
  }
  return out;
}

using Runs = std::vector<std::pair<std::string, double>>;  // shape, measured step

// The sample by hand, "auto"'s own shape left out.
absl::StatusOr<Runs> RunSample(testing::LocalCluster& cluster, const ScratchDir& dir,
                               const Cell& cell, const std::vector<planner::PlanOptions>& sample,
                               const std::string& auto_shape) {
  Runs runs;
  for (const planner::PlanOptions& o : sample) {
    const std::string shape = planner::DescribeShape(o);
    if (shape == auto_shape) continue;
    ASSIGN_OR_RETURN(Measured run, Run(cluster, dir, Spec(cell.model, dir, PipelineOf(o)),
                                       absl::StrCat(cell.name, "-", runs.size())));
    runs.push_back({shape, run.step_s});
  }
  return runs;
}

// The cell's figures into `result` under its name.
void Record(const Cell& cell, const Measured& chosen, const Runs& runs, size_t plans_fit,
            BenchResult& result) {
  const json& a = chosen.status["auto_plan"];
  const std::string auto_shape = a.value("shape", "");
  const double predicted = a.value("predicted_step_s", 0.0);
  double best_s = chosen.step_s;
  double default_s = IsDefault(auto_shape, cell.stages) ? chosen.step_s : 0;
  std::string best_shape = auto_shape;
  for (const auto& [shape, step_s] : runs) {
    std::cerr << absl::StrFormat("autoplan: %s: %-44s %7.1f ms\n", cell.name, shape, step_s * 1e3);
    if (step_s < best_s) best_s = step_s, best_shape = shape;
    if (IsDefault(shape, cell.stages)) default_s = step_s;
  }
  std::cerr << absl::StrFormat("autoplan: %s: auto %s %7.1f ms (predicted %7.1f)\n", cell.name,
                               auto_shape, chosen.step_s * 1e3, predicted * 1e3);
  const std::string& c = cell.name;
  result.Label(c + "_auto", auto_shape);
  result.Label(c + "_best_measured", best_shape);
  result.Label(c + "_costs", a.value("cost_source", ""));
  result.Add(c + "_plans_fit", static_cast<double>(plans_fit));
  result.Add(c + "_plans_measured", static_cast<double>(runs.size()) + 1);
  result.Add(c + "_auto_step_ms", chosen.step_s * 1e3);
  result.Add(c + "_auto_over_best", chosen.step_s / best_s);
  if (default_s > 0) result.Add(c + "_default_over_auto", default_s / chosen.step_s);
  result.Add(c + "_predicted_over_measured", predicted / chosen.step_s);
}

// Runs one cell: "auto" first, on the fresh cluster (so it plans with what the stages
// calibrate: a block, a transfer, the ring; no job has measured anything yet), then
// the sample by hand.
absl::Status RunCell(const Cell& cell, int index, const ScratchDir& dir,
                     const BenchOptions& options, BenchResult& result) {
  ASSIGN_OR_RETURN(const planner::AutoResult search,
                   Search(Spec(cell.model, dir, {{"schedule", "auto"}}), cell));
  testing::LocalClusterOptions co;
  co.stage_args = {"--device", cell.emulated ? absl::StrCat("emulated:", kFlops) : "cpu",
                   "--threads", "1", "--memory-limit", absl::StrCat(cell.memory)};
  co.security = options.security;
  std::cerr << "autoplan: " << cell.name << ": " << search.ranked.size() << " plans fit, "
            << search.refused.size() << " refused\n";
  ASSIGN_OR_RETURN(std::unique_ptr<testing::LocalCluster> cluster,
                   testing::LocalCluster::Start(dir.File("state-" + cell.name), cell.stages, co));
  ASSIGN_OR_RETURN(Measured chosen, Run(*cluster, dir, Spec(cell.model, dir, {{"schedule", "auto"}}),
                                        cell.name + "-auto"));
  ASSIGN_OR_RETURN(const Runs runs,
                   RunSample(*cluster, dir, cell, Sample(search, cell.stages, 7 + index),
                             chosen.status["auto_plan"].value("shape", "")));
  Record(cell, chosen, runs, search.ranked.size(), result);
  return absl::OkStatus();
}

// The grid: each model roomy (no plan refused for memory) and tight (the median peak of
// the roomy search, so that about half the plans do not fit) on emulated stages, and
// the narrow model on 2 cpu stages (one core each on a 2-core machine).
absl::StatusOr<std::vector<Cell>> Grid(const ScratchDir& dir) {
  constexpr uint64_t kRoomy = uint64_t{1} << 34;
  std::vector<Cell> cells;
  for (const ModelCell& m : Models()) {
    Cell roomy{m.name + "_roomy", m, kRoomy};
    ASSIGN_OR_RETURN(const planner::AutoResult all,
                     Search(Spec(m, dir, {{"schedule", "auto"}}), roomy));
    std::vector<double> peaks;
    for (const planner::Candidate& c : all.ranked) peaks.push_back(c.peak_memory_bytes);
    std::nth_element(peaks.begin(), peaks.begin() + peaks.size() / 2, peaks.end());
    cells.push_back(roomy);
    cells.push_back({m.name + "_tight", m, static_cast<uint64_t>(peaks[peaks.size() / 2])});
  }
  cells.push_back({"narrow_cpu", Models().front(), kRoomy, /*emulated=*/false, kCpuStages});
  return cells;
}

}  // namespace

absl::StatusOr<BenchResult> RunAutoplanBench(const BenchOptions& options) {
  ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::Make("autoplan"));
  RETURN_IF_ERROR(common::WriteFileAtomically(dir.File("corpus.txt"),
                                              testing::EnglishLikeCorpus(200000)));
  BenchResult result;
  result.Label("grid", absl::StrCat("2 models x 2 stage memories on ", kStages,
                                    " stages --device emulated:", kFlops, ", and the narrow "
                                    "model on ", kCpuStages, " cpu stages (--threads 1); batch "
                                    "16, ", kSteps, " steps (median of the last ", kSteps - 1, ")"));
  ASSIGN_OR_RETURN(const std::vector<Cell> cells, Grid(dir));
  for (size_t i = 0; i < cells.size(); ++i) {
    RETURN_IF_ERROR(RunCell(cells[i], static_cast<int>(i), dir, options, result));
  }
  return result;
}

}  // namespace pipetrain::bench
