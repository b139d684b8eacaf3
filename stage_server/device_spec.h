// The --device flag of pipetrain-stage: "cpu", "cuda:N" or "emulated:NAME".
#pragma once

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

}  // namespace pipetrain::stage_server
