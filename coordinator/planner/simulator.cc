#include "coordinator/planner/simulator.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::planner {

using schedule::Action;
using schedule::ActionKind;

CostModel EqualStageCost(int stages, int chunks) {
  ChunkCost c;
  c.forward_s = 1.0 / chunks;
  c.backward_input_s = 1.0 / chunks;
  c.backward_weight_s = 1.0 / chunks;
  CostModel m;
  m.chunks.assign(stages, std::vector<ChunkCost>(chunks, c));
  return m;
}

namespace {

// The cost model's shape against the programs': per stage and chunk, and per stage
// where it is given per stage.
absl::Status CheckCosts(const schedule::Schedule& programs, const CostModel& costs) {
  const int k = static_cast<int>(programs.size()), v = programs[0].num_chunks;
  if (static_cast<int>(costs.chunks.size()) != k) {
    return absl::InvalidArgumentError(
        absl::StrCat("simulate: costs for ", costs.chunks.size(), " stages, schedule has ", k));
  }
  for (int s = 0; s < k; ++s) {
    if (static_cast<int>(costs.chunks[s].size()) != v) {
      return absl::InvalidArgumentError(absl::StrCat("simulate: stage ", s, " has costs for ",
                                                     costs.chunks[s].size(), " chunks, not ", v));
    }
  }
  auto per_stage = [&](size_t n, const char* what) {
    if (n == 0 || static_cast<int>(n) == k) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("simulate: ", what, " costs for ", n, " stages, schedule has ", k));
  };
  RETURN_IF_ERROR(per_stage(costs.optimizer_stage_s.size(), "optimizer"));
  RETURN_IF_ERROR(per_stage(costs.allreduce_stage_s.size(), "all-reduce"));
  RETURN_IF_ERROR(per_stage(costs.device_of_stage.size(), "device"));
  for (int d : costs.device_of_stage) {
    if (d < 0 || d >= static_cast<int>(costs.device_slots.size()) || costs.device_slots[d] < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "simulate: device ", d, " has no slots (", costs.device_slots.size(), " devices)"));
    }
  }
  return absl::OkStatus();
}

// When each slot of each shared device is next free. A stage with a device of its own
// (no device given, or one with as many slots as stages) never waits.
class DeviceSlots {
 public:
  explicit DeviceSlots(const CostModel& costs) : device_of_stage_(costs.device_of_stage) {
    std::vector<int> stages(costs.device_slots.size(), 0);
    for (int d : device_of_stage_) ++stages[d];
    for (size_t d = 0; d < stages.size(); ++d) {
      const int used = std::min(stages[d], costs.device_slots[d]);
      capacity_ += used;
      free_at_.emplace_back(stages[d] > costs.device_slots[d] ? used : 0, 0.0);
      shared_ = shared_ || stages[d] > costs.device_slots[d];
    }
  }
  bool shared() const { return shared_; }
  // The stages that can compute at once (0 without devices: the caller's K).
  int capacity() const { return capacity_; }
  // The earliest `stage` can start computing at or after `at`, and the slot it takes.
  std::pair<double, int> Earliest(int stage, double at) const {
    if (device_of_stage_.empty() || free_at_[device_of_stage_[stage]].empty()) return {at, -1};
    const std::vector<double>& slots = free_at_[device_of_stage_[stage]];
    const auto first = std::min_element(slots.begin(), slots.end());
    return {std::max(at, *first), static_cast<int>(first - slots.begin())};
  }
  void Take(int stage, int slot, double until) {
    if (slot >= 0) free_at_[device_of_stage_[stage]][slot] = until;
  }

 private:
  std::vector<int> device_of_stage_;
  std::vector<std::vector<double>> free_at_;  // [device][slot]; empty: not shared
  int capacity_ = 0;
  bool shared_ = false;
};

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const schedule::Schedule& programs,
                                          const CostModel& costs) {
  const int k = static_cast<int>(programs.size());
  if (k == 0) return absl::InvalidArgumentError("simulate: no stages");
  RETURN_IF_ERROR(CheckCosts(programs, costs));
  const int m = programs[0].num_micro_batches, v = programs[0].num_chunks;
  DeviceSlots devices(costs);
  const int vj = k * v;
  const schedule::Topology topology = programs[0].topology();
  // A hand-off between two chunks of one stage takes no transfer time.
  auto transfer_s = [&](int from_j, int to_j, double link_s) {
    return topology.HopAfter(std::min(from_j, to_j)) == schedule::Hop::kSelf ? 0.0 : link_s;
  };
  // Arrival time of the activation into / gradient out of virtual stage j; -1 = unsent.
  std::vector<std::vector<double>> act_at(vj, std::vector<double>(m, -1)), grad_at = act_at;
  SimulationResult r;
  r.busy_s.assign(k, 0);
  r.peak_activation_bytes.assign(k, 0);
  std::vector<double> clock(k, 0), held(k, 0);
  std::vector<size_t> pc(k, 0);
  // Per stage: the index of its last B or W (after which its gradients are final; -1 =
  // none), when its reduction ends, and how long its optimizer step waited for it.
  std::vector<int> last_gradient(k, -1);
  std::vector<double> reduce_end(k, 0), reduce_wait(k, 0);
  const bool reduces = !costs.allreduce_stage_s.empty();
  if (reduces) {
    for (int s = 0; s < k; ++s) {
      for (int i = 0; i < static_cast<int>(programs[s].actions.size()); ++i) {
        const ActionKind kind = programs[s].actions[i].kind;
        if (kind == ActionKind::kBackward || kind == ActionKind::kBackwardWeight) {
          last_gradient[s] = i;
        }
      }
    }
  }

  // The simulator trusts a validated schedule for order, but never indexes out of range.
  for (int s = 0; s < k; ++s) {
    for (const Action& a : programs[s].actions) {
      const int j = topology.Virtual(s, a.chunk);
      const bool needs_prev = a.kind == ActionKind::kRecvActivation;
      const bool needs_next = a.kind == ActionKind::kRecvGradient;
      if (a.micro_batch < 0 || a.micro_batch >= m || a.chunk < 0 || a.chunk >= v ||
          (needs_prev && j == 0) || (needs_next && j == vj - 1)) {
        return absl::InvalidArgumentError(
            absl::StrCat("simulate: stage ", s, " action ", schedule::ToString(a),
                         " is out of range; validate the schedule first"));
      }
    }
  }

  // When a receive's tensor arrives, -1 while it is unsent; 0 for every other action,
  // which can always run.
  auto arrival = [&](int s, const Action& a) {
    const int j = topology.Virtual(s, a.chunk);
    if (a.kind == ActionKind::kRecvActivation) return act_at[j - 1][a.micro_batch];
    if (a.kind == ActionKind::kRecvGradient) return grad_at[j + 1][a.micro_batch];
    return 0.0;
  };
  auto run = [&](int s, const Action& a) -> bool {
    const int j = topology.Virtual(s, a.chunk);
    const ChunkCost* c = a.kind == ActionKind::kOptimizerStep ? nullptr : &costs.chunks[s][a.chunk];
    const bool computes = schedule::IsCompute(a.kind) || a.kind == ActionKind::kOptimizerStep;
    int slot = -1;
    double start = clock[s], end = start;
    if (computes) std::tie(start, slot) = devices.Earliest(s, start);
    switch (a.kind) {
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient: {
        const double at = arrival(s, a);
        if (at < 0) return false;
        end = std::max(start, at) + c->recv_busy_s;
        break;
      }
      case ActionKind::kSendActivation:
        end = start + c->send_busy_s;
        act_at[j][a.micro_batch] = start + transfer_s(j, j + 1, c->send_activation_s);
        break;
      case ActionKind::kSendGradient:
        end = start + c->send_busy_s;
        grad_at[j][a.micro_batch] = start + transfer_s(j, j - 1, c->send_gradient_s);
        break;
      case ActionKind::kForward:
        end = start + c->forward_s;
        held[s] += c->stored_bytes;
        // Recomputing, the forward's whole stash exists until the forward ends.
        r.peak_activation_bytes[s] =
            std::max(r.peak_activation_bytes[s], held[s] + c->backward_extra_bytes);
        // An evaluation keeps nothing past its forward (the peak above bounds what it
        // holds meanwhile: it frees each layer's stash as the next one runs).
        if (programs[s].forward_only) held[s] -= c->stored_bytes;
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
        end = start + c->recompute_s + c->backward_input_s +
              (a.kind == ActionKind::kBackward ? c->backward_weight_s : 0);
        r.peak_activation_bytes[s] =
            std::max(r.peak_activation_bytes[s], held[s] + c->backward_extra_bytes);
        if (a.kind == ActionKind::kBackward) {
          held[s] -= c->stored_bytes;
        } else {
          // The rebuilt activations and I's gradients stay until W.
          held[s] += c->backward_extra_bytes + c->weight_grad_bytes;
          r.peak_activation_bytes[s] = std::max(r.peak_activation_bytes[s], held[s]);
        }
        break;
      case ActionKind::kBackwardWeight:
        end = start + c->backward_weight_s;
        held[s] -= c->stored_bytes + c->backward_extra_bytes + c->weight_grad_bytes;
        break;
      case ActionKind::kOptimizerStep:
        // The step applies the reduced gradients: it waits for the stage's all-reduce.
        if (last_gradient[s] >= 0 && reduce_end[s] > start) {
          reduce_wait[s] = reduce_end[s] - start;
          start = reduce_end[s];
        }
        end = start + (costs.optimizer_stage_s.empty() ? costs.optimizer_s
                                                       : costs.optimizer_stage_s[s]);
        break;
    }
    if (computes) {
      const double drawn = costs.draw_compute_s ? costs.draw_compute_s(s, a) : -1;
      if (drawn >= 0) end = start + drawn;
      r.busy_s[s] += end - start;
      devices.Take(s, slot, end);
    }
    r.events.push_back({s, a, start, end});
    clock[s] = end;
    if (static_cast<int>(pc[s]) == last_gradient[s]) {
      reduce_end[s] = end + costs.allreduce_stage_s[s];
      r.reductions.push_back({s, end, reduce_end[s], 0});
    }
    return true;
  };

  if (!devices.shared()) {
    // Each stage's times depend only on its own clock and the arrivals: any order of
    // running them gives the same timeline, and stage by stage is the cheapest.
    for (bool progress = true; progress;) {
      progress = false;
      for (int s = 0; s < k; ++s) {
        while (pc[s] < programs[s].actions.size() && run(s, programs[s].actions[pc[s]])) {
          ++pc[s];
          progress = true;
        }
      }
    }
  } else {
    // Slots go to the earliest asker: run the action whose stage got to it first (the
    // lowest stage on a tie), among those whose input has been sent.
    for (;;) {
      int next = -1;
      for (int s = 0; s < k; ++s) {
        if (pc[s] >= programs[s].actions.size() || arrival(s, programs[s].actions[pc[s]]) < 0) {
          continue;
        }
        if (next < 0 || clock[s] < clock[next]) next = s;
      }
      if (next < 0) break;
      run(next, programs[next].actions[pc[next]]);
      ++pc[next];
    }
  }
  for (int s = 0; s < k; ++s) {
    if (pc[s] < programs[s].actions.size()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "simulate: deadlock at stage ", s, " position ", pc[s], " (",
          schedule::ToString(programs[s].actions[pc[s]]), "); validate the schedule first"));
    }
  }
  std::stable_sort(r.events.begin(), r.events.end(),
                   [](const auto& a, const auto& b) { return a.stage < b.stage; });
  // Without the reductions every stage would end as much earlier as its optimizer step
  // waited: that step is each program's last action, so nothing else waited on them.
  // A program without one (not a training step) still ends only once its reduction has.
  for (int s = 0; s < k; ++s) {
    r.step_time_without_reduction_s =
        std::max(r.step_time_without_reduction_s, clock[s] - reduce_wait[s]);
    if (last_gradient[s] >= 0) clock[s] = std::max(clock[s], reduce_end[s]);
  }
  r.step_time_s = *std::max_element(clock.begin(), clock.end());
  std::sort(r.reductions.begin(), r.reductions.end(),
            [](const ReductionEvent& a, const ReductionEvent& b) { return a.stage < b.stage; });
  for (ReductionEvent& e : r.reductions) {
    const double length = e.end_s - e.start_s;
    if (length <= 0) continue;
    // How far this stage now ends past the step without reductions is what its
    // reduction adds to the step (at most its whole length).
    const double exposed =
        std::clamp(clock[e.stage] - r.step_time_without_reduction_s, 0.0, length);
    e.hidden_fraction = 1.0 - exposed / length;
  }
  double busy = 0;
  for (double b : r.busy_s) busy += b;
  const int capacity = devices.capacity() > 0 ? devices.capacity() : k;
  r.bubble_fraction = r.step_time_s > 0 ? 1.0 - busy / (capacity * r.step_time_s) : 0;
  return r;
}

}  // namespace pipetrain::planner
