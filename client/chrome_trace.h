// A measured timeline (the coordinator's GetTimeline) as Chrome trace JSON, which
// Perfetto and chrome://tracing open: one process per stage, a "compute" and a "link"
// thread in each, the requested steps laid end to end.
#pragma once

#include <string>

#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::client {

// traceEvents: ph "X" per action (ts and dur in microseconds, pid = stage, tid 0 for the
// lane "compute" and 1 for "link", name = the action's text form such as "F3" or
// "SEND_B2@1", args {step, micro_batch, chunk, bytes}), and ph "M" metadata naming each
// process "stage S" and its threads. Each step starts where the previous steps' latest
// action ended. Events of another lane go to the compute thread. A backward that re-ran
// its forward (recompute_us) holds a nested "recompute" span at its start, and an
// optimizer step of data-parallel replicas (reduce_us) a nested "allreduce" span.
std::string TimelineToChromeTrace(const pipetrain::v1::Timeline& timeline);

}  // namespace pipetrain::client
