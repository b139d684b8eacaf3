#include "common/schedule/action.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pipetrain::schedule {
namespace {

struct KindName {
  ActionKind kind;
  const char* prefix;
};
// Longest prefixes first so that "SEND_F" is not read as an "S" something.
constexpr KindName kKindNames[] = {
    {ActionKind::kSendActivation, "SEND_F"},
    {ActionKind::kRecvActivation, "RECV_F"},
    {ActionKind::kSendGradient, "SEND_B"},
    {ActionKind::kRecvGradient, "RECV_B"},
    {ActionKind::kForward, "F"},
    {ActionKind::kBackward, "B"},
    {ActionKind::kBackwardInput, "I"},
    {ActionKind::kBackwardWeight, "W"},
};

absl::StatusOr<int> ParseIndex(absl::string_view digits, absl::string_view whole,
                               const char* what) {
  int value = 0;
  bool all_digits = !digits.empty();
  for (char c : digits) all_digits = all_digits && absl::ascii_isdigit(c);
  if (!all_digits || !absl::SimpleAtoi(digits, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("action '", whole, "': ", what, " must be a whole number >= 0"));
  }
  return value;
}

}  // namespace

bool IsCompute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kBackwardInput || kind == ActionKind::kBackwardWeight;
}

bool IsCommunication(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kRecvActivation ||
         kind == ActionKind::kSendGradient || kind == ActionKind::kRecvGradient;
}

std::string ToString(const Action& action) {
  if (action.kind == ActionKind::kOptimizerStep) return "OPT";
  const char* prefix = "?";
  for (const KindName& k : kKindNames) {
    if (k.kind == action.kind) prefix = k.prefix;
  }
  std::string s = absl::StrCat(prefix, action.micro_batch);
  if (action.chunk != 0) absl::StrAppend(&s, "@", action.chunk);
  return s;
}

absl::StatusOr<Action> ParseAction(absl::string_view text) {
  if (text == "OPT") return OptimizerStep();
  for (const KindName& k : kKindNames) {
    if (!absl::ConsumePrefix(&text, k.prefix)) continue;
    const std::string whole = absl::StrCat(k.prefix, text);
    absl::string_view mb = text, chunk;
    if (size_t at = text.find('@'); at != absl::string_view::npos) {
      mb = text.substr(0, at);
      chunk = text.substr(at + 1);
    }
    Action a{k.kind, 0, 0};
    auto m = ParseIndex(mb, whole, "micro-batch");
    if (!m.ok()) return m.status();
    a.micro_batch = *m;
    if (chunk.data() != nullptr) {
      auto c = ParseIndex(chunk, whole, "chunk after '@'");
      if (!c.ok()) return c.status();
      a.chunk = *c;
    }
    return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("action '", text,
                   "': unknown kind (expected F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B or OPT)"));
}

std::string ToString(const std::vector<Action>& actions) {
  return absl::StrJoin(actions, " ",
                       [](std::string* out, const Action& a) { out->append(ToString(a)); });
}

absl::StatusOr<std::vector<Action>> ParseActions(absl::string_view text) {
  std::vector<Action> out;
  for (absl::string_view token :
       absl::StrSplit(text, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty())) {
    auto a = ParseAction(token);
    if (!a.ok()) return a.status();
    out.push_back(*a);
  }
  return out;
}

}  // namespace pipetrain::schedule
