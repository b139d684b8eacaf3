#include "coordinator/planner/plan_report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/byte_format.h"
#include "common/model/state_bytes.h"
#include "nlohmann/json.hpp"

namespace pipetrain::planner {
namespace {

using ::pipetrain::common::FormatBytes;

std::string Count(double n) {
  if (n >= 1e9) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1e6) return absl::StrFormat("%.2fM", n / 1e6);
  if (n >= 1e3) return absl::StrFormat("%.1fK", n / 1e3);
  return absl::StrFormat("%.0f", n);
}

std::string Layers(const Plan& plan, const StagePlan& sp) {
  std::string out;
  for (auto [b, e] : sp.chunks) {
    if (!out.empty()) out += ", ";
    out += e - b == 1 ? model::LayerName(plan.options.model, b)
                      : absl::StrCat(model::LayerName(plan.options.model, b), " .. ",
                                     model::LayerName(plan.options.model, e - 1));
  }
  return out;
}

// Stage s's gradient all-reduce in a simulation, or nullptr (one replica).
const ReductionEvent* ReductionOf(const SimulationResult& sim, int stage) {
  for (const ReductionEvent& e : sim.reductions) {
    if (e.stage == stage) return &e;
  }
  return nullptr;
}

}  // namespace

std::string RenderPicture(const SimulationResult& sim, int stages, int max_columns) {
  double slot = 0;
  size_t width = 1;
  for (const TimelineEvent& e : sim.events) {
    if (!schedule::IsCompute(e.action.kind) || e.end_s <= e.start_s) continue;
    const double d = e.end_s - e.start_s;
    slot = slot == 0 ? d : std::min(slot, d);
    width = std::max(width, schedule::ToString(e.action).size());
  }
  if (slot == 0) return "(no compute actions)\n";
  int columns = static_cast<int>(std::ceil(sim.step_time_s / slot - 1e-9));
  if (columns > max_columns) {
    slot = sim.step_time_s / max_columns;
    columns = max_columns;
  }
  using Grid = std::vector<std::vector<std::string>>;
  Grid grid(stages, std::vector<std::string>(columns, "."));
  // The gradient all-reduce's own lane under each stage, drawn only when there is one.
  Grid reduce(stages, std::vector<std::string>(columns, " "));
  auto fill = [&](Grid& g, int stage, double start_s, double end_s, const std::string& label) {
    if (stage < 0 || stage >= stages) return;
    int first = static_cast<int>(std::lround(start_s / slot));
    int last = std::max(first + 1, static_cast<int>(std::lround(end_s / slot)));
    for (int c = std::max(first, 0); c < std::min(last, columns); ++c) g[stage][c] = label;
  };
  for (const TimelineEvent& e : sim.events) {
    if (!schedule::IsCompute(e.action.kind)) continue;
    fill(grid, e.stage, e.start_s, e.end_s, schedule::ToString(e.action));
  }
  width = std::max(width, std::string("AR").size());
  for (const ReductionEvent& e : sim.reductions) {
    if (e.end_s > e.start_s) fill(reduce, e.stage, e.start_s, e.end_s, "AR");
  }
  auto row_text = [&](std::string row, const std::vector<std::string>& cells) {
    for (const std::string& cell : cells) row += " " + cell + std::string(width - cell.size(), ' ');
    while (!row.empty() && row.back() == ' ') row.pop_back();
    return row + "\n";
  };
  std::string out;
  for (int s = 0; s < stages; ++s) {
    out += row_text(absl::StrFormat("stage %-2d|", s), grid[s]);
    if (ReductionOf(sim, s) != nullptr) out += row_text("  reduce|", reduce[s]);
  }
  return out;
}

std::string RenderPlanText(const Plan& plan) {
  const PlanOptions& o = plan.options;
  // With replicas the batch is the global one; the layout line gives each replica's share.
  const std::string batch =
      o.replicas > 1 ? absl::StrFormat("batch %d sequences", o.batch_size)
                     : absl::StrFormat("batch %d sequences (%d per micro-batch)", o.batch_size,
                                       o.batch_size / o.micro_batches);
  std::string out = absl::StrFormat(
      "Plan: %s schedule, K=%d stages, M=%d micro-batches%s, recompute %s, precision %s\n"
      "Model: %d blocks, d_model %d, %d heads, seq_len %d, vocab %d%s; %s\n",
      ScheduleLabel(o), o.stages, o.micro_batches,
      o.chunks > 1 ? absl::StrCat(", v=", o.chunks, " chunks per stage") : "",
      RecomputeName(o.recompute), o.precision, o.model.n_layers, o.model.d_model, o.model.n_heads,
      o.model.seq_len, o.model.vocab_size,
      // Each holder of the shared matrix keeps it (and its gradient and moments).
      o.model.tie_embeddings ? " (tied embeddings: first and last stage each hold wte)" : "",
      batch);
  const model::PrecisionBytes bytes = PrecisionBytesOf(o);
  out += absl::StrFormat(
      "Precision %s: %d bytes of state a parameter; an activation element %d bytes stored "
      "for the backward (%d if kept only for its products), %d between stages\n",
      o.precision, bytes.per_parameter, bytes.activation_stored,
      bytes.activation_stored_for_products, bytes.activation_wire);
  if (o.replicas > 1) {
    out += absl::StrFormat(
        "Layout: %d replicas x %d stages = %d stage servers; per replica %d sequences in %d "
        "micro-batches of %d\n",
        o.replicas, o.stages, o.replicas * o.stages, o.replica_batch_size(), o.micro_batches,
        o.replica_batch_size() / o.micro_batches);
    PlanOptions split = o, whole = o;
    split.shard_optimizer = true;
    whole.shard_optimizer = false;
    out += absl::StrFormat(
        "Optimizer %s the %d copies of each stage (pipeline.shard_optimizer %s): %g bytes of "
        "state a parameter split (AdamW's two moments for 1/%d of it), %g whole\n",
        o.splits() ? "split among" : "whole on each of", o.replicas,
        o.splits() ? "true" : "false", StateBytesPerParam(split), o.replicas,
        StateBytesPerParam(whole));
  }
  if (o.equal_stage_cost) {
    out +=
        "Costs: equal stage costs (forward 1 unit, backward 2 units = I 1 + W 1, free "
        "transfer); times below are in units of one stage forward\n";
  } else if (o.rates) {
    out += absl::StrFormat(
        "Costs: measured on a job's %d latest steps (--costs-from), optimizer step counted\n",
        o.rates->steps);
  } else {
    out += absl::StrFormat(
        "Costs: analytic FLOPs at %g TFLOP/s per device (--device-flops), links at %g GB/s "
        "(--link-gbps), optimizer step not counted\n",
        o.device_flops / 1e12, o.link_bytes_per_s / 1e9);
  }
  if (std::any_of(plan.stages.begin(), plan.stages.end(),
                  [](const StagePlan& sp) { return sp.speed != 1; })) {
    std::vector<std::string> speeds;
    for (const StagePlan& sp : plan.stages) speeds.push_back(absl::StrFormat("%.3g", sp.speed));
    out += absl::StrCat("Speeds: ", absl::StrJoin(speeds, ", "),
                        " (stage by stage, against the costs above; the layers are split by "
                        "them)\n");
  }
  if (!plan.sharing.empty()) {
    out += absl::StrCat("Devices: ", plan.sharing,
                        "; stages on one device take turns computing\n");
  }
  out += absl::StrFormat(
      "\nPartition (state = weights + gradients + AdamW moments%s%s, %g bytes per parameter",
      o.splits() ? absl::StrFormat(" (1/%d of them)", o.replicas) : "",
      bytes.per_parameter > model::StateBytesPerParam() ? " + the products' copy" : "",
      StateBytesPerParam(o));
  if (o.snapshots) {
    out += absl::StrFormat(
        "; snapshots = %d steps x %g bytes per parameter, own and the ring predecessor's):\n",
        kSnapshotSteps, SnapshotBytesPerParam());
  } else {
    out += "; in-memory snapshots off):\n";
  }
  // The tables column only for a family whose chunks share some (Llama's rotary angles).
  const bool tables = std::any_of(plan.stages.begin(), plan.stages.end(),
                                  [](const StagePlan& sp) { return sp.table_bytes > 0; });
  out += absl::StrFormat("  %-6s %-28s %10s %12s ", "stage", "layers", "params", "state");
  if (tables) out += absl::StrFormat("%12s ", "tables");
  out += absl::StrFormat("%12s %12s %12s %10s\n", "snapshots", "activations", "memory",
                         "in-flight");
  for (const StagePlan& sp : plan.stages) {
    out += absl::StrFormat("  %-6d %-28s %10s %12s ", sp.stage, Layers(plan, sp),
                           Count(static_cast<double>(sp.params)), FormatBytes(sp.state_bytes));
    if (tables) out += absl::StrFormat("%12s ", FormatBytes(sp.table_bytes));
    out += absl::StrFormat("%12s %12s %12s %10d%s\n", FormatBytes(sp.snapshot_bytes),
                           FormatBytes(sp.peak_activation_bytes),
                           FormatBytes(sp.peak_memory_bytes()), sp.max_in_flight,
                           sp.recomputes_any() ? "  (recompute)" : "");
  }
  if (tables) {
    out += "  (tables: what each chunk's layers share and only read, such as Llama's rotary "
           "angles)\n";
  }
  const char* unit = o.equal_stage_cost ? " units" : " s";
  const SimulationResult& sim = plan.simulation;
  if (o.replicas > 1 && o.equal_stage_cost) {
    out += absl::StrFormat(
        "\nGradient all-reduce between the %d copies of each stage: free with equal stage costs "
        "(as the links are); plan without --equal-stage-cost for its time\n",
        o.replicas);
  } else if (o.replicas > 1) {
    out += absl::StrFormat(
        "\nGradient all-reduce between the %d copies of each stage (ring: 2(R-1)/R x 4 bytes "
        "per parameter at %g GB/s%s, + %g us a call; on its own lane after the stage's last "
        "B/W, before its optimizer step):\n",
        o.replicas, o.collective_rate() / 1e9,
        o.collective_bytes_per_s > 0 ? " (--collective-gbps)" : ", the links' rate",
        kAllReduceCallLatencyS * 1e6);
    out += absl::StrFormat("  %-6s %12s %12s %8s\n", "stage", "gradients", "time", "hidden");
    for (const StagePlan& sp : plan.stages) {
      const ReductionEvent* e = ReductionOf(sim, sp.stage);
      out += absl::StrFormat("  %-6d %12s %10.4g%s %7.0f%%\n", sp.stage,
                             FormatBytes(sp.allreduce_bytes), sp.allreduce_s, unit,
                             e ? 100 * e->hidden_fraction : 0.0);
    }
  }
  out += absl::StrFormat("\nPredicted step time: %.6g%s", sim.step_time_s, unit);
  out += sim.reductions.empty()
             ? "\n"
             : absl::StrFormat(" with the all-reduce (%.6g%s without it, +%.2f%%)\n",
                               sim.step_time_without_reduction_s, unit,
                               sim.step_time_without_reduction_s > 0
                                   ? 100 * (sim.step_time_s / sim.step_time_without_reduction_s - 1)
                                   : 0.0);
  out += o.schedule_program
             ? absl::StrFormat("Bubble fraction: %.4f simulated (a schedule file has no "
                               "textbook formula)\n",
                               plan.simulation.bubble_fraction)
             : absl::StrFormat("Bubble fraction: %.4f simulated, %.4f textbook %s\n",
                               plan.simulation.bubble_fraction, plan.textbook_bubble,
                               TextbookFormula(o.schedule));
  out +=
      "\nSchedule (one column per time slot, '.' = idle; F forward, B backward, I/W its "
      "input/weight parts, @c model chunk";
  out += sim.reductions.empty() ? "):\n" : "; AR the stage's gradient all-reduce):\n";
  out += RenderPicture(plan.simulation, o.stages);
  return out;
}

std::string PlanJson(const Plan& plan) {
  nlohmann::json j;
  j["schedule"] = ScheduleLabel(plan.options);
  j["num_stages"] = plan.options.stages;
  j["micro_batches"] = plan.options.micro_batches;
  j["chunks"] = plan.options.chunks;
  j["recompute"] = RecomputeName(plan.options.recompute);
  j["precision"] = plan.options.precision;
  const model::PrecisionBytes bytes = PrecisionBytesOf(plan.options);
  j["precision_bytes"] = {{"per_parameter", bytes.per_parameter},
                          {"activation_stored", bytes.activation_stored},
                          {"activation_stored_for_products",
                           bytes.activation_stored_for_products},
                          {"activation_wire", bytes.activation_wire}};
  j["snapshots"] = plan.options.snapshots;
  j["time_unit"] = plan.options.equal_stage_cost ? "stage forward" : "s";
  j["device_flops"] = plan.options.device_flops;
  j["link_bytes_per_s"] = plan.options.link_bytes_per_s;
  j["replicas"] = plan.options.replicas;
  {
    PlanOptions split = plan.options, whole = plan.options;
    split.shard_optimizer = true;
    whole.shard_optimizer = false;
    j["shard_optimizer"] = plan.options.splits();
    j["state_bytes_per_param"] = StateBytesPerParam(plan.options);
    j["state_bytes_per_param_split"] = StateBytesPerParam(split);
    j["state_bytes_per_param_whole"] = StateBytesPerParam(whole);
  }
  j["collective_bytes_per_s"] = plan.options.collective_rate();
  if (plan.options.rates) {
    const CostRates& r = *plan.options.rates;
    j["measured_rates"] = {{"forward_s_per_flop", r.forward_s_per_flop},
                           {"backward_input_s_per_flop", r.backward_input_s_per_flop},
                           {"backward_weight_s_per_flop", r.backward_weight_s_per_flop},
                           {"optimizer_s_per_param", r.optimizer_s_per_param},
                           {"send_busy_s", r.send_busy_s},
                           {"recv_busy_s", r.recv_busy_s},
                           {"transfer_s_per_byte", r.transfer_s_per_byte},
                           {"steps", r.steps}};
  }
  j["stages"] = nlohmann::json::array();
  for (const StagePlan& sp : plan.stages) {
    nlohmann::json s;
    s["stage"] = sp.stage;
    s["layers"] = nlohmann::json::array();
    for (auto [b, e] : sp.chunks) s["layers"].push_back({b, e});
    s["params"] = sp.params;
    s["state_bytes"] = sp.state_bytes;
    s["table_bytes"] = sp.table_bytes;
    s["peak_activation_bytes"] = sp.peak_activation_bytes;
    s["snapshot_bytes"] = sp.snapshot_bytes;
    s["peak_memory_bytes"] = sp.peak_memory_bytes();
    s["max_in_flight"] = sp.max_in_flight;
    s["recompute"] = sp.recomputes_any();
    s["chunk_recompute"] = sp.chunk_recompute;
    const ReductionEvent* e = ReductionOf(plan.simulation, sp.stage);
    s["allreduce_bytes"] = sp.allreduce_bytes;
    s["allreduce_s"] = sp.allreduce_s;
    s["allreduce_hidden_fraction"] = e ? e->hidden_fraction : 0.0;
    s["shared_device"] = sp.shared_device;
    s["device_slowdown"] = sp.device_slowdown;
    s["speed"] = sp.speed;
    j["stages"].push_back(s);
  }
  j["device_sharing"] = plan.sharing;
  j["step_time_s"] = plan.simulation.step_time_s;
  j["step_time_without_allreduce_s"] = plan.simulation.step_time_without_reduction_s;
  j["bubble_fraction"] = plan.simulation.bubble_fraction;
  j["textbook_bubble"] = plan.textbook_bubble;
  j["peak_activation_bytes"] = plan.simulation.peak_activation_bytes;
  return j.dump(2);
}

std::string ChromeTrace(const SimulationResult& sim, int stages) {
  nlohmann::json events = nlohmann::json::array();
  for (int s = 0; s < stages; ++s) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", s},
                      {"tid", 0},
                      {"args", {{"name", absl::StrCat("stage ", s)}}}});
  }
  for (const TimelineEvent& e : sim.events) {
    const bool recv = e.action.kind == schedule::ActionKind::kRecvActivation ||
                      e.action.kind == schedule::ActionKind::kRecvGradient;
    // Sends and receives show where they take the stage's time (measured costs).
    const bool link = schedule::IsCommunication(e.action.kind);
    if (link && e.end_s <= e.start_s) continue;
    events.push_back({{"name", schedule::ToString(e.action)},
                      {"cat", recv ? "wait" : link ? "link" : "compute"},
                      {"ph", "X"},
                      {"pid", e.stage},
                      {"tid", 0},
                      {"ts", e.start_s * 1e6},
                      {"dur", (e.end_s - e.start_s) * 1e6}});
  }
  // Each stage's gradient all-reduce on its own track (tid 1) under the stage.
  for (const ReductionEvent& e : sim.reductions) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", e.stage},
                      {"tid", 1},
                      {"args", {{"name", "all-reduce"}}}});
    events.push_back({{"name", "all-reduce"},
                      {"cat", "allreduce"},
                      {"ph", "X"},
                      {"pid", e.stage},
                      {"tid", 1},
                      {"ts", e.start_s * 1e6},
                      {"dur", (e.end_s - e.start_s) * 1e6},
                      {"args", {{"hidden_fraction", e.hidden_fraction}}}});
  }
  nlohmann::json trace;
  trace["traceEvents"] = events;
  trace["displayTimeUnit"] = "ms";
  return trace.dump();
}

}  // namespace pipetrain::planner
