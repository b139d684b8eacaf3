// What `pipetrain resume` submits: a stopped job's spec, started from its latest
// checkpoint, for the steps it had left. Pure: no RPC.
#pragma once

#include "absl/status/statusor.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::client {

// The spec that continues `job` (a FAILED or CANCELLED job, as GetJob returns it):
// init_from its checkpoint_dir and training.steps = the steps left after that
// checkpoint; everything else as the job had it. A checkpoint resumes weights, AdamW
// state, data order and warm-up, so the result equals the unbroken run. Errors (running
// or queued, succeeded, no checkpoint, nothing left) name the job and say what to do.
absl::StatusOr<pipetrain::v1::JobSpec> ResumeSpec(const pipetrain::v1::JobStatus& job);

}  // namespace pipetrain::client
