#include "coordinator/planner/cost_fit.h"

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/model/transformer_config.h"
#include "common/schedule/stage_program.h"
#include "common/status_macros.h"

namespace pipetrain::planner {

namespace pb = ::pipetrain::v1;
using schedule::Action;
using schedule::ActionKind;

void MeasuredCosts::Sum::Add(double s, double b) {
  seconds += s;
  bytes += b;
  ++count;
}

void MeasuredCosts::Sum::Add(const Sum& other) {
  seconds += other.seconds;
  bytes += other.bytes;
  count += other.count;
}

MeasuredCosts::MeasuredCosts(int stages, int chunks, int window, schedule::Placement placement)
    : stages_(stages), chunks_(chunks), window_(std::max(1, window)), placement_(placement) {}

absl::Status MeasuredCosts::AddStep(const std::vector<pb::TimelineEvent>& events) {
  StepSums sums;
  sums.chunk.resize(static_cast<size_t>(stages_) * chunks_ * kSlots);
  sums.optimizer.resize(stages_);
  const int vj = stages_ * chunks_;
  const schedule::Topology topology{stages_, chunks_, placement_};
  auto slot = [&](int s, int c, Slot k) -> Sum& {
    return sums.chunk[(static_cast<size_t>(s) * chunks_ + c) * kSlots + k];
  };
  // A message's key: kind, the sender's virtual stage, micro-batch.
  using Key = std::tuple<ActionKind, int, int>;
  std::map<Key, const pb::TimelineEvent*> sends;
  std::vector<std::pair<Action, const pb::TimelineEvent*>> receives;
  for (const pb::TimelineEvent& e : events) {
    absl::StatusOr<Action> a = schedule::ActionFromProto(e.action(), "action");
    const int s = e.stage();
    if (!a.ok() || s < 0 || s >= stages_ || a->chunk < 0 || a->chunk >= chunks_ ||
        e.end_us() < e.start_us()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "measured costs: step ", e.step(), " stage ", s, ": an event outside the job's ",
          stages_, " stages x ", chunks_, " chunks",
          a.ok() ? absl::StrCat(" (", schedule::ToString(*a), ")") : ""));
    }
    const double d = (e.end_us() - e.start_us()) * 1e-6;
    const int c = a->chunk, j = topology.Virtual(s, c);
    if (schedule::IsCompute(a->kind) || a->kind == ActionKind::kOptimizerStep) {
      sums.compute[{s, static_cast<int>(a->kind), a->micro_batch, c}] = d;
    }
    switch (a->kind) {
      case ActionKind::kForward: slot(s, c, kF).Add(d); break;
      case ActionKind::kBackward: slot(s, c, kB).Add(d); break;
      case ActionKind::kBackwardInput: slot(s, c, kI).Add(d); break;
      case ActionKind::kBackwardWeight: slot(s, c, kW).Add(d); break;
      case ActionKind::kOptimizerStep: sums.optimizer[s].Add(d); break;
      case ActionKind::kSendActivation:
      case ActionKind::kSendGradient:
        slot(s, c, kSend).Add(d, static_cast<double>(e.bytes()));
        sends[{a->kind, j, a->micro_batch}] = &e;
        break;
      case ActionKind::kRecvActivation:
      case ActionKind::kRecvGradient:
        receives.push_back({*a, &e});
        break;
    }
  }
  // A receive's end is the tensor's arrival where it began waiting before the send did;
  // one that began after the send ended found the tensor there (its time: the taking).
  for (const auto& [a, recv] : receives) {
    const int j = topology.Virtual(recv->stage(), a.chunk);
    const bool act = a.kind == ActionKind::kRecvActivation;
    const int from = act ? j - 1 : j + 1;
    if (from < 0 || from >= vj) continue;
    // A hand-off between chunks of one stage crosses no link: nothing to learn of links.
    if (topology.HopAfter(std::min(from, j)) == schedule::Hop::kSelf) continue;
    auto it = sends.find({act ? ActionKind::kSendActivation : ActionKind::kSendGradient, from,
                          a.micro_batch});
    if (it == sends.end()) continue;
    const pb::TimelineEvent& send = *it->second;
    if (recv->start_us() > send.end_us()) {
      // Sent before the receiver came to it: most likely there already, so the receive's
      // time is what taking a tensor costs the stage.
      slot(recv->stage(), a.chunk, kRecv).Add((recv->end_us() - recv->start_us()) * 1e-6);
      continue;
    }
    // Only a receiver that waited from before the send began saw the arrival itself.
    if (recv->start_us() > send.start_us()) continue;
    const int fs = topology.StageOf(from);
    const int fc = topology.ChunkOf(from);
    slot(fs, fc, act ? kTransferAct : kTransferGrad)
        .Add(std::max<int64_t>(0, recv->end_us() - send.start_us()) * 1e-6,
             static_cast<double>(send.bytes()));
  }
  steps_.push_back(std::move(sums));
  while (static_cast<int>(steps_.size()) > window_) steps_.pop_front();
  return absl::OkStatus();
}

MeasuredCosts::Sum MeasuredCosts::Total(int stage, int chunk, Slot slot) const {
  Sum total;
  for (const StepSums& step : steps_) {
    total.Add(step.chunk[(static_cast<size_t>(stage) * chunks_ + chunk) * kSlots + slot]);
  }
  return total;
}

std::vector<std::vector<ChunkMeasure>> MeasuredCosts::Means() const {
  std::vector<std::vector<ChunkMeasure>> out(stages_, std::vector<ChunkMeasure>(chunks_));
  for (int s = 0; s < stages_; ++s) {
    for (int c = 0; c < chunks_; ++c) {
      ChunkMeasure& m = out[s][c];
      m.forward_s = Total(s, c, kF).Mean();
      m.backward_s = Total(s, c, kB).Mean();
      m.backward_input_s = Total(s, c, kI).Mean();
      m.backward_weight_s = Total(s, c, kW).Mean();
      const Sum send = Total(s, c, kSend);
      m.send_busy_s = send.Mean();
      m.send_bytes = send.count > 0 ? send.bytes / send.count : 0;
      m.recv_busy_s = Total(s, c, kRecv).Mean();
      m.transfer_activation_s = Total(s, c, kTransferAct).Mean();
      m.transfer_gradient_s = Total(s, c, kTransferGrad).Mean();
    }
  }
  return out;
}

std::vector<double> MeasuredCosts::OptimizerMeans() const {
  std::vector<double> out(stages_, -1);
  for (int s = 0; s < stages_; ++s) {
    Sum total;
    for (const StepSums& step : steps_) total.Add(step.optimizer[s]);
    out[s] = total.Mean();
  }
  return out;
}

double MeasuredCosts::TransferSecondsPerByte() const {
  double seconds = 0, bytes = 0;
  for (int s = 0; s < stages_; ++s) {
    for (int c = 0; c < chunks_; ++c) {
      for (Slot k : {kTransferAct, kTransferGrad}) {
        const Sum t = Total(s, c, k);
        seconds += t.seconds;
        bytes += t.bytes;
      }
    }
  }
  return bytes > 0 ? seconds / bytes : 0;
}

CostModel MeasuredCosts::Fit(const CostModel& planned) const {
  CostModel fitted = planned;
  if (steps_.empty()) return fitted;
  // Measured times already hold the waits of stages that share a device (each action
  // took as long as it did beside the others): the fitted model runs them as measured.
  fitted.device_of_stage.clear();
  fitted.device_slots.clear();
  const std::vector<std::vector<ChunkMeasure>> means = Means();
  const double per_byte = TransferSecondsPerByte();
  const schedule::Topology topology{stages_, chunks_, placement_};
  auto recv_busy = [&](int j) {
    if (j < 0 || j >= stages_ * chunks_) return 0.0;
    const double b = means[topology.StageOf(j)][topology.ChunkOf(j)].recv_busy_s;
    return b > 0 ? b : 0.0;
  };
  for (int s = 0; s < stages_ && s < static_cast<int>(fitted.chunks.size()); ++s) {
    for (int c = 0; c < chunks_ && c < static_cast<int>(fitted.chunks[s].size()); ++c) {
      const ChunkMeasure& m = means[s][c];
      ChunkCost& cc = fitted.chunks[s][c];
      const int j = topology.Virtual(s, c);
      if (m.forward_s >= 0) cc.forward_s = m.forward_s;
      if (m.backward_input_s >= 0) {
        cc.backward_input_s = m.backward_input_s;
        cc.backward_weight_s = std::max(0.0, m.backward_weight_s);
        cc.recompute_s = 0;
      } else if (m.backward_s >= 0) {
        cc.backward_input_s = m.backward_s;
        cc.backward_weight_s = 0;
        cc.recompute_s = 0;
      }
      if (m.send_busy_s >= 0) cc.send_busy_s = m.send_busy_s;
      if (m.recv_busy_s >= 0) cc.recv_busy_s = m.recv_busy_s;
      // A message never waited for takes the link's measured time per byte (the plan's
      // guess when no message anywhere was waited for).
      auto transfer = [&](double measured, int receiver, double guess) {
        if (measured >= 0) return std::max(0.0, measured - recv_busy(receiver));
        return per_byte > 0 ? m.send_bytes * per_byte : guess;
      };
      cc.send_activation_s = transfer(m.transfer_activation_s, j + 1, cc.send_activation_s);
      cc.send_gradient_s = transfer(m.transfer_gradient_s, j - 1, cc.send_gradient_s);
    }
  }
  const std::vector<double> opt = OptimizerMeans();
  if (std::any_of(opt.begin(), opt.end(), [](double x) { return x >= 0; })) {
    fitted.optimizer_stage_s.assign(stages_, planned.optimizer_s);
    for (int s = 0; s < stages_; ++s) {
      if (opt[s] >= 0) fitted.optimizer_stage_s[s] = opt[s];
    }
  }
  return fitted;
}

absl::StatusOr<MeasuredCosts::Prediction> MeasuredCosts::Predict(
    const schedule::Schedule& programs, const CostModel& planned, int draws) const {
  CostModel model = Fit(planned);
  std::map<std::tuple<int, int, int, int>, std::vector<double>> by_action;
  for (const StepSums& step : steps_) {
    for (const auto& [key, seconds] : step.compute) by_action[key].push_back(seconds);
  }
  if (by_action.empty() || draws < 1) {
    ASSIGN_OR_RETURN(SimulationResult sim, Simulate(programs, model));
    return Prediction{sim.step_time_s, sim.bubble_fraction};
  }
  std::mt19937_64 rng(draws);  // the same prediction for the same measurements
  model.draw_compute_s = [&](int s, const Action& a) {
    auto it = by_action.find({s, static_cast<int>(a.kind), a.micro_batch, a.chunk});
    if (it == by_action.end()) return -1.0;  // never seen: the fitted means' time
    const std::vector<double>& v = it->second;
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  Prediction mean;
  for (int d = 0; d < draws; ++d) {
    ASSIGN_OR_RETURN(SimulationResult sim, Simulate(programs, model));
    mean.step_time_s += sim.step_time_s / draws;
    mean.bubble_fraction += sim.bubble_fraction / draws;
  }
  return mean;
}

absl::StatusOr<CostRates> RatesFromMeasured(const Plan& plan, const MeasuredCosts& m) {
  const int k = plan.options.stages, v = plan.options.chunks;
  if (m.stages() != k || m.chunks() != v || static_cast<int>(plan.stages.size()) != k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "measured costs: measured on ", m.stages(), " stages x ", m.chunks(),
        " chunks, but the plan has ", k, " x ", v));
  }
  if (m.steps() == 0) {
    return absl::FailedPreconditionError("measured costs: no training step was measured");
  }
  const model::TransformerConfig& cfg = plan.options.model;
  // A measured stage ran one replica's micro-batches.
  const double tokens =
      static_cast<double>(plan.options.replica_batch_size() / plan.options.micro_batches) *
      cfg.seq_len;
  const auto means = m.Means();
  double f_s = 0, f_flops = 0, i_s = 0, i_flops = 0, w_s = 0, w_flops = 0, iw_s = 0, iw_flops = 0;
  double send_s = 0, recv_s = 0;
  int sends = 0, recvs = 0;
  for (int s = 0; s < k; ++s) {
    for (int c = 0; c < v && c < static_cast<int>(plan.stages[s].chunks.size()); ++c) {
      const auto [b, e] = plan.stages[s].chunks[c];
      double ff = 0, fi = 0, fw = 0;
      for (int l = b; l < e; ++l) {
        const model::LayerCost lc = model::CostOfLayer(cfg, l);
        ff += lc.forward_flops * tokens;
        fi += lc.backward_input_flops * tokens;
        fw += lc.backward_weight_flops * tokens;
      }
      const ChunkMeasure& cm = means[s][c];
      if (cm.forward_s >= 0) {
        f_s += cm.forward_s;
        f_flops += ff;
      }
      // The recompute inside a backward runs at the forward's rate; taken out below.
      const double rerun = plan.stages[s].chunk_recompute[c] ? std::max(0.0, cm.forward_s) : 0;
      if (cm.backward_input_s >= 0) {
        i_s += std::max(0.0, cm.backward_input_s - rerun);
        i_flops += fi;
        if (cm.backward_weight_s >= 0) {
          w_s += cm.backward_weight_s;
          w_flops += fw;
        }
      } else if (cm.backward_s >= 0) {
        iw_s += std::max(0.0, cm.backward_s - rerun);
        iw_flops += fi + fw;
      }
      if (cm.send_busy_s >= 0) {
        send_s += cm.send_busy_s;
        ++sends;
      }
      if (cm.recv_busy_s >= 0) {
        recv_s += cm.recv_busy_s;
        ++recvs;
      }
    }
  }
  if (f_flops <= 0) {
    return absl::FailedPreconditionError("measured costs: no forward was measured");
  }
  CostRates r;
  r.steps = m.steps();
  r.forward_s_per_flop = f_s / f_flops;
  const double iw_rate = iw_flops > 0 ? iw_s / iw_flops : 0;
  r.backward_input_s_per_flop = i_flops > 0 ? i_s / i_flops : iw_rate;
  r.backward_weight_s_per_flop = w_flops > 0 ? w_s / w_flops : iw_rate;
  if (r.backward_input_s_per_flop == 0) r.backward_input_s_per_flop = r.backward_weight_s_per_flop;
  r.send_busy_s = sends > 0 ? send_s / sends : 0;
  r.recv_busy_s = recvs > 0 ? recv_s / recvs : 0;
  r.transfer_s_per_byte = m.TransferSecondsPerByte();
  const std::vector<double> opt = m.OptimizerMeans();
  double opt_s = 0, params = 0;
  for (int s = 0; s < k; ++s) {
    if (opt[s] < 0) continue;
    opt_s += opt[s];
    params += static_cast<double>(plan.stages[s].params);
  }
  r.optimizer_s_per_param = params > 0 ? opt_s / params : 0;
  return r;
}

}  // namespace pipetrain::planner
