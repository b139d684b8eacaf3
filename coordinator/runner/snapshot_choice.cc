#include "coordinator/runner/snapshot_choice.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/status_macros.h"

namespace pipetrain::coordinator {

std::optional<SnapshotChoice> ChooseSnapshotStep(
    const std::vector<std::vector<SnapshotEntry>>& listings, int stages, int chunks,
    int64_t max_step) {
  if (stages <= 0 || chunks <= 0) return std::nullopt;
  // step -> (owner, chunk) -> the best holder so far (own copies first).
  std::map<int64_t, std::map<std::pair<int, int>, std::pair<bool, int>>> by_step;
  for (int h = 0; h < static_cast<int>(listings.size()); ++h) {
    for (const SnapshotEntry& e : listings[h]) {
      if (e.owner_stage < 0 || e.owner_stage >= stages || e.chunk < 0 || e.chunk >= chunks ||
          e.step <= 0 || e.step > max_step) {
        continue;  // not of this layout
      }
      const bool own = !e.held;
      auto [it, inserted] = by_step[e.step].try_emplace({e.owner_stage, e.chunk}, own, h);
      if (!inserted && own && !it->second.first) it->second = {true, h};
    }
  }
  const size_t needed = static_cast<size_t>(stages) * static_cast<size_t>(chunks);
  for (auto it = by_step.rbegin(); it != by_step.rend(); ++it) {
    if (it->second.size() != needed) continue;
    SnapshotChoice choice;
    choice.step = it->first;
    // Interleaved layouts give stage s chunk c the layers of part c*K + s: in layer order.
    for (int c = 0; c < chunks; ++c) {
      for (int s = 0; s < stages; ++s) {
        const auto [own, holder] = it->second.at({s, c});
        choice.picks.push_back({holder, s, c, !own});
      }
    }
    return choice;
  }
  return std::nullopt;
}

absl::StatusOr<model::Checkpoint> AssembleSnapshot(
    const SnapshotChoice& choice,
    const std::function<absl::StatusOr<std::string>(const SnapshotPick&)>& fetch,
    const std::string& job_id) {
  std::vector<model::Checkpoint> parts;
  for (const SnapshotPick& pick : choice.picks) {
    const std::string what = absl::StrCat("job ", job_id, ": the snapshot of step ", choice.step,
                                          " of stage ", pick.owner_stage, " chunk ", pick.chunk);
    ASSIGN_OR_RETURN(std::string bytes, common::ErrorContext(what).Wrap(fetch(pick)));
    ASSIGN_OR_RETURN(model::Checkpoint part, model::ParseCheckpoint(bytes, what));
    if (!part.optimizer) {
      return absl::DataLossError(absl::StrCat(what, " holds no optimizer state"));
    }
    if (part.optimizer->step != choice.step) {
      return absl::DataLossError(absl::StrCat(what, " holds the state after ",
                                              part.optimizer->step,
                                              " updates, not ", choice.step,
                                              ": states of two steps are never mixed"));
    }
    parts.push_back(std::move(part));
  }
  return common::ErrorContext(absl::StrCat("merging the snapshots of step ", choice.step))
      .Job(job_id)
      .Wrap(model::MergeCheckpoints(std::move(parts)));
}

}  // namespace pipetrain::coordinator
