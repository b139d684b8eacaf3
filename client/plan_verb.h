// `pipetrain plan JOB.json [flags]`: plans a job offline, without a cluster, and prints
// the partition, the predicted step time and bubble next to the textbook formula, and
// the picture of the schedule (or --json, or a Chrome trace with --trace FILE).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace pipetrain::client {

int RunPlan(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

}  // namespace pipetrain::client
