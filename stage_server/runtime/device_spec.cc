#include "stage_server/runtime/device_spec.h"

#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/number_list.h"

namespace pipetrain::stage_server {

std::string DeviceSpec::ToString() const {
  switch (kind) {
    case Kind::kCpu: return "cpu";
    case Kind::kCuda: return absl::StrCat("cuda:", cuda_index);
    case Kind::kEmulated:
      return absl::StrCat("emulated:", emulated, shared.empty() ? "" : "@", shared);
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
    if (const size_t at = spec.emulated.find('@'); at != std::string::npos) {
      spec.shared = spec.emulated.substr(at + 1);
      spec.emulated.resize(at);
      const bool named = !spec.shared.empty() &&
                         spec.shared.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                                       "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") ==
                             std::string::npos;
      if (spec.emulated.empty() || !named) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--device '", text, "': emulated:NAME@SHARED needs a device name and a shared "
            "device's name of letters, digits, '.', '_' and '-', as in emulated:h100@gpu0"));
      }
    }
    return spec;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--device '", text, "' is not one of cpu, cuda:N or emulated:NAME[@SHARED]"));
}

uint64_t HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

namespace {

// The kernel's boot id (the same for every process and container of a host), else the
// host's name.
std::string HostId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (std::getline(in, id) && !id.empty()) return std::string(absl::StripAsciiWhitespace(id));
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : "unknown-host";
}

}  // namespace

std::string DeviceId(const DeviceSpec& spec, const std::string& cuda_uuid) {
  switch (spec.kind) {
    case DeviceSpec::Kind::kCuda: return absl::StrCat("cuda:", cuda_uuid);
    case DeviceSpec::Kind::kCpu: return absl::StrCat("cpu:", HostId());
    case DeviceSpec::Kind::kEmulated:
      if (!spec.shared.empty()) return absl::StrCat("emulated:", spec.shared);
      return absl::StrCat("emulated:", HostId(), "/", getpid());
  }
  return "";
}

std::string CpuAffinityList() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "";
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return common::NumberListText(cpus);
}

}  // namespace pipetrain::stage_server
