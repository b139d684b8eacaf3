// What a job's state and steps mean, in one place for the coordinator and the CLI alike:
// whether the job has ended (it will not change state again), and which of the training
// run's steps are the job's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::common {

inline bool JobEnded(pipetrain::v1::JobStatus::State state) {
  return state == pipetrain::v1::JobStatus::SUCCEEDED ||
         state == pipetrain::v1::JobStatus::FAILED ||
         state == pipetrain::v1::JobStatus::CANCELLED;
}

// The stage servers a job runs on: pipeline.replicas copies of pipeline.stages.
inline int JobStageServers(const pipetrain::v1::JobSpec& spec) {
  return std::max(1, spec.pipeline().replicas()) * spec.pipeline().stages();
}

// What a run is on, in words: "3 stages", or for a job that ran replicas "1 replica of 2
// stages" (also when one is left); `stages` counts every replica's.
inline std::string JobLayoutText(int replicas_before, int replicas, size_t stages) {
  auto of = [](size_t n) { return absl::StrCat(n, n == 1 ? " stage" : " stages"); };
  if (replicas_before <= 1) return of(stages);
  replicas = std::max(1, replicas);
  return absl::StrCat(replicas, replicas == 1 ? " replica" : " replicas", " of ",
                      of(stages / static_cast<size_t>(replicas)));
}

// A job runs the training run's steps first_step .. JobLastStep: first_step is 1, or one
// past the optimizer step of the checkpoint it started from (unset, 0, before it started
// and in records of older coordinators: taken as 1).
inline int64_t JobFirstStep(const pipetrain::v1::JobStatus& job) {
  return std::max<int64_t>(job.first_step(), 1);
}
inline int64_t JobLastStep(const pipetrain::v1::JobStatus& job) {
  return JobFirstStep(job) - 1 + job.spec().training().steps();
}

}  // namespace pipetrain::common
