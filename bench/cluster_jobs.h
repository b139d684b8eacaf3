// Jobs on a testing::LocalCluster for the end-to-end benchmarks (recovery, allreduce):
// submit a spec, poll its status, read its losses and step times back, with the
// `pipetrain` CLI as a user would.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "tests/testing/local_cluster.h"
#include "tests/testing/status_json.h"

namespace pipetrain::bench {

using testing::JobHasEnded;
using testing::JsonInt;
// An RFC 3339 time field; InfinitePast if absent.
absl::Time JsonTime(const nlohmann::json& j, const char* key);

// `pipetrain status ID --json`.
absl::StatusOr<nlohmann::json> JobStatus(testing::LocalCluster& c, const std::string& id);
// `pipetrain submit FILE` (followed to its end when `wait`); the job's id.
absl::StatusOr<std::string> SubmitJob(testing::LocalCluster& c, const std::string& spec_file,
                                      bool wait);
// Polls the job until `pred` holds (deadline 5 minutes).
absl::StatusOr<nlohmann::json> WaitForJob(testing::LocalCluster& c, const std::string& id,
                                          const std::function<bool(const nlohmann::json&)>& pred);

std::vector<double> JobLosses(const nlohmann::json& status);
// User plus system CPU seconds `pid` has used so far (every thread), from /proc; 0 if
// it cannot be read.
double ProcessCpuSeconds(pid_t pid);
// ... summed over the cluster's stage processes.
double StagesCpuSeconds(const testing::LocalCluster& c);
// The median step time over the history, the first `warm` steps left out.
double MedianStepSeconds(const nlohmann::json& status, int warm);

}  // namespace pipetrain::bench
