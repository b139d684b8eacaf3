#include "stage_server/runtime/device_spec.h"

#include <unistd.h>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::stage_server {

std::string DeviceSpec::ToString() const {
  switch (kind) {
    case Kind::kCpu: return "cpu";
    case Kind::kCuda: return absl::StrCat("cuda:", cuda_index);
    case Kind::kEmulated: return absl::StrCat("emulated:", emulated);
  }
  return "?";
}

absl::StatusOr<DeviceSpec> ParseDeviceSpec(const std::string& text) {
  DeviceSpec spec;
  if (text == "cpu") return spec;
  if (absl::StartsWith(text, "cuda:")) {
    int index = -1;
    if (!absl::SimpleAtoi(text.substr(5), &index) || index < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--device '", text, "': the CUDA device index must be a whole number >= 0, "
          "as in cuda:0"));
    }
    spec.kind = DeviceSpec::Kind::kCuda;
    spec.cuda_index = index;
    return spec;
  }
  if (absl::StartsWith(text, "emulated:") && text.size() > 9) {
    spec.kind = DeviceSpec::Kind::kEmulated;
    spec.emulated = text.substr(9);
    return spec;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--device '", text, "' is not one of cpu, cuda:N or emulated:NAME"));
}

uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

}  // namespace pipetrain::stage_server
