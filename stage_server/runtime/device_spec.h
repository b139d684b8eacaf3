// The --device flag of pipetrain-stage: "cpu", "cuda:N" or "emulated:NAME", and the
// host memory a CPU or emulated stage may use when no --memory-limit is given.
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

}  // namespace pipetrain::stage_server
