// The costs a job is planned with, until stages measure their own: the slowest stage's
// FLOP rate (its device's peak, or 10 GFLOP/s per CPU thread) and a loopback-class
// link, which only feed the predicted bubble and timeline; and the smallest stage
// memory, which the partition must fit in (a job that cannot is refused before any
// stage is configured).
#pragma once

#include <vector>

#include "coordinator/planner/planner.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

// Sets options.device_flops (the slowest stage's rate) and options.server_speed (each
// stage's rate over it, where they differ) and options.link_bytes_per_s for stages with
// these devices,
// and options.memory_cap_bytes to the smallest DeviceInfo.memory_bytes among them (a
// stage's --memory-limit, or its GPU's memory); 0 (no cap) when any stage's memory is
// unknown (0), since a cap from the others would be a guess for that one (registration
// refuses such a stage, so the registry never hands one out); and options.devices to the
// devices they share (device_groups.h), `devices` being in the order the runner gives
// them places.
void SetCostsFromDevices(const std::vector<pipetrain::v1::DeviceInfo>& devices,
                         planner::PlanOptions& options);

}  // namespace pipetrain::coordinator
