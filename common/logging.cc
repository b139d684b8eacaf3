#include "common/logging.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pipetrain::common {

void Log(LogSeverity severity, absl::string_view component, absl::string_view message) {
  static absl::Mutex mu(absl::kConstInit);
  const char letter = severity == LogSeverity::kInfo      ? 'I'
                      : severity == LogSeverity::kWarning ? 'W'
                                                          : 'E';
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone()),
                   " ", std::string(1, letter), " ", component, "] ", message, "\n");
  absl::MutexLock lock(&mu);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace pipetrain::common
