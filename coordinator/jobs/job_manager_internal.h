// What the job manager's two files share (job_manager.cc: the API, queue and stages;
// job_manager_runs.cc: running a job and restarting it): the live job and small helpers.
// Internal to the coordinator library.
#pragma once

#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/jobs/job_events.h"
#include "coordinator/jobs/job_manager.h"
#include "coordinator/runner/restart_rules.h"  // ResumeHint
#include "google/protobuf/timestamp.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

struct JobManager::LiveJob {
  // `stored_logs`: its log lines a previous coordinator already stored (JobEvents).
  LiveJob(size_t events_kept, size_t stored_logs) : events(events_kept, stored_logs) {}
  pipetrain::v1::JobStatus status;  // guarded by JobManager::mu_
  JobEvents events;
  std::atomic<bool> cancel{false};
  std::thread thread;
};

inline void SetNow(google::protobuf::Timestamp* t) {
  const absl::Duration since = absl::Now() - absl::UnixEpoch();
  const int64_t us = absl::ToInt64Microseconds(since);
  t->set_seconds(us / 1000000);
  t->set_nanos(static_cast<int32_t>(us % 1000000) * 1000);
}

// Where the job's checkpoints go: STATE_DIR/checkpoints/JOB/step-N/.
inline std::string CheckpointRoot(const std::string& state_dir, const std::string& job_id) {
  return absl::StrCat(state_dir, "/checkpoints/", job_id);
}

}  // namespace pipetrain::coordinator
