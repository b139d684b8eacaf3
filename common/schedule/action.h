// One action of a stage's program (forward, backward, send, receive, optimizer step) and
// its compact text form: F3, B3, I3, W3, SEND_F3, RECV_F3, SEND_B3, RECV_B3, OPT, with
// "@c" for model chunk c > 0 (F3@1). Golden schedules in tests are written in it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::schedule {

enum class ActionKind {
  kForward,         // F
  kBackward,        // B: input and weight gradients together
  kBackwardInput,   // I: gradient w.r.t. the stage input only (zero-bubble)
  kBackwardWeight,  // W: gradient w.r.t. the parameters only (zero-bubble)
  kSendActivation,  // SEND_F
  kRecvActivation,  // RECV_F
  kSendGradient,    // SEND_B
  kRecvGradient,    // RECV_B
  kOptimizerStep,   // OPT
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;  // from 0; always 0 for kOptimizerStep
  int chunk = 0;        // model chunk on this stage (interleaved schedules), else 0

  bool operator==(const Action&) const = default;
};

inline Action Forward(int mb, int chunk = 0) { return {ActionKind::kForward, mb, chunk}; }
inline Action Backward(int mb, int chunk = 0) { return {ActionKind::kBackward, mb, chunk}; }
inline Action BackwardInput(int mb, int chunk = 0) {
  return {ActionKind::kBackwardInput, mb, chunk};
}
inline Action BackwardWeight(int mb, int chunk = 0) {
  return {ActionKind::kBackwardWeight, mb, chunk};
}
inline Action OptimizerStep() { return {ActionKind::kOptimizerStep, 0, 0}; }

// Compute actions run layers; the others move tensors or apply the optimizer.
bool IsCompute(ActionKind kind);
bool IsCommunication(ActionKind kind);
// B or I: the action that produces the gradient sent upstream.
inline bool ProducesInputGradient(ActionKind k) {
  return k == ActionKind::kBackward || k == ActionKind::kBackwardInput;
}

std::string ToString(const Action& action);
// Parses one action; the error quotes the text.
absl::StatusOr<Action> ParseAction(absl::string_view text);

// A program as one line, actions separated by single spaces, and back. Parsing accepts
// any whitespace between actions.
std::string ToString(const std::vector<Action>& actions);
absl::StatusOr<std::vector<Action>> ParseActions(absl::string_view text);

}  // namespace pipetrain::schedule
