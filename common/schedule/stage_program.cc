#include "common/schedule/stage_program.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pipetrain::schedule {
namespace {

namespace pb = ::pipetrain::v1;

pb::ActionKind KindToProto(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return pb::FORWARD;
    case ActionKind::kBackward:
      return pb::BACKWARD;
    case ActionKind::kBackwardInput:
      return pb::BACKWARD_INPUT;
    case ActionKind::kBackwardWeight:
      return pb::BACKWARD_WEIGHT;
    case ActionKind::kSendActivation:
      return pb::SEND_ACTIVATION;
    case ActionKind::kRecvActivation:
      return pb::RECV_ACTIVATION;
    case ActionKind::kSendGradient:
      return pb::SEND_GRADIENT;
    case ActionKind::kRecvGradient:
      return pb::RECV_GRADIENT;
    case ActionKind::kOptimizerStep:
      return pb::OPTIMIZER_STEP;
  }
  return pb::ACTION_KIND_UNSPECIFIED;
}

absl::StatusOr<ActionKind> KindFromProto(pb::ActionKind k, absl::string_view field) {
  switch (k) {
    case pb::FORWARD:
      return ActionKind::kForward;
    case pb::BACKWARD:
      return ActionKind::kBackward;
    case pb::BACKWARD_INPUT:
      return ActionKind::kBackwardInput;
    case pb::BACKWARD_WEIGHT:
      return ActionKind::kBackwardWeight;
    case pb::SEND_ACTIVATION:
      return ActionKind::kSendActivation;
    case pb::RECV_ACTIVATION:
      return ActionKind::kRecvActivation;
    case pb::SEND_GRADIENT:
      return ActionKind::kSendGradient;
    case pb::RECV_GRADIENT:
      return ActionKind::kRecvGradient;
    case pb::OPTIMIZER_STEP:
      return ActionKind::kOptimizerStep;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".kind: unknown action kind ", static_cast<int>(k)));
}

absl::StatusOr<int> ToInt(uint32_t v, absl::string_view field) {
  if (v > static_cast<uint32_t>(std::numeric_limits<int>::max())) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is too large: ", v));
  }
  return static_cast<int>(v);
}

absl::Status ReadNamedInt(std::vector<absl::string_view>& words, size_t i, absl::string_view name,
                          int* out, int line_no) {
  if (i + 1 >= words.size() || words[i] != name || !absl::SimpleAtoi(words[i + 1], out)) {
    return absl::InvalidArgumentError(absl::StrCat("line ", line_no, ": expected '", name, " N'"));
  }
  return absl::OkStatus();
}

}  // namespace

pb::Action ActionToProto(const Action& a) {
  pb::Action out;
  out.set_kind(KindToProto(a.kind));
  out.set_micro_batch(a.micro_batch);
  out.set_chunk(a.chunk);
  return out;
}

absl::StatusOr<Action> ActionFromProto(const pb::Action& pa, absl::string_view field) {
  auto kind = KindFromProto(pa.kind(), field);
  if (!kind.ok()) return kind.status();
  auto mb = ToInt(pa.micro_batch(), absl::StrCat(field, ".micro_batch"));
  auto chunk = ToInt(pa.chunk(), absl::StrCat(field, ".chunk"));
  if (!mb.ok()) return mb.status();
  if (!chunk.ok()) return chunk.status();
  if (*kind == ActionKind::kOptimizerStep) return OptimizerStep();
  return Action{*kind, *mb, *chunk};
}

pb::StageProgram ToProto(const StageProgram& p) {
  pb::StageProgram out;
  out.set_stage(p.stage);
  out.set_num_stages(p.num_stages);
  out.set_num_micro_batches(p.num_micro_batches);
  out.set_num_chunks(p.num_chunks);
  out.set_schedule(p.schedule);
  out.set_max_in_flight(p.max_in_flight);
  out.set_forward_only(p.forward_only);
  out.set_placement(p.placement == Placement::kV ? pb::PLACEMENT_V : pb::PLACEMENT_LOOPED);
  for (const Action& a : p.actions) {
    pb::Action* pa = out.add_actions();
    pa->set_kind(KindToProto(a.kind));
    pa->set_micro_batch(a.micro_batch);
    pa->set_chunk(a.chunk);
  }
  return out;
}

absl::StatusOr<StageProgram> FromProto(const pb::StageProgram& proto) {
  StageProgram p;
  auto stage = ToInt(proto.stage(), "stage");
  auto k = ToInt(proto.num_stages(), "num_stages");
  auto m = ToInt(proto.num_micro_batches(), "num_micro_batches");
  auto v = ToInt(proto.num_chunks(), "num_chunks");
  auto f = ToInt(proto.max_in_flight(), "max_in_flight");
  for (const auto* s : {&stage, &k, &m, &v, &f}) {
    if (!s->ok()) return s->status();
  }
  p.stage = *stage;
  p.num_stages = *k;
  p.num_micro_batches = *m;
  p.num_chunks = *v == 0 ? 1 : *v;  // proto3 default: not interleaved
  p.max_in_flight = *f;
  p.schedule = proto.schedule();
  p.forward_only = proto.forward_only();
  switch (proto.placement()) {
    case pb::PLACEMENT_LOOPED:
      p.placement = Placement::kLooped;
      break;
    case pb::PLACEMENT_V:
      p.placement = Placement::kV;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("placement: unknown value ", static_cast<int>(proto.placement())));
  }
  for (int i = 0; i < proto.actions_size(); ++i) {
    auto a = ActionFromProto(proto.actions(i), absl::StrCat("actions[", i, "]"));
    if (!a.ok()) return a.status();
    p.actions.push_back(*a);
  }
  return p;
}

std::string ToText(const Schedule& schedule) {
  if (schedule.empty()) return "";
  const StageProgram& first = schedule.front();
  std::string out = absl::StrCat("schedule ", first.schedule.empty() ? "-" : first.schedule,
                                 " stages ", first.num_stages, " micro_batches ",
                                 first.num_micro_batches, " chunks ", first.num_chunks,
                                 first.placement == Placement::kLooped
                                     ? ""
                                     : absl::StrCat(" placement ", PlacementName(first.placement)),
                                 first.forward_only ? " forward_only" : "", "\n");
  for (const StageProgram& p : schedule) {
    absl::StrAppend(&out, "stage ", p.stage, " max_in_flight ", p.max_in_flight, ": ",
                    ToString(p.actions), "\n");
  }
  return out;
}

namespace {

// The header's words after `chunks V`: `placement NAME` and `forward_only`, each at most
// once, in this order; `w` keeps the first eight.
absl::Status ReadHeaderOptions(std::vector<absl::string_view>& w, int line_no,
                               StageProgram& header) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("line ", line_no,
                     ": expected 'schedule NAME stages K micro_batches M chunks V"
                     " [placement looped|v] [forward_only]'"));
  };
  if (w.size() < 8 || w[0] != "schedule") return bad();
  size_t i = 8;
  if (i + 1 < w.size() && w[i] == "placement") {
    absl::StatusOr<Placement> placement = ParsePlacement(w[i + 1]);
    if (!placement.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": ", placement.status().message()));
    }
    header.placement = *placement;
    i += 2;
  }
  header.forward_only = i < w.size() && w[i] == "forward_only";
  if (header.forward_only) ++i;
  if (i != w.size()) return bad();
  w.resize(8);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Schedule> ParseScheduleText(absl::string_view text) {
  Schedule out;
  StageProgram header;
  bool have_header = false;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (!have_header) {
      std::vector<absl::string_view> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (auto s = ReadHeaderOptions(w, line_no, header); !s.ok()) return s;
      header.schedule = w[1] == "-" ? "" : std::string(w[1]);
      if (auto s = ReadNamedInt(w, 2, "stages", &header.num_stages, line_no); !s.ok()) return s;
      if (auto s = ReadNamedInt(w, 4, "micro_batches", &header.num_micro_batches, line_no);
          !s.ok()) {
        return s;
      }
      if (auto s = ReadNamedInt(w, 6, "chunks", &header.num_chunks, line_no); !s.ok()) return s;
      // The text form has no "unset": 0 would read back from the proto form (where 0 is
      // proto3's default) as 1 chunk (found by tests/fuzz/schedule_fuzz), and 0 stages
      // or micro-batches describe no pipeline.
      for (auto [value, name] : {std::pair{header.num_stages, "stages"},
                                 {header.num_micro_batches, "micro_batches"},
                                 {header.num_chunks, "chunks"}}) {
        if (value < 1) {
          return absl::InvalidArgumentError(
              absl::StrCat("line ", line_no, ": ", name, " must be >= 1 (got ", value, ")"));
        }
      }
      have_header = true;
      continue;
    }
    size_t colon = line.find(':');
    if (colon == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": expected 'stage S max_in_flight N: ACTIONS'"));
    }
    std::vector<absl::string_view> w =
        absl::StrSplit(line.substr(0, colon), ' ', absl::SkipEmpty());
    StageProgram p = header;
    if (w.size() != 4) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": expected 'stage S max_in_flight N: ACTIONS'"));
    }
    if (auto s = ReadNamedInt(w, 0, "stage", &p.stage, line_no); !s.ok()) return s;
    if (auto s = ReadNamedInt(w, 2, "max_in_flight", &p.max_in_flight, line_no); !s.ok()) {
      return s;
    }
    // The proto form holds these unsigned: a negative one could not be sent to a stage
    // (found by tests/fuzz/schedule_fuzz).
    for (auto [value, name] : {std::pair{p.stage, "stage"}, {p.max_in_flight, "max_in_flight"}}) {
      if (value < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("line ", line_no, ": ", name, " must be >= 0 (got ", value, ")"));
      }
    }
    auto actions = ParseActions(line.substr(colon + 1));
    if (!actions.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_no, ": ", actions.status().message()));
    }
    p.actions = *std::move(actions);
    out.push_back(std::move(p));
  }
  if (!have_header) return absl::InvalidArgumentError("empty schedule text");
  // A header alone would parse to no program at all, which drops the header and
  // prints back as the empty text (found by tests/fuzz/schedule_fuzz).
  if (out.empty()) {
    return absl::InvalidArgumentError(
        "schedule text has a header but no 'stage S max_in_flight N: ACTIONS' line");
  }
  return out;
}

}  // namespace pipetrain::schedule
