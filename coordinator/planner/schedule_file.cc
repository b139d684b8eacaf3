#include "coordinator/planner/schedule_file.h"

#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/schedule/validator.h"
#include "common/status_macros.h"
#include "coordinator/planner/lowering.h"

namespace pipetrain::planner {
namespace {

constexpr absl::string_view kField = "pipeline.schedule_file: ";

absl::Status Refuse(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(kField, what));
}

absl::Status CheckShapeMatches(const schedule::StageProgram& header, int k, int m, int v) {
  for (auto [got, want, field] : {std::tuple{header.num_stages, k, "pipeline.stages"},
                                  {header.num_micro_batches, m, "pipeline.micro_batches"},
                                  {header.num_chunks, v, "pipeline.chunks"}}) {
    if (got != want) {
      return Refuse(absl::StrCat("the file is for ", got, " where ", field, " is ", want,
                                 "; write the schedule for the job's shape or change ", field));
    }
  }
  return absl::OkStatus();
}

// Each stage once, in order; a bound declared; no communication (lowering adds it);
// one optimizer step, last.
absl::Status CheckPrograms(const schedule::Schedule& s, int k) {
  if (static_cast<int>(s.size()) != k) {
    return Refuse(absl::StrCat("the file has ", s.size(), " stage programs for ", k,
                               " stages; write one line 'stage S max_in_flight N: ...' each"));
  }
  for (int i = 0; i < k; ++i) {
    const schedule::StageProgram& p = s[i];
    if (p.stage != i) {
      return Refuse(absl::StrCat("program ", i, " is for stage ", p.stage,
                                 "; list stages 0 to ", k - 1, " in order"));
    }
    if (p.forward_only) return Refuse("a training schedule cannot be forward_only");
    if (p.max_in_flight <= 0) {
      return Refuse(absl::StrCat("stage ", i,
                                 " declares no memory bound; give max_in_flight N > 0, the most "
                                 "activations it may hold (pipetrain plan prints each stage's)"));
    }
    for (size_t pos = 0; pos < p.actions.size(); ++pos) {
      if (schedule::IsCommunication(p.actions[pos].kind)) {
        return Refuse(absl::StrCat("stage ", i, " position ", pos, " (",
                                   schedule::ToString(p.actions[pos]),
                                   "): write compute actions only (F, B, I, W, OPT); the "
                                   "planner adds the sends and receives"));
      }
    }
    if (p.actions.empty() || p.actions.back().kind != schedule::ActionKind::kOptimizerStep) {
      return Refuse(absl::StrCat("stage ", i, " does not end with OPT, its optimizer step"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<schedule::StageProgram> ScheduleFileHeader(absl::string_view text) {
  absl::StatusOr<schedule::Schedule> s = schedule::ParseScheduleText(text);
  if (!s.ok()) return Refuse(s.status().message());
  return s->front();
}

absl::StatusOr<schedule::Schedule> ParseScheduleFile(absl::string_view text, int k, int m,
                                                     int v) {
  absl::StatusOr<schedule::Schedule> s = schedule::ParseScheduleText(text);
  if (!s.ok()) return Refuse(s.status().message());
  RETURN_IF_ERROR(CheckShapeMatches(s->front(), k, m, v));
  RETURN_IF_ERROR(CheckPrograms(*s, k));
  if (absl::Status st = schedule::Validate(*s, {.lowered = false}); !st.ok()) {
    return Refuse(st.message());
  }
  // Lowering cannot add a fault the compute-only check missed; checked all the same,
  // as every generated schedule is.
  if (absl::Status st = schedule::Validate(Lower(*s)); !st.ok()) return Refuse(st.message());
  return *s;
}

}  // namespace pipetrain::planner
