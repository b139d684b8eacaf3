#include "coordinator/planner/lowering.h"

namespace pipetrain::planner {

using schedule::Action;
using schedule::ActionKind;

schedule::Schedule Lower(const schedule::Schedule& compute_only) {
  schedule::Schedule out = compute_only;
  for (schedule::StageProgram& p : out) {
    const int last = p.num_stages * p.num_chunks - 1;
    std::vector<Action> lowered;
    lowered.reserve(p.actions.size() * 2);
    for (const Action& a : p.actions) {
      const int j = schedule::VirtualStage(p.stage, a.chunk, p.num_stages);
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
