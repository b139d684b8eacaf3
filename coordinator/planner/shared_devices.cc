#include "coordinator/planner/shared_devices.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/number_list.h"

namespace pipetrain::planner {
namespace {

// The device of stage server `i`: the list's, or one of its own past the list's end.
int DeviceOf(const SharedDevices& d, int i) {
  return i < static_cast<int>(d.of_server.size()) ? d.of_server[i]
                                                  : static_cast<int>(d.slots.size()) + i;
}

int SlotsOf(const SharedDevices& d, int device) {
  return device < static_cast<int>(d.slots.size()) ? std::max(1, d.slots[device]) : 1;
}

std::string NameOf(const SharedDevices& d, int device) {
  return device < static_cast<int>(d.names.size()) ? d.names[device]
                                                   : absl::StrCat("device ", device);
}

}  // namespace

SharedDevices EvenlyShared(int count, int servers_per_device, int slots) {
  SharedDevices d;
  const int per = std::max(1, servers_per_device);
  for (int i = 0; i < count; ++i) d.of_server.push_back(i / per);
  for (int i = 0; i < (count + per - 1) / per; ++i) {
    d.slots.push_back(std::max(1, slots));
    d.names.push_back(absl::StrCat("device ", i));
  }
  return d;
}

absl::Status CheckSharedDevices(const SharedDevices& devices) {
  const int n = static_cast<int>(devices.slots.size());
  if (static_cast<int>(devices.names.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared devices: ", n, " devices but ", devices.names.size(), " names"));
  }
  for (int d = 0; d < n; ++d) {
    if (devices.slots[d] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("shared devices: ", devices.names[d],
                                                     " has ", devices.slots[d], " slots"));
    }
  }
  for (size_t i = 0; i < devices.of_server.size(); ++i) {
    if (devices.of_server[i] < 0 || devices.of_server[i] >= n) {
      return absl::InvalidArgumentError(absl::StrCat("shared devices: stage server ", i,
                                                     " is on device ", devices.of_server[i],
                                                     ", not one of the ", n));
    }
  }
  return absl::OkStatus();
}

ReplicaDevices ForReplica(const SharedDevices& devices, int stages, int replicas) {
  ReplicaDevices out;
  if (devices.empty()) return out;
  std::map<int, int> load;  // device: its stage servers among the job's K x R
  for (int i = 0; i < stages * replicas; ++i) ++load[DeviceOf(devices, i)];
  std::map<int, int> positions;  // device: replica 0's stages on it
  for (int s = 0; s < stages; ++s) ++positions[DeviceOf(devices, s)];
  std::map<int, int> renumbered;
  std::vector<double> slowdown_of;
  for (int s = 0; s < stages; ++s) {
    const int d = DeviceOf(devices, s);
    auto [it, added] = renumbered.emplace(d, static_cast<int>(out.slots.size()));
    if (added) {
      // The share of the device's slots that this replica's stages get, the others'
      // stages computing in step beside them: as many slots as that rounds up to (at
      // most its stages), each slowed so that together they do the share's work.
      const int p = positions[d];
      const double share = static_cast<double>(SlotsOf(devices, d)) * p / load[d];
      const int slots = std::min(p, std::max(1, static_cast<int>(std::ceil(share - 1e-9))));
      out.slots.push_back(slots);
      out.shared_name.push_back(load[d] > 1 ? NameOf(devices, d) : "");
      slowdown_of.push_back(std::max(1.0, slots / share));
    }
    out.device_of_stage.push_back(it->second);
    out.slowdown.push_back(slowdown_of[it->second]);
  }
  return out;
}

std::string DescribeSharing(const SharedDevices& devices, int stages, int replicas) {
  if (devices.empty()) return "";
  std::map<int, std::vector<int>> servers;  // device: its servers among the job's
  for (int i = 0; i < stages * replicas; ++i) servers[DeviceOf(devices, i)].push_back(i);
  std::vector<std::string> lines;
  for (const auto& [d, list] : servers) {
    if (list.size() < 2) continue;
    std::string who;
    if (replicas == 1) {
      who = absl::StrCat("stages ", common::NumberListText(list, ", "));
    } else {
      std::vector<std::string> places;
      for (int i : list) places.push_back(absl::StrCat("r", i / stages, ".s", i % stages));
      who = absl::StrJoin(places, ", ");
    }
    lines.push_back(absl::StrCat(who, " share ", NameOf(devices, d), " (", SlotsOf(devices, d),
                                 " at once)"));
  }
  return absl::StrJoin(lines, "; ");
}

}  // namespace pipetrain::planner
