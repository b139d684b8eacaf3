// The schedules in one table: each row says what a schedule is called, which generator
// builds it, the (K, M, v) it accepts, where its model chunks go, the in-flight bound
// the validator holds it to and its textbook bubble. The generators, the planner, spec
// validation and `pipetrain plan --help` all take their list from here.
//
// Adding a schedule: a row in kSchedules (schedule_registry.cc), its generator in
// planner/generators/, its golden files (tests/testdata/schedules) and docs/SCHEDULES.md.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/schedule/action.h"
#include "common/schedule/topology.h"

namespace pipetrain::planner {

// A schedule, as the index of its row in the table. The enumerators name the rows that
// code and tests refer to directly; a schedule needs no enumerator to be planned, run or
// listed (ParseScheduleKind returns the index of any row).
enum class ScheduleKind : int {
  kGpipe = 0,        // all forwards, then all backwards (fill-drain)
  kOneFOneB = 1,     // PipeDream-Flush: warm-up, one forward one backward, cool-down
  kInterleaved = 2,  // Megatron interleaved 1F1B with v model chunks per stage
  kZbH1 = 3,         // zero-bubble H1: backward split into I and W, W deferred into bubbles
  kZbV = 4,          // zero-bubble V: two chunks a stage in a V, I and W split
  kDualPipeV = 5,    // DeepSeek's DualPipe-V: the V with F0 B1 F1 B0 steps
};

// pipeline.schedule when the spec leaves it out.
inline constexpr ScheduleKind kDefaultSchedule = ScheduleKind::kOneFOneB;

// Which chunk of which stage holds which virtual stage: common/schedule/topology.h.
using schedule::Placement;

struct ChunkSlot {
  int stage = 0;
  int chunk = 0;
};
ChunkSlot Place(Placement placement, int virtual_stage, int stages);

struct ScheduleEntry {
  const char* name;         // as pipeline.schedule and `pipetrain plan --schedule` take it
  const char* description;  // one line, for `pipetrain plan --help`
  // Stage `stage`'s compute actions (F, B or I and W) in order, without the optimizer
  // step, for K stages, M micro-batches and v chunks that passed CheckShape.
  std::vector<schedule::Action> (*stage_order)(int stages, int micro_batches, int chunks,
                                               int stage);
  // true: v >= 2 model chunks per stage (pipeline.chunks, default 2; the V placement's
  // schedules take exactly 2, their check_shape says); false: v = 1.
  bool chunked = false;
  // The schedule's own conditions on (K, M, v) after the common ones, errors naming the
  // field and the schedule (`name`); null when it has none.
  absl::Status (*check_shape)(absl::string_view name, int stages, int micro_batches,
                              int chunks) = nullptr;
  Placement placement = Placement::kLooped;
  // Most activations stage s holds at once (per chunk, from a forward until its backward
  // or W); the validator checks the generated programs against it.
  int (*in_flight_bound)(int stages, int micro_batches, int chunks, int stage) = nullptr;
  // The textbook bubble as a fraction of the step, for forward 1, backward 2 (I 1 + W 1)
  // and free transfer, and its formula as `pipetrain plan` prints it.
  double (*textbook_bubble)(double stages, double micro_batches, double chunks) = nullptr;
  const char* bubble_formula = "";
};

// Every row, in the order help and error messages list them.
absl::Span<const ScheduleEntry> ScheduleTable();
// The row of `kind`, which is an enumerator above or what ParseScheduleKind returned.
const ScheduleEntry& EntryOf(ScheduleKind kind);

// A name from the table; the error names pipeline.schedule and lists the names.
absl::StatusOr<ScheduleKind> ParseScheduleKind(absl::string_view name);
std::string ScheduleName(ScheduleKind kind);
// "gpipe, 1f1b, interleaved, zb-h1, zb-v or dualpipe-v".
std::string ScheduleNameList();
// One line per schedule: its name and description, for --help.
std::string ScheduleHelp();
// pipeline.chunks when the spec leaves it out: 2 for a chunked schedule, else 1 (1 for
// a name that is no schedule: validation refuses the name itself).
int DefaultChunks(absl::string_view schedule_name);

// The row's in-flight bound and textbook bubble (see ScheduleEntry).
int InFlightBound(ScheduleKind kind, int stages, int micro_batches, int chunks, int stage);
double TextbookBubble(ScheduleKind kind, int stages, int micro_batches, int chunks);
std::string TextbookFormula(ScheduleKind kind);

}  // namespace pipetrain::planner
