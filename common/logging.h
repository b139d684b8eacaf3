// Plain line logging to stderr with a timestamp, a severity letter and a component:
// "2026-11-29T16:00:00.123Z I stage] configured job j1". Thread-safe, line-atomic.
#pragma once

#include "absl/strings/string_view.h"

namespace pipetrain::common {

enum class LogSeverity { kInfo, kWarning, kError };

void Log(LogSeverity severity, absl::string_view component, absl::string_view message);
inline void LogInfo(absl::string_view component, absl::string_view message) {
  Log(LogSeverity::kInfo, component, message);
}
inline void LogWarning(absl::string_view component, absl::string_view message) {
  Log(LogSeverity::kWarning, component, message);
}
inline void LogError(absl::string_view component, absl::string_view message) {
  Log(LogSeverity::kError, component, message);
}

}  // namespace pipetrain::common
