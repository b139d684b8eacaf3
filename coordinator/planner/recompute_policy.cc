#include "coordinator/planner/recompute_policy.h"

#include "absl/strings/str_cat.h"
#include "coordinator/planner/name_list.h"

namespace pipetrain::planner {
namespace {

namespace pb = ::pipetrain::v1;

// The table; RECOMPUTE_UNSPECIFIED reads as its first row.
constexpr RecomputeEntry kModes[] = {
    {pb::RECOMPUTE_NEVER, "never", "every stage keeps its activations for the backward",
     [](int, int, int) { return false; }},
    {pb::RECOMPUTE_ALWAYS, "always",
     "keep each chunk's input only; re-run its forward before its backward",
     [](int, int, int) { return true; }},
    // The last stage's backward follows its forward at once, so re-running buys nothing
    // there (as torchgpipe's except_last spares the last micro-batch).
    {pb::RECOMPUTE_EXCEPT_LAST, "except-last", "as always, on every stage but the last (all its chunks)",
     [](int stage, int, int stages) { return stage != stages - 1; }},
};

const RecomputeEntry& EntryOf(pb::RecomputeMode mode) {
  for (const RecomputeEntry& e : kModes) {
    if (e.mode == mode) return e;
  }
  return kModes[0];
}

}  // namespace

absl::Span<const RecomputeEntry> RecomputeTable() { return kModes; }

absl::StatusOr<pb::RecomputeMode> ParseRecompute(absl::string_view name) {
  if (name.empty()) return kModes[0].mode;
  for (const RecomputeEntry& e : kModes) {
    if (name == e.name) return e.mode;
  }
  return absl::InvalidArgumentError(absl::StrCat("pipeline.recompute: unknown mode '", name,
                                                 "' (expected ", RecomputeNameList(), ")"));
}

std::string RecomputeName(pb::RecomputeMode mode) { return EntryOf(mode).name; }

std::string RecomputeNameList() { return OrList(kModes); }

std::string RecomputeHelp() { return HelpLines(kModes); }

std::vector<std::vector<bool>> ResolveRecompute(pb::RecomputeMode mode, int stages, int chunks) {
  const RecomputeEntry& e = EntryOf(mode);
  std::vector<std::vector<bool>> out(stages, std::vector<bool>(chunks));
  for (int s = 0; s < stages; ++s) {
    for (int c = 0; c < chunks; ++c) out[s][c] = e.recomputes(s, c, stages);
  }
  return out;
}

}  // namespace pipetrain::planner
