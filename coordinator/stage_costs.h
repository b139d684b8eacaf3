// The costs a job is planned with, until stages measure their own: the slowest stage's
// FLOP rate (its device's peak, or 10 GFLOP/s per CPU thread) and a loopback-class
// link. They only feed the predicted bubble and timeline; results never depend on them.
#pragma once

#include <vector>

#include "coordinator/planner/planner.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

// Sets options.device_flops and options.link_bytes_per_s for stages with these devices.
void SetCostsFromDevices(const std::vector<pipetrain::v1::DeviceInfo>& devices,
                         planner::PlanOptions& options);

}  // namespace pipetrain::coordinator
