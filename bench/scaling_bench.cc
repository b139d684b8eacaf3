#include "bench/scaling_bench.h"

#include <stdlib.h>

#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "bench/scaling_math.h"
#include "bench/scratch_dir.h"
#include "common/atomic_file.h"
#include "common/status_macros.h"
#include "coordinator/planner/planner.h"
#include "coordinator/planner/schedule_registry.h"
#include "nlohmann/json.hpp"
#include "tests/testing/corpus_text.h"
#include "tests/testing/local_cluster.h"

namespace pipetrain::bench {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The emulated device: a micro-batch's whole-model forward + backward (1 row of 128
// tokens, 32 blocks of d_model 256: 21.5 GFLOP) takes ~215 ms, so that at K = 8 with two
// interleaved chunks an action still lasts ~6-11 ms (a GPU stage's micro-batch of a
// GPT-2-sized model is of that order), against the runtime's own ~0.1 ms an action and
// ~10 ms a step. PIPETRAIN_BENCH_SCALING_FLOPS overrides it: at 2.5e11 those fixed costs
// weigh 2.5 times more (docs/PERFORMANCE.md has both runs).
constexpr double kDefaultDeviceFlops = 1e11;
// The planner's link rate for the bound; the coordinator plans with the same 1 GB/s
// (coordinator/stages/stage_costs.cc), near what `pipetrain-bench link` measures on loopback.
constexpr double kLinkBytesPerS = 1e9;
constexpr int kMaxStages = 8;
constexpr int kStageCounts[] = {1, 2, 4, 8};
constexpr int kMicroBatchCounts[] = {1, 4, 8, 32};
// Every K = 1 cell is the gpipe program: the K = 1 programs of the other schedules
// simulate to the same step (checked and reported in the run), so one baseline per M.
constexpr const char* kBaselineSchedule = "gpipe";
// GPipe (Huang et al. 2019), Table 2, K = 8 with real compute; not ours, not emulated.
constexpr std::pair<int, double> kPaperK8[] = {{1, 1.38}, {4, 1.72}, {32, 3.48}};
constexpr double kSpeedupTarget = 0.95, kKeptAdvantageTarget = 0.90;

// 32 blocks split evenly over 1, 2, 4, 8 stages and 16 interleaved chunks; the cheap
// embedding and head (byte vocabulary) ride on the first and last stage.
model::TransformerConfig Model() { return {256, 128, 256, 8, 32}; }

absl::StatusOr<double> DeviceFlops() {
  const char* text = getenv("PIPETRAIN_BENCH_SCALING_FLOPS");
  if (text == nullptr || *text == 0) return kDefaultDeviceFlops;
  double flops = 0;
  if (!absl::SimpleAtod(text, &flops) || !(flops > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scaling: PIPETRAIN_BENCH_SCALING_FLOPS must be a positive FLOP rate such as 1e11, not '",
        text, "'"));
  }
  return flops;
}

// Sequences per micro-batch: 1 (128 KiB frames), or PIPETRAIN_BENCH_SCALING_ROWS for
// larger frames (4: 512 KiB, past LinkShm::kMinTensorBytes, so that the same-host path
// carries them; raise PIPETRAIN_BENCH_SCALING_FLOPS as much to keep the actions' length).
absl::StatusOr<int> Rows() {
  const char* text = getenv("PIPETRAIN_BENCH_SCALING_ROWS");
  if (text == nullptr || *text == 0) return 1;
  int rows = 0;
  if (!absl::SimpleAtoi(text, &rows) || rows < 1 || rows > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scaling: PIPETRAIN_BENCH_SCALING_ROWS must be a row count from 1 to 64, not '", text,
        "'"));
  }
  return rows;
}

// The stages' --same-host-transport: auto (theirs), or PIPETRAIN_BENCH_SCALING_TRANSPORT.
absl::StatusOr<std::string> Transport() {
  const char* text = getenv("PIPETRAIN_BENCH_SCALING_TRANSPORT");
  if (text == nullptr || *text == 0) return std::string("auto");
  if (std::string(text) != "auto" && std::string(text) != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "scaling: PIPETRAIN_BENCH_SCALING_TRANSPORT must be auto or off, not '", text, "'"));
  }
  return std::string(text);
}

// Every schedule of the planner's table, in its order: a new one joins the table here.
std::vector<const char*> Schedules() {
  std::vector<const char*> names;
  for (const planner::ScheduleEntry& e : planner::ScheduleTable()) names.push_back(e.name);
  return names;
}

// A chunked schedule runs with the spec's default chunks (2), the others with 1.
int ChunksOf(const std::string& schedule) { return planner::DefaultChunks(schedule); }

// The planner's plan of one cell with the emulated costs; an error where it refuses.
absl::StatusOr<planner::Plan> PlanCell(int k, int m, const std::string& schedule,
                                       double flops, int rows) {
  planner::PlanOptions po;
  po.model = Model();
  po.stages = k;
  po.micro_batches = m;
  po.chunks = ChunksOf(schedule);
  ASSIGN_OR_RETURN(po.schedule, planner::ParseScheduleKind(schedule));
  po.batch_size = m * rows;
  po.device_flops = flops;
  po.link_bytes_per_s = kLinkBytesPerS;
  return planner::MakePlan(po);
}

std::string PartitionText(const planner::Plan& plan) {
  std::vector<std::string> stages;
  for (const planner::StagePlan& s : plan.stages) {
    std::vector<std::string> chunks;
    for (const auto& [b, e] : s.chunks) chunks.push_back(absl::StrCat(b, "-", e - 1));
    stages.push_back(absl::StrJoin(chunks, "+"));
  }
  return absl::StrJoin(stages, " | ");
}

struct CellRun {
  double tokens_per_s = 0;  // median after the warm-up step
  double step_s = 0;        // median step wall time after the warm-up step
  double bubble_measured = 0;
  // From the last step's measured timeline: where the time the simulator does not see
  // goes. A send holds its stage's executor while the frame is written (the simulator
  // charges the sender nothing), and a compute action sleeps a little over its model.
  double send_s = 0;              // mean SEND_* action
  double compute_overrun_s = 0;   // mean F/B/I/W action minus its modelled time
  std::string note;  // how the job ended, when not SUCCEEDED
};

// Reads `pipetrain timeline`'s Chrome trace of the last step for CellRun's send and
// overrun figures; the modelled action times come from the plan's costs.
absl::Status ReadTimeline(const std::string& trace_file, const planner::Plan& plan,
                          CellRun& run) {
  std::ifstream in(trace_file);
  const json trace = json::parse(in, nullptr, false);
  if (trace.is_discarded()) {
    return absl::InternalError(absl::StrCat("scaling: ", trace_file, " is not JSON"));
  }
  const json events = trace.is_object() ? trace.value("traceEvents", json::array()) : trace;
  double send_us = 0, overrun_us = 0;
  int sends = 0, computes = 0;
  for (const json& e : events) {
    if (e.value("ph", "") != "X") continue;
    const std::string name = e.value("name", "");
    const double dur_us = e.value("dur", 0.0);
    if (name.rfind("SEND_", 0) == 0) {
      send_us += dur_us;
      ++sends;
      continue;
    }
    const int stage = e.value("pid", -1);
    const int chunk = e.contains("args") ? e["args"].value("chunk", 0) : 0;
    if (name.empty() || stage < 0 || stage >= static_cast<int>(plan.costs.chunks.size()) ||
        chunk < 0 || chunk >= static_cast<int>(plan.costs.chunks[stage].size())) {
      continue;
    }
    const planner::ChunkCost& c = plan.costs.chunks[stage][chunk];
    double model_s = -1;
    if (name.size() > 1 && std::isdigit(static_cast<unsigned char>(name[1]))) {
      switch (name[0]) {
        case 'F': model_s = c.forward_s; break;
        case 'B': model_s = c.recompute_s + c.backward_input_s + c.backward_weight_s; break;
        case 'I': model_s = c.recompute_s + c.backward_input_s; break;
        case 'W': model_s = c.backward_weight_s; break;
      }
    }
    if (model_s < 0) continue;
    overrun_us += dur_us - model_s * 1e6;
    ++computes;
  }
  run.send_s = sends > 0 ? send_us / sends * 1e-6 : 0;
  run.compute_overrun_s = computes > 0 ? overrun_us / computes * 1e-6 : 0;
  return absl::OkStatus();
}

// Submits one job through the CLI, follows it to its end and reads its step records.
absl::StatusOr<CellRun> RunCell(testing::LocalCluster& cluster, const ScratchDir& dir, int k,
                                int m, const std::string& schedule, int reps, int rows,
                                const planner::Plan& plan) {
  const double sim_step_s = plan.simulation.step_time_s;
  const std::string cell = CellName(k, m, schedule);
  json pipeline = {{"stages", k}, {"micro_batches", m}, {"schedule", schedule}};
  if (ChunksOf(schedule) > 1) pipeline["chunks"] = ChunksOf(schedule);
  const model::TransformerConfig mc = Model();
  const json spec = {
      {"name", absl::StrCat("scaling-", cell)},
      {"model", {{"vocab_size", mc.vocab_size}, {"seq_len", mc.seq_len}, {"d_model", mc.d_model},
                 {"n_heads", mc.n_heads}, {"n_layers", mc.n_layers}}},
      {"pipeline", pipeline},
      {"training", {{"steps", reps + 1}, {"batch_size", m * rows}, {"seed", 1}, {"lr", 1e-3}}},
      {"data", {{"corpus", dir.File("corpus.txt")}, {"validate_every_steps", 0}}},
      {"checkpoint", {{"every_steps", 0}}}};
  const std::string spec_file = dir.File(cell + ".json");
  RETURN_IF_ERROR(common::WriteFileAtomically(spec_file, spec.dump(2)));
  // Following the job (one watching CLI process) rather than polling keeps extra
  // processes off the two cores while the step runs.
  const auto deadline = std::chrono::milliseconds(
      static_cast<int64_t>(60e3 + 10e3 * sim_step_s * (reps + 1)));
  ASSIGN_OR_RETURN(testing::RunResult submitted, cluster.Cli({"submit", spec_file}, deadline));
  const size_t at = submitted.out.find("submitted job-");
  if (at == std::string::npos) {
    return absl::InternalError(absl::StrCat("scaling: ", cell, ": pipetrain submit exited ",
                                            submitted.exit_code, " without a job: ",
                                            submitted.out, submitted.err));
  }
  std::string id = submitted.out.substr(at + 10);
  id = id.substr(0, id.find_first_of(" \n"));
  ASSIGN_OR_RETURN(testing::RunResult status, cluster.Cli({"status", id, "--json"}));
  const json job = json::parse(status.out, nullptr, false);
  if (status.exit_code != 0 || job.is_discarded()) {
    return absl::InternalError(absl::StrCat("scaling: ", cell, ": pipetrain status ", id,
                                            " --json failed: ", status.err));
  }
  const json history = job.value("history", json::array());
  CellRun run;
  const std::string state = job.value("state", "");
  if (state != "SUCCEEDED") run.note = absl::StrCat(state, ": ", job.value("reason", ""));
  // An emulated stage holds no weights, so the end-of-job checkpoint fails after the
  // last step has been recorded: the steps still count. Anything short of them is an
  // error of the run.
  if (static_cast<int>(history.size()) < reps + 1) {
    return absl::InternalError(absl::StrCat("scaling: job ", id, " (", cell, ") recorded ",
                                            history.size(), " of ", reps + 1, " steps; ", state,
                                            ": ", job.value("reason", "")));
  }
  std::vector<double> tokens, steps, bubbles;
  for (size_t i = 1; i < history.size(); ++i) {  // step 1 warms up links and pools
    tokens.push_back(history[i].value("tokens_per_s", 0.0));
    steps.push_back(history[i].value("step_time_s", 0.0));
    bubbles.push_back(history[i].value("bubble_measured", 0.0));
  }
  run.tokens_per_s = Median(tokens);
  run.step_s = Median(steps);
  run.bubble_measured = Median(bubbles);
  const std::string trace_file = dir.File(cell + ".trace.json");
  ASSIGN_OR_RETURN(testing::RunResult timeline,
                   cluster.Cli({"timeline", id, "--out", trace_file, "--steps", "1"}));
  if (timeline.exit_code != 0) {
    return absl::InternalError(absl::StrCat("scaling: ", cell, ": pipetrain timeline ", id,
                                            " failed: ", timeline.err));
  }
  RETURN_IF_ERROR(ReadTimeline(trace_file, plan, run));
  return run;
}

}  // namespace

absl::StatusOr<BenchResult> RunScalingBench(const BenchOptions& options) {
  const int reps = options.repetitions > 0 ? options.repetitions : 3;
  ASSIGN_OR_RETURN(const double flops, DeviceFlops());
  ASSIGN_OR_RETURN(const int rows, Rows());
  ASSIGN_OR_RETURN(const std::string transport, Transport());
  // Plan every cell first: the planner's refusals are the cells to skip, and its
  // simulated steps are the bounds.
  std::vector<ScalingPrediction> predicted;
  std::map<std::string, double> sim_step;
  std::map<std::string, planner::Plan> plans;
  std::vector<std::string> skipped, k1_differs;
  std::string partition8, partition8_interleaved;
  for (int m : kMicroBatchCounts) {
    double k1_gpipe = 0;
    for (int k : kStageCounts) {
      for (const char* s : Schedules()) {
        absl::StatusOr<planner::Plan> plan = PlanCell(k, m, s, flops, rows);
        if (!plan.ok()) {
          skipped.push_back(absl::StrCat(CellName(k, m, s), " (", plan.status().message(), ")"));
          continue;
        }
        const double step = plan->simulation.step_time_s;
        if (k == 1 && std::string(s) == kBaselineSchedule) k1_gpipe = step;
        if (k == 1 && std::abs(step / k1_gpipe - 1) > 1e-3) {
          k1_differs.push_back(absl::StrFormat("%s %.4f s vs %.4f s", s, step, k1_gpipe));
        }
        if (k == kMaxStages && m == 32) {
          if (std::string(s) == "1f1b") partition8 = PartitionText(*plan);
          if (std::string(s) == "interleaved") partition8_interleaved = PartitionText(*plan);
        }
        predicted.push_back({k, m, s, step});
        sim_step[CellName(k, m, s)] = step;
        plans.emplace(CellName(k, m, s), *std::move(plan));
      }
    }
  }

  ASSIGN_OR_RETURN(ScratchDir dir, ScratchDir::Make("scaling"));
  // The end-to-end tests' deterministic English-like text; its bytes are the tokens.
  RETURN_IF_ERROR(common::WriteFileAtomically(dir.File("corpus.txt"), testing::EnglishLikeCorpus(200000)));
  std::cerr << "scaling: starting a coordinator and " << kMaxStages
            << " stages on --device emulated:" << flops << " --same-host-transport " << transport
            << "\n";
  testing::LocalClusterOptions co;
  co.stage_args = {"--device", absl::StrCat("emulated:", flops),  // the last --device wins
                   "--same-host-transport", transport};
  co.security = options.security;
  ASSIGN_OR_RETURN(std::unique_ptr<testing::LocalCluster> cluster,
                   testing::LocalCluster::Start(dir.File("state"), kMaxStages, co));

  const auto started = std::chrono::steady_clock::now();
  std::vector<ScalingMeasurement> measured;
  std::map<std::string, CellRun> runs;
  std::string job_end;  // how the first job that did not succeed ended
  for (int m : kMicroBatchCounts) {
    for (int k : kStageCounts) {
      for (const char* s : Schedules()) {
        const std::string cell = CellName(k, m, s);
        if (!sim_step.count(cell)) continue;  // refused by the planner
        if (k == 1 && std::string(s) != kBaselineSchedule) continue;
        ASSIGN_OR_RETURN(CellRun run, RunCell(*cluster, dir, k, m, s, reps, rows, plans.at(cell)));
        std::cerr << absl::StrFormat(
            "scaling: %-20s %9.0f tokens/s  step %7.1f ms (simulated %7.1f)  bubble %.3f  "
            "send %.0f us  compute overrun %.0f us%s\n",
            cell, run.tokens_per_s, run.step_s * 1e3, sim_step[cell] * 1e3, run.bubble_measured,
            run.send_s * 1e6, run.compute_overrun_s * 1e6,
            run.note.empty() ? "" : "  [" + run.note + "]");
        if (job_end.empty()) job_end = run.note;
        measured.push_back({k, m, s, run.tokens_per_s});
        runs[cell] = run;
      }
    }
  }
  const double wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  cluster.reset();

  ASSIGN_OR_RETURN(std::vector<ScalingRow> table,
                   BuildScalingTable(measured, predicted, kBaselineSchedule));
  const TargetCheck speed = CheckSpeedupTarget(table, kSpeedupTarget);
  const TargetCheck kept = CheckKeptAdvantageTarget(table, kKeptAdvantageTarget);
  std::cerr << "scaling: " << speed.Line() << "\nscaling: " << kept.Line() << "\n";
  const std::string data = ScalingDataText(table);
  if (const char* out = getenv("PIPETRAIN_BENCH_DATA_OUT"); out && *out) {
    RETURN_IF_ERROR(common::WriteFileAtomically(out, data));
    std::cerr << "scaling: wrote the table to " << out << " (PIPETRAIN_BENCH_DATA_OUT)\n";
  }

  BenchResult result;
  result.Label("device", absl::StrFormat("emulated:%g (no arithmetic; each action sleeps its "
                                         "modelled time; every measured figure is emulated)",
                                         flops));
  result.Label("model", absl::StrFormat("d_model %d, %d blocks, %d heads, seq %d, byte vocabulary; "
                                        "%d row(s) a micro-batch, batch_size = M x %d",
                                        Model().d_model, Model().n_layers, Model().n_heads,
                                        Model().seq_len, rows, rows));
  result.Label("transport", absl::StrCat("--same-host-transport ", transport,
                                         " (links between the stages, all on this host)"));
  result.Label("partition_k8", partition8);
  result.Label("partition_k8_interleaved", partition8_interleaved);
  result.Label("baseline", absl::StrCat(
      "speedup = tokens/s over the K = 1 ", kBaselineSchedule, " run at the same M; ",
      k1_differs.empty() ? "every schedule's K = 1 program simulates to the same step"
                         : "K = 1 simulated steps differ: " + absl::StrJoin(k1_differs, "; ")));
  result.Label("bound", "speedup the planner's simulator predicts for the schedule (same emulated "
                        "costs, links 1 GB/s): simulated step at K = 1 / at K");
  result.Label("skipped", skipped.empty() ? "none" : absl::StrJoin(skipped, "; "));
  if (!job_end.empty()) result.Label("job_end", "jobs end after their last step with: " + job_end);
  // Medians over the cells, so that one step slowed by another build's burst of CPU
  // does not stand for the runtime.
  std::vector<double> sends, overruns;
  for (const auto& [cell, run] : runs) {
    if (run.send_s <= 0) continue;  // K = 1 sends nothing
    sends.push_back(run.send_s);
    overruns.push_back(run.compute_overrun_s);
  }
  if (!sends.empty()) {
    result.Label("runtime_costs", absl::StrFormat(
        "what the simulator does not model, median over the K > 1 cells' last steps: a SEND "
        "holds its stage for %.0f us (%.0f KiB frames; the simulator charges the sender "
        "nothing), a compute action runs %.0f us over its modelled time",
        Median(sends) * 1e6, Model().seq_len * Model().d_model * rows * 4 / 1024.0,
        Median(overruns) * 1e6));
  }
  result.Label("target_speedup", speed.Line());
  result.Label("target_kept_advantage", kept.Line());
  result.Label("paper", "paper_gpipe_* are GPipe's published K = 8 figures (real compute on "
                        "accelerators), for comparison; all other figures are emulated");
  result.Label("table", data);
  result.Add("repetitions", reps);
  result.Add("wall_s", wall_s);
  for (const auto& [m, v] : kPaperK8) result.Add(absl::StrCat("paper_gpipe_k8_m", m, "_speedup"), v);
  for (const ScalingRow& r : table) {
    const std::string cell = CellName(r.k, r.m, r.schedule);
    const CellRun& run = runs[cell];
    result.Add(cell + "_speedup", r.measured_speedup);
    result.Add(cell + "_ideal", r.ideal);
    result.Add(cell + "_bound", r.bound);
    result.Add(cell + "_over_ideal", r.efficiency_ideal);
    result.Add(cell + "_over_bound", r.efficiency_bound);
    if (r.kept_advantage) result.Add(cell + "_kept_advantage", *r.kept_advantage);
    result.Add(cell + "_tokens_per_s", r.tokens_per_s);
    result.Add(cell + "_step_over_simulated", run.step_s / sim_step[cell]);
    if (r.k > 1) result.Add(cell + "_send_us", run.send_s * 1e6);
    result.Add(cell + "_compute_overrun_us", run.compute_overrun_s * 1e6);
  }
  result.Add("targets_missed", static_cast<double>(speed.misses.size() + kept.misses.size()));
  return result;
}

}  // namespace pipetrain::bench
