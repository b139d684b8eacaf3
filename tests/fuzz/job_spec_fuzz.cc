// Fuzzes job specs as users write them (coordinator/job_spec): the JSON parser, the
// defaults and the validator, and `--set` overrides. Round trip that must hold: a spec
// printed by JobSpecToJson parses back to the same message.
#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "coordinator/spec/job_spec.h"
#include "google/protobuf/util/field_comparator.h"
#include "google/protobuf/util/message_differencer.h"

namespace coordinator = pipetrain::coordinator;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  // Text after the first NUL byte is a list of overrides, one a line.
  const size_t nul = input.find('\0');
  const absl::string_view json = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != absl::string_view::npos) {
    absl::string_view rest = input.substr(nul + 1);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      if (nl == absl::string_view::npos) break;
      rest = rest.substr(nl + 1);
    }
  }

  std::string text(json);
  if (!overrides.empty()) {
    auto applied = coordinator::ApplyOverrides(json, overrides);
    if (!applied.ok()) return 0;
    text = *std::move(applied);
  }
  auto spec = coordinator::ParseJobSpec(text);
  if (!spec.ok()) return 0;
  const pipetrain::v1::JobSpec full = coordinator::WithDefaults(*spec);
  (void)coordinator::ValidateJobSpec(full);

  // The JSON mapping spells NaN "NaN"; it must come back as NaN.
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  auto again = coordinator::ParseJobSpec(coordinator::JobSpecToJson(full));
  if (!again.ok() || !differencer.Compare(*again, full)) __builtin_trap();
  return 0;
}
