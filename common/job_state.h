// What a job's state means, in one place for the coordinator and the CLI alike: whether
// the job has ended (it will not change state again).
#pragma once

#include "pipetrain/v1/job.pb.h"

namespace pipetrain::common {

inline bool JobEnded(pipetrain::v1::JobStatus::State state) {
  return state == pipetrain::v1::JobStatus::SUCCEEDED ||
         state == pipetrain::v1::JobStatus::FAILED ||
         state == pipetrain::v1::JobStatus::CANCELLED;
}

}  // namespace pipetrain::common
