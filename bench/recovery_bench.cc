#include "bench/recovery_bench.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "bench/scratch_dir.h"
#include "common/atomic_file.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/job_spec.h"
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

int64_t Int(const json& j, const char* key) {
  if (!j.contains(key)) return 0;
  if (j[key].is_number()) return j[key].get<int64_t>();
  int64_t v = 0;
  (void)absl::SimpleAtoi(j[key].get<std::string>(), &v);
  return v;
}

absl::Time Time(const json& j, const char* key) {
  absl::Time t = absl::InfinitePast();
  std::string err;
  if (j.contains(key)) (void)absl::ParseTime(absl::RFC3339_full, j[key].get<std::string>(), &t, &err);
  return t;
}

absl::StatusOr<json> Status(testing::LocalCluster& c, const std::string& id) {
  ASSIGN_OR_RETURN(testing::RunResult r, c.Cli({"status", id, "--json"}));
  json j = json::parse(r.out, nullptr, false);
  if (r.exit_code != 0 || j.is_discarded()) {
    return absl::InternalError(absl::StrCat("recovery: pipetrain status ", id, ": ", r.err));
  }
  return j;
}

absl::StatusOr<std::string> Submit(testing::LocalCluster& c, const std::string& spec_file,
                                   bool wait) {
  std::vector<std::string> args = {"submit", spec_file};
  if (!wait) args.push_back("--no-wait");
  ASSIGN_OR_RETURN(testing::RunResult r, c.Cli(args, std::chrono::minutes(10)));
  const size_t at = r.out.find("job-");
  if (at == std::string::npos) {
    return absl::InternalError(absl::StrCat("recovery: pipetrain submit exited ", r.exit_code,
                                            " without a job: ", r.out, r.err));
  }
  std::string id = r.out.substr(at);
  return id.substr(0, id.find_first_of(" \n"));
}

// Polls the job until `pred` holds (deadline 5 minutes).
absl::StatusOr<json> WaitFor(testing::LocalCluster& c, const std::string& id,
                             const std::function<bool(const json&)>& pred) {
  const absl::Time deadline = absl::Now() + absl::Minutes(5);
  while (absl::Now() < deadline) {
    absl::StatusOr<json> s = Status(c, id);
    if (s.ok() && pred(*s)) return s;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("recovery: job ", id, " did not get there"));
}

bool Ended(const json& s) {
  const std::string st = s.value("state", "");
  return st == "SUCCEEDED" || st == "FAILED" || st == "CANCELLED";
}

std::vector<double> Losses(const json& s) {
  std::vector<double> out;
  for (const json& h : s.value("history", json::array())) out.push_back(h.value("loss", 0.0));
  return out;
}

double MedianStepTime(const json& s) {
  std::vector<double> t;
  const json history = s.value("history", json::array());
  for (size_t i = kWarmSteps; i < history.size(); ++i) t.push_back(history[i].value("step_time_s", 0.0));
  return Median(t);
}

// Each stage's peak memory (weights, optimizer, activations and snapshots), median over steps.
std::vector<double> StagePeaks(const json& s) {
  std::vector<std::vector<double>> per(kStages);
  for (const json& h : s.value("history", json::array())) {
    for (const json& st : h.value("stages", json::array())) {
      const int64_t i = Int(st, "stage");
      if (i >= 0 && i < kStages) per[i].push_back(static_cast<double>(Int(st, "peak_memory_bytes")));
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
  ASSIGN_OR_RETURN(std::string id, Submit(c, file, /*wait=*/false));
  ASSIGN_OR_RETURN(json running,
                   WaitFor(c, id, [](const json& s) { return Int(s, "steps_done") >= kKillAfter; }));
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
  ASSIGN_OR_RETURN(json done, WaitFor(c, id, Ended));
  const json recoveries = done.value("recoveries", json::array());
  if (done.value("state", "") != "SUCCEEDED" || recoveries.size() != 1) {
    return absl::InternalError(absl::StrCat("recovery: ", name, ": job ", id, " ended ",
                                            done.value("state", ""), " with ", recoveries.size(),
                                            " restarts: ", done.value("reason", "")));
  }
  const json& r = recoveries[0];
  const std::vector<double> losses = Losses(done);
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
          static_cast<double>(Int(r, "failed_step") - 1 - Int(r, "restored_step")));
  out.Add(name + "_kill_to_found_s", absl::ToDoubleSeconds(Time(r, "lost") - killed));
  out.Add(name + "_found_to_next_step_s",
          absl::ToDoubleSeconds(Time(r, "continued") - Time(r, "lost")));
  out.Add(name + "_kill_to_next_step_s", absl::ToDoubleSeconds(Time(r, "continued") - killed));
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
  std::vector<double> ratios, off_steps, on_steps;
  std::vector<double> off_peak, on_peak;
  for (int rep = 0; rep < reps; ++rep) {
    for (int every : {0, 1}) {
      const std::string file = dir.File(absl::StrCat("overhead-", every, ".json"));
      RETURN_IF_ERROR(common::WriteFileAtomically(file, Spec(dir, kOverheadSteps, every, 0).dump(2)));
      ASSIGN_OR_RETURN(std::string id, Submit(c, file, /*wait=*/true));
      ASSIGN_OR_RETURN(json s, Status(c, id));
      (every == 0 ? off_steps : on_steps).push_back(MedianStepTime(s));
      if (rep == 0) (every == 0 ? off_peak : on_peak) = StagePeaks(s);
    }
    ratios.push_back(on_steps.back() / off_steps.back());
    common::LogInfo("bench", absl::StrCat("recovery: snapshot step-time ratio ", ratios.back()));
  }
  out.Add("snapshot_step_time_ratio", Median(ratios));
  out.Add("snapshot_overhead", Median(ratios) - 1);
  out.Add("step_s_without_snapshots", Median(off_steps));
  out.Add("step_s_with_snapshots", Median(on_steps));
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
  ASSIGN_OR_RETURN(std::string ref_id, Submit(c, file, /*wait=*/true));
  ASSIGN_OR_RETURN(json ref, Status(c, ref_id));
  const std::vector<double> expected = Losses(ref);
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
