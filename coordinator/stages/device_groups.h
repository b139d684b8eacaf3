// Which stage servers compute on one device, from what each reports
// (DeviceInfo.device_id and cpus): stages of one GPU share it; cpu stages of one host
// share the processors where their CPU sets overlap. The planner shares each device's
// time between its stages (coordinator/planner/shared_devices.h). Pure.
#pragma once

#include <string>
#include <vector>

#include "coordinator/planner/shared_devices.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

// The devices of `devices` (the stage servers', in the order the runner gives them
// places). A device's slots: 1 for a GPU or an emulated device; for a host's CPUs, the
// processors its stages' sets cover over the most threads one of them uses (at least
// 1). A stage that reports no device_id (older than the field) has one of its own.
// Empty when no two stages share a device.
planner::SharedDevices GroupDevices(const std::vector<pipetrain::v1::DeviceInfo>& devices);

}  // namespace pipetrain::coordinator
