// Byte counts as people read them ("1.5 KiB", "80.0 GiB"), in one form for every message,
// table and listing: the CLI's, the planner's report, the coordinator's and the path
// checks' errors.
#pragma once

#include <string>

#include "absl/strings/str_format.h"

namespace pipetrain::common {

// "512 B", "1.5 KiB", "80.0 GiB": `bytes` in the largest binary unit (up to PiB) it
// reaches, to one decimal; below 1 KiB a whole number of bytes.
inline std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  constexpr int kLast = 5;
  int unit = 0;
  while (bytes >= 1024 && unit < kLast) {
    bytes /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrFormat("%.0f B", bytes);
  return absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

}  // namespace pipetrain::common
