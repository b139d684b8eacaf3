#include "coordinator/stages/stage_costs.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "coordinator/stages/device_groups.h"

namespace pipetrain::coordinator {

namespace {
constexpr double kCpuThreadFlops = 10e9;
constexpr double kLinkBytesPerSecond = 1e9;
}  // namespace

void SetCostsFromDevices(const std::vector<pipetrain::v1::DeviceInfo>& devices,
                         planner::PlanOptions& options) {
  double flops = 0;
  std::vector<double> each;
  for (const pipetrain::v1::DeviceInfo& d : devices) {
    const double f = d.peak_flops() > 0 ? d.peak_flops()
                                        : kCpuThreadFlops * std::max(1, d.threads());
    each.push_back(f);
    flops = flops == 0 ? f : std::min(flops, f);
  }
  if (flops > 0) options.device_flops = flops;
  // Stages of different speeds: each against the slowest.
  options.server_speed.clear();
  if (std::any_of(each.begin(), each.end(), [&](double f) { return f != flops; })) {
    for (double f : each) options.server_speed.push_back(f / flops);
  }
  options.link_bytes_per_s = kLinkBytesPerSecond;
  uint64_t memory = 0;
  for (const pipetrain::v1::DeviceInfo& d : devices) {
    if (d.memory_bytes() == 0) {
      memory = 0;
      break;
    }
    memory = memory == 0 ? d.memory_bytes() : std::min(memory, d.memory_bytes());
  }
  options.memory_cap_bytes = static_cast<double>(memory);
  options.devices = GroupDevices(devices);
}

}  // namespace pipetrain::coordinator
