// What GET /metrics serves: the cluster's jobs and stages as Prometheus gauges, made from
// the same records the JSON API returns. Pure: the HTTP API gathers the records (List,
// recent steps, Cluster) and serves the text this returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

struct MetricsInput {
  // Every job, most recent first (JobManager::List). The jobs that JobsWithSeries picks
  // carry in history their steps from FirstStepForMetrics on, in order; others may
  // carry anything (only their state is counted).
  std::vector<pipetrain::v1::JobStatus> jobs;
  pipetrain::v1::ClusterStatus cluster;
  absl::Time now;       // heartbeat ages are measured against it
  std::string version;  // common::ProjectVersion()
};

// Ended jobs that keep per-job series, the most recently finished first. Every job ever
// run would grow every scrape and the server's series without bound; a few keep a job's
// final figures visible when it ends between two scrapes.
inline constexpr int kEndedJobsWithSeries = 5;

// Indices into `jobs`, in their order, of the jobs with per-job series: every RUNNING
// job and the kEndedJobsWithSeries most recently finished SUCCEEDED, FAILED or
// CANCELLED ones. Queued jobs have no figures yet.
std::vector<size_t> JobsWithSeries(const std::vector<pipetrain::v1::JobStatus>& jobs);

// The first step a job's metrics need: its latest one, or with validation every V steps
// the last V steps, which hold its latest validation loss (validation runs on multiples
// of V and on the last step). Spares a scrape the job's whole history.
int64_t FirstStepForMetrics(const pipetrain::v1::JobStatus& job);

// The exposition text (prometheus_text.h has the content type to serve it with).
std::string PrometheusMetrics(const MetricsInput& input);

}  // namespace pipetrain::coordinator
