#include "coordinator/planner/lowering.h"

namespace pipetrain::planner {

using schedule::Action;
using schedule::ActionKind;

schedule::Schedule Lower(const schedule::Schedule& compute_only) {
  schedule::Schedule out = compute_only;
  for (schedule::StageProgram& p : out) {
    const schedule::Topology topology = p.topology();
    const int last = topology.Last();
    std::vector<Action> lowered;
    lowered.reserve(p.actions.size() * 2);
    for (const Action& a : p.actions) {
      const int j = topology.Virtual(p.stage, a.chunk);
      const bool backward = schedule::ProducesInputGradient(a.kind);
      if (a.kind == ActionKind::kForward && j > 0) {
        lowered.push_back({ActionKind::kRecvActivation, a.micro_batch, a.chunk});
      }
      if (backward && j < last) {
        lowered.push_back({ActionKind::kRecvGradient, a.micro_batch, a.chunk});
      }
      lowered.push_back(a);
      if (a.kind == ActionKind::kForward && j < last) {
        lowered.push_back({ActionKind::kSendActivation, a.micro_batch, a.chunk});
      }
      if (backward && j > 0) {
        lowered.push_back({ActionKind::kSendGradient, a.micro_batch, a.chunk});
      }
    }
    p.actions = std::move(lowered);
  }
  return out;
}

}  // namespace pipetrain::planner
