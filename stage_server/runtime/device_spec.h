// The --device flag of pipetrain-stage: "cpu", "cuda:N" or "emulated:NAME[@SHARED]",
// the host memory a CPU or emulated stage may use when no --memory-limit is given, and
// the identity of the device a stage reports (DeviceInfo.device_id and cpus), by which
// the coordinator knows which stages share one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::stage_server {

struct DeviceSpec {
  enum class Kind { kCpu, kCuda, kEmulated };
  Kind kind = Kind::kCpu;
  int cuda_index = 0;      // kCuda
  std::string emulated;    // kEmulated: a device name such as "h100"
  // kEmulated with "@SHARED": the stages naming it share one emulated device, taking
  // turns on it (letters, digits, '.', '_' and '-').
  std::string shared;
  std::string ToString() const;
};

absl::StatusOr<DeviceSpec> ParseDeviceSpec(const std::string& text);

// The CUDA device index of a `cuda:N` stage; nullopt for the other kinds.
inline std::optional<int> CudaIndexOf(const DeviceSpec& device) {
  if (device.kind != DeviceSpec::Kind::kCuda) return std::nullopt;
  return device.cuda_index;
}

// The host's physical memory in bytes (sysconf), 0 if it cannot be read. A stage without
// --memory-limit reports it, since the coordinator refuses a stage of unknown memory,
// and checks its allocations against it.
uint64_t HostMemoryBytes();

// DeviceInfo.device_id for `spec` (see coordinator.proto): "cuda:" and `cuda_uuid`;
// "cpu:" and the host's boot id; "emulated:SHARED", or "emulated:" and the boot id and
// this process's id for an emulated device of its own.
std::string DeviceId(const DeviceSpec& spec, const std::string& cuda_uuid);

// The CPUs this process may run on (sched_getaffinity) as "0-3,8"; "" if unreadable.
std::string CpuAffinityList();

}  // namespace pipetrain::stage_server
