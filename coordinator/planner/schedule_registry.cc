#include "coordinator/planner/schedule_registry.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "common/schedule/stage_program.h"
#include "coordinator/planner/generators/dualpipe_v.h"
#include "coordinator/planner/generators/gpipe.h"
#include "coordinator/planner/generators/interleaved.h"
#include "coordinator/planner/generators/one_f_one_b.h"
#include "coordinator/planner/generators/zb_h1.h"
#include "coordinator/planner/generators/zb_v.h"
#include "coordinator/planner/name_list.h"

namespace pipetrain::planner {
namespace {

// Megatron's condition for interleaving: micro-batches go round in groups of K.
absl::Status MicroBatchesInGroupsOfStages(absl::string_view name, int k, int m, int /*v*/) {
  if (m % k == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("pipeline.micro_batches (", m,
                                                 ") must be a multiple of pipeline.stages (", k,
                                                 ") for the ", name, " schedule"));
}

// The V schedules: two chunks a stage (the V's two arms), and enough micro-batches for
// the first one to come back up the V before the fill ends (2K-1).
absl::Status TwoChunksAndFilledV(absl::string_view name, int k, int m, int v) {
  if (v != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("pipeline.chunks must be 2 for the ", name,
                     " schedule (got ", v, "): its V holds two chunks a stage"));
  }
  if (m < 2 * k - 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline.micro_batches (", m, ") must be at least 2 x pipeline.stages - 1 (", 2 * k - 1,
        ") for the ", name, " schedule"));
  }
  return absl::OkStatus();
}

// The table. Its order is ScheduleKind's and the order in which help lists the names.
constexpr ScheduleEntry kSchedules[] = {
    {.name = "gpipe",
     .description = "fill-drain: every forward, then every backward (GPipe)",
     .stage_order = generators::Gpipe,
     // Every stage holds all M micro-batches until the drain.
     .in_flight_bound = [](int, int m, int, int) { return m; },
     .textbook_bubble = [](double k, double m, double) { return (k - 1) / (m + k - 1); },
     .bubble_formula = "(K-1)/(M+K-1)"},
    {.name = "1f1b",
     .description = "PipeDream-Flush: one forward, one backward; stage s holds K - s",
     .stage_order = generators::OneFOneB,
     .in_flight_bound = [](int k, int m, int, int s) { return std::min(k - s, m); },
     .textbook_bubble = [](double k, double m, double) { return (k - 1) / (m + k - 1); },
     .bubble_formula = "(K-1)/(M+K-1)"},
    {.name = "interleaved",
     .description = "Megatron's interleaved 1F1B: v >= 2 chunks a stage, M a multiple of K",
     .stage_order = generators::Interleaved,
     .chunked = true,
     .check_shape = MicroBatchesInGroupsOfStages,
     .placement = Placement::kLooped,
     .in_flight_bound = [](int k, int m, int v,
                           int s) { return std::min(2 * (k - s - 1) + (v - 1) * k + 1, v * m); },
     // (K-1)/(vM) of the ideal step.
     .textbook_bubble = [](double k, double m, double v) { return (k - 1) / (v * m + k - 1); },
     .bubble_formula = "(K-1)/(vM+K-1)"},
    {.name = "zb-h1",
     .description = "zero bubble H1: backward split in I and W, W deferred into the bubbles",
     .stage_order = generators::ZbH1,
     // Its W passes are deferred, so every stage holds as many as 1F1B's first stage
     // does: the paper's "same peak memory as 1F1B".
     .in_flight_bound = [](int k, int m, int, int) { return std::min(k, m); },
     // The paper's (K-1)(F+I-W) bubble, a third of 1F1B's bubble time, which the
     // generator reaches exactly when M >= K.
     .textbook_bubble = [](double k, double m, double) { return (k - 1) / (3 * m + k - 1); },
     .bubble_formula = "(K-1)/(3M+K-1)"},
    {.name = "zb-v",
     .description = "zero bubble V: two chunks a stage in a V (stage 0 holds the first and "
                    "last), I and W split; M >= 2K-1",
     .stage_order = generators::ZbV,
     .chunked = true,
     .check_shape = TwoChunksAndFilledV,
     .placement = Placement::kV,
     // 2K chunk activations, each half a stage's: 1F1B's first stage's K.
     .in_flight_bound = [](int k, int m, int, int) { return std::min(2 * k, 2 * m); },
     // Per stage, the chunks' F, I and W take 1/2 each, and every stage waits K-1 of
     // them in all: (K-1)/2 of 3M.
     .textbook_bubble = [](double k, double m, double) { return (k - 1) / (6 * m + k - 1); },
     .bubble_formula = "(K-1)/(6M+K-1)"},
    {.name = "dualpipe-v",
     .description = "DeepSeek's DualPipe-V: the V of zb-v, steps of F0 B1 F1 B0, I and W split "
                    "at the ends; M >= 2K-1",
     .stage_order = generators::DualPipeV,
     .chunked = true,
     .check_shape = TwoChunksAndFilledV,
     .placement = Placement::kV,
     // zb-v's 2K after the fill, one more from the steady phase's F0 before its B1 (which
     // stage 0 skips when M = 2K-1).
     .in_flight_bound = [](int k, int m, int,
                           int s) { return std::min(2 * k + (m - 2 * k + s + 1 > 0 ? 1 : 0), 2 * m); },
     .textbook_bubble = [](double k, double m, double) { return (k - 1) / (6 * m + k - 1); },
     .bubble_formula = "(K-1)/(6M+K-1)"},
};

}  // namespace

ChunkSlot Place(Placement placement, int virtual_stage, int stages) {
  // The chunk count does not change where a virtual stage lives.
  const schedule::Topology t{stages, 1, placement};
  return {t.StageOf(virtual_stage), t.ChunkOf(virtual_stage)};
}

absl::Span<const ScheduleEntry> ScheduleTable() { return kSchedules; }

const ScheduleEntry& EntryOf(ScheduleKind kind) { return kSchedules[static_cast<int>(kind)]; }

absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name) {
  for (size_t i = 0; i < std::size(kSchedules); ++i) {
    if (name == kSchedules[i].name) return static_cast<ScheduleKind>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("pipeline.schedule: unknown schedule '", name,
                                                 "' (expected ", ScheduleNameList(), ")"));
}

std::string ScheduleName(ScheduleKind kind) { return EntryOf(kind).name; }

std::string ScheduleNameList() { return OrList(kSchedules); }

std::string ScheduleHelp() { return HelpLines(kSchedules); }

int DefaultChunks(absl::string_view schedule_name) {
  absl::StatusOr<ScheduleKind> kind = ParseScheduleKind(schedule_name);
  return kind.ok() && EntryOf(*kind).chunked ? 2 : 1;
}

int InFlightBound(ScheduleKind kind, int k, int m, int v, int s) {
  return EntryOf(kind).in_flight_bound(k, m, v, s);
}

double TextbookBubble(ScheduleKind kind, int k, int m, int v) {
  return EntryOf(kind).textbook_bubble(k, m, v);
}

std::string TextbookFormula(ScheduleKind kind) { return EntryOf(kind).bubble_formula; }

}  // namespace pipetrain::planner
