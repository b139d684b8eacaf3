// The end of `pipetrain submit` that `pipetrain resume` shares: send a checked spec to
// the coordinator, then follow the job to its end (progress, logs, summary).
#pragma once

#include <ostream>

#include "client/remote.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

// Submits `spec` (already validated) and, unless no_wait, follows the job; returns the
// exit code (0 succeeded, 1 failed or cancelled, 2 refused, 3 coordinator lost).
int SubmitAndFollow(Remote& remote, const pipetrain::v1::JobSpec& spec, bool no_wait,
                    bool json, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
