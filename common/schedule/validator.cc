#include "common/schedule/validator.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace pipetrain::schedule {
namespace {

constexpr int64_t kMaxSlots = int64_t{1} << 24;
constexpr size_t kMaxTablePositions = 120;
constexpr int kMaxStages = kMaxTopologyStages;

// The actions a forward-only program may contain: forwards and the activations they move.
bool AllowedForwardOnly(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kSendActivation ||
         k == ActionKind::kRecvActivation;
}

// Counts the activations a program holds across action `k`: `during` while it runs,
// `held` (in: before it) after it. Training keeps a forward's activations until its
// backward (or weight part); a forward-only program frees them as the forward ends.
void Hold(const StageProgram& p, ActionKind k, int& held, int& during) {
  if (k == ActionKind::kForward) ++held;
  if (k == ActionKind::kBackward || k == ActionKind::kBackwardWeight) --held;
  during = held;
  if (p.forward_only && k == ActionKind::kForward) --held;
}

// Where each action of one (micro-batch, chunk) sits in its stage's program; -1 = absent.
struct Slot {
  int f = -1, b = -1, i = -1, w = -1;
  int send_f = -1, recv_f = -1, send_b = -1, recv_b = -1;
  int backward() const { return b >= 0 ? b : i; }  // the action that makes the input grad
};

class Checker {
 public:
  // whole: s holds every stage's program, in stage order. Otherwise it holds one
  // stage's program, and the checks that need its peers are skipped.
  Checker(const Schedule& s, const ValidateOptions& o, bool whole)
      : s_(s), options_(o), whole_(whole) {}

  absl::Status Run() {
    if (absl::Status st = CheckHeaders(); !st.ok()) return st;
    slots_.assign(s_.size(), std::vector<Slot>(m_ * v_));
    for (int s = 0; s < static_cast<int>(s_.size()); ++s) {
      if (absl::Status st = ScanStage(s); !st.ok()) return st;
    }
    if (whole_ && options_.lowered) {
      if (absl::Status st = CheckMatching(); !st.ok()) return st;
    }
    if (absl::Status st = CheckComplete(); !st.ok()) return st;
    if (whole_) {
      if (absl::Status st = CheckDeadlock(); !st.ok()) return st;
    }
    return CheckInFlight();
  }

 private:
  std::string Name(Cell c) const {
    return absl::StrCat("stage ", StageAt(c.stage), " position ", c.position, " (",
                        ToString(s_[c.stage].actions[c.position]), ")");
  }
  absl::Status Fail(std::vector<Cell> cells, const std::string& message) const {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid schedule: ", message, "\n", RenderTable(s_, cells)));
  }
  absl::Status FailAt(Cell c, const std::string& what) const {
    return Fail({c}, absl::StrCat(Name(c), ": ", what));
  }
  // Cells index s_; messages name the stage a program says it is.
  int StageAt(int index) const { return s_[index].stage; }
  // An action that needs the forward of its micro-batch came first: either the forward
  // comes later (wrong order) or it is missing from the program altogether.
  absl::Status NoForwardYet(Cell here, const std::string& mb) const {
    const Action& a = s_[here.stage].actions[here.position];
    const std::vector<Action>& acts = s_[here.stage].actions;
    for (int i = here.position + 1; i < static_cast<int>(acts.size()); ++i) {
      if (acts[i] == Forward(a.micro_batch, a.chunk)) {
        return Fail(
            {here, {here.stage, i}},
            absl::StrCat(Name(here), ": comes before the forward of ", mb, " at position ", i));
      }
    }
    return FailAt(here, absl::StrCat("missing forward ", ToString(Forward(a.micro_batch, a.chunk)),
                                     " of ", mb, " on stage ", StageAt(here.stage)));
  }
  std::string Mb(int m, int c) const {
    return c == 0 ? absl::StrCat("micro-batch ", m) : absl::StrCat("micro-batch ", m, " chunk ", c);
  }
  int Virtual(int s, int c) const { return topo_.Virtual(s, c); }
  Slot& SlotOf(int virtual_stage, int m) {
    return slots_[topo_.StageOf(virtual_stage)][m * v_ + topo_.ChunkOf(virtual_stage)];
  }

  absl::Status CheckHeaders() {
    if (s_.empty()) return absl::InvalidArgumentError("invalid schedule: no stages");
    k_ = whole_ ? static_cast<int>(s_.size()) : s_[0].num_stages;
    if (k_ < 1 || k_ > kMaxStages) {
      return absl::InvalidArgumentError(absl::StrCat("invalid schedule: num_stages must be in 1..",
                                                     kMaxStages, " (got ", k_, ")"));
    }
    if (!whole_ && (s_[0].stage < 0 || s_[0].stage >= k_)) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid program: stage ", s_[0].stage, " is not in 0..", k_ - 1));
    }
    m_ = s_[0].num_micro_batches;
    v_ = s_[0].num_chunks;
    forward_only_ = s_[0].forward_only;
    topo_ = {k_, v_, s_[0].placement};
    if (m_ < 1) return absl::InvalidArgumentError("invalid schedule: num_micro_batches < 1");
    if (v_ < 1) return absl::InvalidArgumentError("invalid schedule: num_chunks < 1");
    // The checker keeps a slot per (stage, micro-batch, chunk): refuse shapes no real
    // job has before allocating for them, so a hostile program cannot exhaust memory.
    if (static_cast<int64_t>(k_) * m_ * v_ > kMaxSlots) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid schedule: ", k_, " stages x ", m_, " micro-batches x ", v_,
                       " chunks is more than the ", kMaxSlots, " this validator accepts"));
    }
    for (int s = 0; whole_ && s < k_; ++s) {
      const StageProgram& p = s_[s];
      if (p.placement != topo_.placement) {
        return absl::InvalidArgumentError(absl::StrCat(
            "invalid schedule: program ", s, " has placement ", PlacementName(p.placement),
            ", program 0 ", PlacementName(topo_.placement)));
      }
      if (p.stage != s || p.num_stages != k_ || p.num_micro_batches != m_ || p.num_chunks != v_) {
        return absl::InvalidArgumentError(absl::StrCat(
            "invalid schedule: program ", s, " says stage ", p.stage, " of ", p.num_stages,
            " with ", p.num_micro_batches, " micro-batches and ", p.num_chunks,
            " chunks; expected stage ", s, " of ", k_, " with ", m_, " and ", v_));
      }
      // Evaluation and training programs cannot meet in one step: a training stage
      // would wait forever for gradients an evaluating neighbour never sends.
      if (p.forward_only != forward_only_) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid schedule: program ", s, " has forward_only ",
                         p.forward_only ? "true" : "false", ", program 0 ",
                         forward_only_ ? "true" : "false"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ScanStage(int s) {
    const std::vector<Action>& actions = s_[s].actions;
    int opt = -1;
    const int last = k_ * v_ - 1;
    for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
      const Action& a = actions[i];
      const Cell here{s, i};
      if (forward_only_ && !AllowedForwardOnly(a.kind)) {
        return FailAt(here, "not allowed in a forward-only program (only F, SEND_F and RECV_F)");
      }
      if (a.kind == ActionKind::kOptimizerStep) {
        if (opt >= 0)
          return Fail({{s, opt}, here}, absl::StrCat(Name(here), ": second optimizer step"));
        opt = i;
        continue;
      }
      if (opt >= 0) {
        return Fail({{s, opt}, here},
                    absl::StrCat(Name(here), ": comes after the optimizer step at position ", opt));
      }
      if (a.micro_batch < 0 || a.micro_batch >= m_ || a.chunk < 0 || a.chunk >= v_) {
        return FailAt(here, absl::StrCat("out of range (", m_, " micro-batches, ", v_, " chunks)"));
      }
      if (!options_.lowered && IsCommunication(a.kind)) {
        return FailAt(here, "send or receive in a compute-only program");
      }
      Slot& slot = slots_[s][a.micro_batch * v_ + a.chunk];
      const int j = Virtual(StageAt(s), a.chunk);
      const std::string mb = Mb(a.micro_batch, a.chunk);
      auto dup = [&](int earlier, const char* what) {
        return Fail({{s, earlier}, here}, absl::StrCat(Name(here), ": duplicate ", what, " of ", mb,
                                                       " (first at position ", earlier, ")"));
      };
      switch (a.kind) {
        case ActionKind::kForward:
          if (slot.f >= 0) return dup(slot.f, "forward");
          slot.f = i;
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          if (slot.backward() >= 0) return dup(slot.backward(), "backward");
          if (a.kind == ActionKind::kBackward && slot.w >= 0) return dup(slot.w, "backward");
          if (slot.f < 0) return NoForwardYet(here, mb);
          (a.kind == ActionKind::kBackward ? slot.b : slot.i) = i;
          break;
        case ActionKind::kBackwardWeight:
          if (slot.w >= 0) return dup(slot.w, "weight gradient");
          if (slot.b >= 0) return dup(slot.b, "backward");
          if (slot.i < 0) {
            return FailAt(here,
                          absl::StrCat("weight gradient before the input gradient (I) of ", mb));
          }
          slot.w = i;
          break;
        case ActionKind::kSendActivation:
          if (j == last) return FailAt(here, "nothing downstream to send the activation to");
          if (slot.send_f >= 0) return dup(slot.send_f, "activation send");
          if (slot.f < 0) return NoForwardYet(here, mb);
          slot.send_f = i;
          break;
        case ActionKind::kRecvActivation:
          if (j == 0) return FailAt(here, "nothing upstream to receive an activation from");
          if (slot.recv_f >= 0) return dup(slot.recv_f, "activation receive");
          if (slot.f >= 0)
            return Fail(
                {{s, slot.f}, here},
                absl::StrCat(Name(here), ": receives the input after the forward that needs it"));
          slot.recv_f = i;
          break;
        case ActionKind::kSendGradient:
          if (j == 0) return FailAt(here, "nothing upstream to send the gradient to");
          if (slot.send_b >= 0) return dup(slot.send_b, "gradient send");
          if (slot.backward() < 0)
            return FailAt(here, absl::StrCat("sends the gradient before the backward of ", mb));
          slot.send_b = i;
          break;
        case ActionKind::kRecvGradient:
          if (j == last) return FailAt(here, "nothing downstream to receive a gradient from");
          if (slot.recv_b >= 0) return dup(slot.recv_b, "gradient receive");
          if (slot.backward() >= 0)
            return Fail(
                {{s, slot.backward()}, here},
                absl::StrCat(Name(here),
                             ": receives the output gradient after the backward that needs it"));
          slot.recv_b = i;
          break;
        case ActionKind::kOptimizerStep:
          break;
      }
    }
    return absl::OkStatus();
  }

  // Every send meets exactly one receive on the neighbouring virtual stage, and back.
  absl::Status CheckMatching() {
    for (int s = 0; s < k_; ++s) {
      for (int c = 0; c < v_; ++c) {
        const int j = Virtual(s, c);
        for (int m = 0; m < m_; ++m) {
          const Slot& mine = slots_[s][m * v_ + c];
          auto check = [&](int pos, int peer_j, int Slot::*peer_field,
                           ActionKind want) -> absl::Status {
            if (pos < 0 || SlotOf(peer_j, m).*peer_field >= 0) return absl::OkStatus();
            Action w{want, m, topo_.ChunkOf(peer_j)};
            return FailAt({s, pos}, absl::StrCat("no matching ", ToString(w), " on stage ",
                                                 topo_.StageOf(peer_j)));
          };
          absl::Status st;
          if (!(st = check(mine.send_f, j + 1, &Slot::recv_f, ActionKind::kRecvActivation)).ok())
            return st;
          if (!(st = check(mine.recv_f, j - 1, &Slot::send_f, ActionKind::kSendActivation)).ok())
            return st;
          if (!(st = check(mine.send_b, j - 1, &Slot::recv_b, ActionKind::kRecvGradient)).ok())
            return st;
          if (!(st = check(mine.recv_b, j + 1, &Slot::send_b, ActionKind::kSendGradient)).ok())
            return st;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status CheckComplete() {
    const int last = k_ * v_ - 1;
    for (int s = 0; s < static_cast<int>(s_.size()); ++s) {
      for (int m = 0; m < m_; ++m) {
        for (int c = 0; c < v_; ++c) {
          const Slot& sl = slots_[s][m * v_ + c];
          const std::string where = absl::StrCat("stage ", StageAt(s), ": ");
          if (sl.f < 0) {
            return Fail({}, absl::StrCat(where, "missing forward ", ToString(Forward(m, c)), " of ",
                                         Mb(m, c)));
          }
          // ScanStage let no backward into a forward-only program.
          if (!forward_only_ && sl.backward() < 0) {
            return Fail({}, absl::StrCat(where, "missing backward ", ToString(Backward(m, c)),
                                         " of ", Mb(m, c)));
          }
          if (sl.i >= 0 && sl.w < 0) {
            return Fail({{s, sl.i}},
                        absl::StrCat(where, "missing weight gradient ",
                                     ToString(BackwardWeight(m, c)), " after ", Name({s, sl.i})));
          }
          if (!options_.lowered) continue;
          const int j = Virtual(StageAt(s), c);
          if (j > 0 && sl.recv_f < 0)
            return FailAt({s, sl.f}, "its input is never received (missing RECV_F)");
          if (j < last && sl.send_f < 0)
            return FailAt({s, sl.f}, "its output is never sent (missing SEND_F)");
          if (forward_only_) continue;
          if (j < last && sl.recv_b < 0)
            return FailAt({s, sl.backward()},
                          "its output gradient is never received (missing RECV_B)");
          if (j > 0 && sl.send_b < 0)
            return FailAt({s, sl.backward()}, "its input gradient is never sent (missing SEND_B)");
        }
      }
    }
    return absl::OkStatus();
  }

  // Runs every program with blocking receives (sends never block) until all finish or
  // none can move.
  absl::Status CheckDeadlock() {
    const int vj = k_ * v_;
    std::vector<std::vector<char>> f_done(vj, std::vector<char>(m_)), b_done = f_done;
    std::vector<size_t> pc(k_, 0);
    auto ready = [&](int s, const Action& a) {
      const int j = Virtual(s, a.chunk);
      const int m = a.micro_batch;
      if (options_.lowered) {
        if (a.kind == ActionKind::kRecvActivation) return f_done[j - 1][m] != 0;
        if (a.kind == ActionKind::kRecvGradient) return b_done[j + 1][m] != 0;
        return true;
      }
      if (a.kind == ActionKind::kForward && j > 0) return f_done[j - 1][m] != 0;
      if (ProducesInputGradient(a.kind) && j < vj - 1) return b_done[j + 1][m] != 0;
      return true;
    };
    auto execute = [&](int s, const Action& a) {
      const int j = Virtual(s, a.chunk);
      // In lowered programs the sends publish; otherwise the compute itself does.
      const bool publish_f =
          options_.lowered ? a.kind == ActionKind::kSendActivation : a.kind == ActionKind::kForward;
      const bool publish_b =
          options_.lowered ? a.kind == ActionKind::kSendGradient : ProducesInputGradient(a.kind);
      if (publish_f) f_done[j][a.micro_batch] = 1;
      if (publish_b) b_done[j][a.micro_batch] = 1;
    };
    for (bool progress = true; progress;) {
      progress = false;
      for (int s = 0; s < k_; ++s) {
        const std::vector<Action>& acts = s_[s].actions;
        while (pc[s] < acts.size() && ready(s, acts[pc[s]])) {
          execute(s, acts[pc[s]]);
          ++pc[s];
          progress = true;
        }
      }
    }
    std::vector<Cell> stuck;
    std::vector<std::string> why;
    for (int s = 0; s < k_; ++s) {
      if (pc[s] >= s_[s].actions.size()) continue;
      const Cell c{s, static_cast<int>(pc[s])};
      const Action& a = s_[s].actions[pc[s]];
      const bool up = a.kind == ActionKind::kRecvActivation || a.kind == ActionKind::kForward;
      const int peer_j = Virtual(s, a.chunk) + (up ? -1 : 1);
      stuck.push_back(c);
      why.push_back(absl::StrCat(Name(c), " waits for stage ", topo_.StageOf(peer_j)));
    }
    if (stuck.empty()) return absl::OkStatus();
    return Fail(stuck, absl::StrCat("deadlock: no stage can go on: ", absl::StrJoin(why, "; ")));
  }

  absl::Status CheckInFlight() {
    for (int s = 0; s < static_cast<int>(s_.size()); ++s) {
      const StageProgram& p = s_[s];
      if (p.max_in_flight <= 0) continue;
      int held = 0, now = 0;
      for (int i = 0; i < static_cast<int>(p.actions.size()); ++i) {
        Hold(p, p.actions[i].kind, held, now);
        if (now > p.max_in_flight) {
          return FailAt({s, i},
                        absl::StrCat(now, " activations in flight, above this stage's bound of ",
                                     p.max_in_flight));
        }
      }
    }
    return absl::OkStatus();
  }

  const Schedule& s_;
  ValidateOptions options_;
  bool whole_;
  int k_ = 0, m_ = 0, v_ = 0;
  Topology topo_;
  bool forward_only_ = false;
  std::vector<std::vector<Slot>> slots_;  // [stage][micro_batch * v + chunk]
};

}  // namespace

absl::Status Validate(const Schedule& schedule, const ValidateOptions& options) {
  return Checker(schedule, options, /*whole=*/true).Run();
}

absl::Status ValidateProgram(const StageProgram& program, const ValidateOptions& options) {
  const Schedule one = {program};
  return Checker(one, options, /*whole=*/false).Run();
}

int PeakInFlight(const StageProgram& program) {
  int held = 0, now = 0, peak = 0;
  for (const Action& a : program.actions) {
    Hold(program, a.kind, held, now);
    peak = std::max(peak, now);
  }
  return peak;
}

std::string RenderTable(const Schedule& schedule, const std::vector<Cell>& marked) {
  size_t width = 2, positions = 0;
  for (const StageProgram& p : schedule) {
    positions = std::max(positions, p.actions.size());
    for (const Action& a : p.actions) width = std::max(width, ToString(a).size());
  }
  width += 2;  // room for the brackets of a marked cell
  // Long programs (or hostile ones) show a window around the first marked cell, so an
  // error message stays readable and small.
  size_t first = 0, end = positions;
  if (positions > kMaxTablePositions) {
    size_t center = marked.empty() ? 0 : static_cast<size_t>(std::max(marked[0].position, 0));
    first = center > kMaxTablePositions / 2 ? center - kMaxTablePositions / 2 : 0;
    end = std::min(positions, first + kMaxTablePositions);
  }
  auto pad = [&](std::string s) {
    s.resize(std::max(s.size(), width), ' ');
    return s;
  };
  std::string out = "position ";
  for (size_t i = first; i < end; ++i) out += pad(absl::StrCat(" ", i)) + " ";
  while (out.back() == ' ') out.pop_back();
  if (first > 0 || end < positions)
    absl::StrAppend(&out, "   (positions ", first, "..", end - 1, " of ", positions, ")");
  out += "\n";
  for (size_t s = 0; s < schedule.size(); ++s) {
    std::string row = absl::StrCat("stage ", schedule[s].stage);
    row.resize(9, ' ');
    const std::vector<Action>& acts = schedule[s].actions;
    for (size_t i = first; i < std::min(end, acts.size()); ++i) {
      bool mark = std::any_of(marked.begin(), marked.end(), [&](const Cell& c) {
        return c.stage == static_cast<int>(s) && c.position == static_cast<int>(i);
      });
      const std::string t = ToString(acts[i]);
      row += pad(mark ? absl::StrCat("[", t, "]") : absl::StrCat(" ", t)) + " ";
    }
    while (!row.empty() && row.back() == ' ') row.pop_back();
    out += row + "\n";
  }
  return out;
}

}  // namespace pipetrain::schedule
