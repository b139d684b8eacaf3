// Fuzzes the schedule text form (common/schedule): ParseScheduleText and ParseActions,
// then the validator on whatever parses, as a stage server runs it on every program.
// Round trips that must hold: ParseScheduleText(ToText(s)) == s, ParseActions of a
// program's one-line form gives its actions back, and the proto form converts back.
#include <cstddef>
#include <cstdint>
#include "absl/strings/string_view.h"

#include "common/schedule/action.h"
#include "common/schedule/stage_program.h"
#include "common/schedule/validator.h"

namespace schedule = pipetrain::schedule;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  if (auto actions = schedule::ParseActions(text); actions.ok()) {
    auto again = schedule::ParseActions(schedule::ToString(*actions));
    if (!again.ok() || *again != *actions) __builtin_trap();
  }

  auto parsed = schedule::ParseScheduleText(text);
  if (!parsed.ok()) return 0;
  auto again = schedule::ParseScheduleText(schedule::ToText(*parsed));
  if (!again.ok() || *again != *parsed) __builtin_trap();

  for (const schedule::StageProgram& program : *parsed) {
    auto back = schedule::FromProto(schedule::ToProto(program));
    if (!back.ok() || *back != program) __builtin_trap();
    (void)schedule::ValidateProgram(program, {.lowered = true});
    (void)schedule::ValidateProgram(program, {.lowered = false});
    (void)schedule::PeakInFlight(program);
  }
  (void)schedule::Validate(*parsed, {.lowered = true});
  (void)schedule::Validate(*parsed, {.lowered = false});
  return 0;
}
