#include "stage_server/stop_drain.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain::stage_server {
namespace {

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.1f s", absl::ToDoubleSeconds(d)); }

}  // namespace

StopCause WaitWhileHeld(const StopDrain& drain) {
  if (drain.grace <= absl::ZeroDuration() || !drain.held()) return StopCause::kNotHeld;
  const std::string id = drain.job_id();
  const std::string job = id.empty() ? "a job" : absl::StrCat("job ", id);
  drain.log(absl::StrCat("stopping: ", job, " holds this stage; serving up to ",
                         absl::ToDoubleSeconds(drain.grace),
                         " s more for its coordinator to finish the step and checkpoint (a "
                         "second SIGINT/SIGTERM stops it at once)"));
  const absl::Time start = drain.now();
  const absl::Time deadline = start + drain.grace;
  for (;;) {
    const absl::Time now = drain.now();
    if (now >= deadline) {
      drain.log(absl::StrCat("stopping: --stop-grace is over (", Seconds(now - start), ") and ",
                             job, " still holds this stage"));
      return StopCause::kGraceOver;
    }
    if (drain.signal_within(std::min(drain.poll, deadline - now))) {
      drain.log(absl::StrCat("stopping at once: a second signal (", job,
                             " still holds this stage)"));
      return StopCause::kSecondSignal;
    }
    if (!drain.held()) {
      drain.log(absl::StrCat("stopping: the coordinator no longer holds this stage (after ",
                             Seconds(drain.now() - start), ")"));
      return StopCause::kReleased;
    }
  }
}

}  // namespace pipetrain::stage_server
