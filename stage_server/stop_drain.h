// What a stage server does between SIGINT/SIGTERM and its stop (pipetrain-stage
// --stop-grace): while its coordinator holds it for a job it keeps serving, so that the
// coordinator, signalled at the same moment (scancel signals every process of a job),
// can finish the job's step and take its checkpoint through it; it stops once the
// coordinator lets it go, at a second signal, or when the grace time is over. Pure: the
// hold, the wait for a signal and the clock are given, so tests need neither.
#pragma once

#include <functional>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pipetrain::stage_server {

struct StopDrain {
  absl::Duration grace;  // --stop-grace; zero: stop at once
  // Whether the coordinator holds this stage now (Registration::held: false once its
  // heartbeats fail, as a coordinator gone finishes no step here).
  std::function<bool()> held;
  std::function<std::string()> job_id;  // the job configured here ("" none), for the log
  // Waits at most the given time for another SIGINT/SIGTERM; true if one came.
  std::function<bool(absl::Duration)> signal_within;
  std::function<absl::Time()> now = [] { return absl::Now(); };
  std::function<void(const std::string&)> log;
  absl::Duration poll = absl::Milliseconds(250);  // how often `held` is asked
};

enum class StopCause {
  kNotHeld,       // no job held the stage (or no grace): it stops at once
  kReleased,      // the coordinator let it go, or stopped answering
  kSecondSignal,  // another SIGINT/SIGTERM
  kGraceOver,     // still held after the grace time
};

// Waits as `drain` says and returns why the wait ended; never longer than the grace
// (give or take one `signal_within` call). Logs once when the wait starts and once
// when it ends; nothing when there is nothing to wait for.
StopCause WaitWhileHeld(const StopDrain& drain);

}  // namespace pipetrain::stage_server
