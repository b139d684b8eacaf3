// A schedule written by hand: pipeline.schedule_file's programs (the IR's text form,
// common/schedule/stage_program.h, compute-only: F, B, I, W and OPT, no sends or
// receives), checked as strictly as a generated schedule before anything runs, then
// lowered and run like one. `pipetrain plan JOB.json --print-schedule` writes the form,
// for a schedule of the table, to start from.
#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/stage_program.h"

namespace pipetrain::planner {

// The header of a schedule text (its first program, shape and placement) without
// checking the programs; errors name pipeline.schedule_file and the line.
absl::StatusOr<schedule::StageProgram> ScheduleFileHeader(absl::string_view text);

// The compute-only programs of `text` for K stages, M micro-batches and v chunks:
// the header must say the same (errors name the spec field), every stage's program
// is there, declares its in-flight bound (max_in_flight > 0) and ends with its one
// optimizer step, and the validator passes it before and after lowering (each forward
// and backward once and in order, sends matched by receives, no deadlock, the bound
// held); its error ends with the position-by-stage table, the offending cell in
// [brackets]. Every error starts "pipeline.schedule_file: ".
absl::StatusOr<schedule::Schedule> ParseScheduleFile(absl::string_view text, int stages,
                                                     int micro_batches, int chunks);

}  // namespace pipetrain::planner
