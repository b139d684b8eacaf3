#include "bench/recovery_bench.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/cluster_jobs.h"
#include "bench/scratch_dir.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/planner/planner.h"
#include "nlohmann/json.hpp"
#include "tests/testing/corpus_text.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain::bench {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr int kStages = 4;          // the quickstart's pipeline, plus one spare stage
constexpr int kOverheadSteps = 40;  // a job of the overhead comparison
constexpr int kFaultSteps = 80;     // a job that loses a stage (or its coordinator)
constexpr int kKillAfter = 30;      // ... once this many steps are recorded
constexpr int kWarmSteps = 5;       // left out of the step-time medians

json Spec(const ScratchDir& dir, int steps, int snapshot_every, int checkpoint_every) {
  return {{"name", "recovery-bench"},
          {"model", {{"vocab_size", 256}, {"seq_len", 64}, {"d_model", 128}, {"n_heads", 4},
                     {"n_layers", 4}}},
          {"pipeline", {{"stages", kStages}, {"micro_batches", 8}, {"schedule", "1f1b"}}},
          {"training", {{"steps", steps}, {"batch_size", 16}, {"seed", 1}, {"lr", 0.003}}},
          {"data", {{"corpus", dir.File("corpus.txt")}, {"validate_every_steps", 0}}},
          {"checkpoint", {{"every_steps", checkpoint_every},
                          {"snapshot_every_steps", snapshot_every}}}};
}

double MedianStepTime(const json& s) { return MedianStepSeconds(s, kWarmSteps); }

// Each stage's peak memory (weights, optimizer, activations and snapshots), median over steps.
std::vector<double> StagePeaks(const json& s) {
  std::vector<std::vector<double>> per(kStages);
  for (const json& h : s.value("history", json::array())) {
    for (const json& st : h.value("stages", json::array())) {
      const int64_t i = JsonInt(st, "stage");
      if (i >= 0 && i < kStages) per[i].push_back(static_cast<double>(JsonInt(st, "peak_memory_bytes")));
    }
  }
  std::vector<double> out;
  for (auto& v : per) out.push_back(Median(v));
  return out;
}

enum class Fault { kStage, kCoordinator };

// One job that loses a stage (or its coordinator) after kKillAfter steps, against the
// uninterrupted run's losses.
absl::Status FaultRun(testing::LocalCluster& c, const ScratchDir& dir, const std::string& name,
                      Fault fault, int snapshot_every, int checkpoint_every,
                      const std::vector<double>& expected, BenchResult& out) {
  const std::string file = dir.File(name + ".json");
  RETURN_IF_ERROR(common::WriteFileAtomically(
      file, Spec(dir, kFaultSteps, snapshot_every, checkpoint_every).dump(2)));
  ASSIGN_OR_RETURN(std::string id, SubmitJob(c, file, /*wait=*/false));
  ASSIGN_OR_RETURN(json running,
                   WaitForJob(c, id, [](const json& s) { return JsonInt(s, "steps_done") >= kKillAfter; }));
  const absl::Time killed = absl::Now();
  if (fault == Fault::kStage) {
    const std::string victim = running["stage_ids"][2];
    std::string address;
    ASSIGN_OR_RETURN(testing::RunResult view, c.Cli({"cluster", "--json"}));
    for (const json& s : json::parse(view.out, nullptr, false).value("stages", json::array())) {
      if (s.value("stage_id", "") == victim) address = s.value("address", "");
    }
    if (!c.KillStage(address)) {
      return absl::InternalError(absl::StrCat("recovery: ", name, ": no stage ", victim, " to kill"));
    }
  } else {
    RETURN_IF_ERROR(c.KillCoordinator(SIGKILL));
    RETURN_IF_ERROR(c.StartCoordinatorAgain(0));
  }
  ASSIGN_OR_RETURN(json done, WaitForJob(c, id, JobHasEnded));
  const json recoveries = done.value("recoveries", json::array());
  if (done.value("state", "") != "SUCCEEDED" || recoveries.size() != 1) {
    return absl::InternalError(absl::StrCat("recovery: ", name, ": job ", id, " ended ",
                                            done.value("state", ""), " with ", recoveries.size(),
                                            " restarts: ", done.value("reason", "")));
  }
  const json& r = recoveries[0];
  const std::vector<double> losses = JobLosses(done);
  double worst = losses.size() == expected.size() ? 0 : INFINITY;
  int same = 0;
  for (size_t i = 0; i < std::min(losses.size(), expected.size()); ++i) {
    worst = std::max(worst, std::fabs(losses[i] - expected[i]) / std::fabs(expected[i]));
    same += losses[i] == expected[i];
  }
  out.Add(name + "_succeeded", 1);
  out.Add(name + "_loss_max_rel_err", worst);
  out.Add(name + "_bit_identical_steps", same);
  out.Add(name + "_steps", static_cast<double>(losses.size()));
  // Steps recorded before the loss that had to be run again (the one running is extra).
  out.Add(name + "_steps_recomputed",
          static_cast<double>(JsonInt(r, "failed_step") - 1 - JsonInt(r, "restored_step")));
  out.Add(name + "_kill_to_found_s", absl::ToDoubleSeconds(JsonTime(r, "lost") - killed));
  out.Add(name + "_found_to_next_step_s",
          absl::ToDoubleSeconds(JsonTime(r, "continued") - JsonTime(r, "lost")));
  out.Add(name + "_kill_to_next_step_s", absl::ToDoubleSeconds(JsonTime(r, "continued") - killed));
  out.Add(name + "_median_step_s", MedianStepTime(done));
  out.Label(name + "_source", r.value("source", ""));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BenchResult> RunRecoveryBench(const BenchOptions& options) {
  const int reps = options.repetitions > 0 ? options.repetitions : 3;
  ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::Make("recovery"));
  RETURN_IF_ERROR(common::WriteFileAtomically(dir.File("corpus.txt"), testing::EnglishLikeCorpus()));
  testing::LocalClusterOptions co;
  co.security = options.security;
  ASSIGN_OR_RETURN(std::unique_ptr<testing::LocalCluster> cluster,
                   testing::LocalCluster::Start(dir.File("state"), kStages + 1, co));
  testing::LocalCluster& c = *cluster;
  BenchResult out;
  out.Label("model", "examples/tiny-gpt.json's (d_model 128, 4 blocks, seq 64), K = 4, M = 8, 1f1b");
  out.Label("device", "cpu stages on one machine (loopback), sharing its cores");

  // 1. Snapshot overhead: jobs without and with snapshots, alternated.
  // Besides the step time (noisy where 4 stages share 2 cores), the CPU time all stage
  // processes spent on each whole job: what the snapshots cost in work, hidden or not.
  std::vector<double> ratios, off_steps, on_steps, cpu_ratios, off_cpu, on_cpu;
  std::vector<double> off_peak, on_peak;
  for (int rep = 0; rep < reps; ++rep) {
    for (int every : {0, 1}) {
      const std::string file = dir.File(absl::StrCat("overhead-", every, ".json"));
      RETURN_IF_ERROR(common::WriteFileAtomically(file, Spec(dir, kOverheadSteps, every, 0).dump(2)));
      const double cpu0 = StagesCpuSeconds(c);
      ASSIGN_OR_RETURN(std::string id, SubmitJob(c, file, /*wait=*/true));
      (every == 0 ? off_cpu : on_cpu).push_back(StagesCpuSeconds(c) - cpu0);
      ASSIGN_OR_RETURN(json s, JobStatus(c, id));
      (every == 0 ? off_steps : on_steps).push_back(MedianStepTime(s));
      if (rep == 0) (every == 0 ? off_peak : on_peak) = StagePeaks(s);
    }
    ratios.push_back(on_steps.back() / off_steps.back());
    cpu_ratios.push_back(on_cpu.back() / off_cpu.back());
    common::LogInfo("bench", absl::StrCat("recovery: snapshot step-time ratio ", ratios.back(),
                                          ", stage CPU ratio ", cpu_ratios.back()));
  }
  out.Add("snapshot_step_time_ratio", Median(ratios));
  out.Add("snapshot_overhead", Median(ratios) - 1);
  out.Add("step_s_without_snapshots", Median(off_steps));
  out.Add("step_s_with_snapshots", Median(on_steps));
  out.Add("snapshot_cpu_ratio", Median(cpu_ratios));
  out.Add("stage_cpu_s_per_job_without_snapshots", Median(off_cpu));
  out.Add("stage_cpu_s_per_job_with_snapshots", Median(on_cpu));
  ASSIGN_OR_RETURN(pipetrain::v1::JobSpec parsed,
                   coordinator::ParseJobSpec(Spec(dir, kOverheadSteps, 1, 0).dump()));
  ASSIGN_OR_RETURN(planner::PlanOptions po,
                   planner::OptionsFromJobSpec(coordinator::WithDefaults(parsed)));
  ASSIGN_OR_RETURN(planner::Plan plan, planner::MakePlan(po));
  for (int s = 0; s < kStages; ++s) {
    out.Add(absl::StrCat("stage", s, "_snapshot_bytes_planned"), plan.stages[s].snapshot_bytes);
    out.Add(absl::StrCat("stage", s, "_state_bytes"), plan.stages[s].state_bytes);
    if (s < static_cast<int>(on_peak.size()) && s < static_cast<int>(off_peak.size())) {
      out.Add(absl::StrCat("stage", s, "_peak_bytes_measured_increase"), on_peak[s] - off_peak[s]);
    }
  }

  // 2. Faults, each against the uninterrupted run (same layout: the spare takes over).
  const std::string file = dir.File("reference.json");
  RETURN_IF_ERROR(common::WriteFileAtomically(file, Spec(dir, kFaultSteps, 1, 0).dump(2)));
  ASSIGN_OR_RETURN(std::string ref_id, SubmitJob(c, file, /*wait=*/true));
  ASSIGN_OR_RETURN(json ref, JobStatus(c, ref_id));
  const std::vector<double> expected = JobLosses(ref);
  RETURN_IF_ERROR(FaultRun(c, dir, "stage_kill_snapshots", Fault::kStage, 1, 0, expected, out));
  // The killed stage is gone: bring its address back for the next run's spare.
  for (const std::string& a : c.stage_addresses()) (void)c.RestartStage(a).ok();
  RETURN_IF_ERROR(c.WaitForIdleStages(kStages + 1));
  RETURN_IF_ERROR(FaultRun(c, dir, "stage_kill_checkpoint", Fault::kStage, 0, 20, expected, out));
  for (const std::string& a : c.stage_addresses()) (void)c.RestartStage(a).ok();
  RETURN_IF_ERROR(c.WaitForIdleStages(kStages + 1));
  RETURN_IF_ERROR(FaultRun(c, dir, "coordinator_kill", Fault::kCoordinator, 1, 0, expected, out));
  return out;
}

}  // namespace pipetrain::bench
