#include "coordinator/stages/device_groups.h"

#include <algorithm>
#include <numeric>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/number_list.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

namespace {

bool IsCpu(const pb::DeviceInfo& d) { return absl::StartsWith(d.device_id(), "cpu:"); }

// Two stages compute on one device: one GPU or emulated device by its id; one host's
// CPUs where their sets overlap (a set that cannot be read counts as the whole host).
bool Shares(const pb::DeviceInfo& a, const pb::DeviceInfo& b) {
  if (a.device_id().empty() || a.device_id() != b.device_id()) return false;
  if (!IsCpu(a)) return true;
  const std::vector<int> x = common::ParseNumberList(a.cpus()), y = common::ParseNumberList(b.cpus());
  if (x.empty() || y.empty()) return true;
  return std::find_first_of(x.begin(), x.end(), y.begin(), y.end()) != x.end();
}

int Root(std::vector<int>& parent, int i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}

// A device's name for reports: the GPU's or emulated device's id; a host's "cpu:" and
// the first 8 digits of its boot id, with the CPUs its stages use.
std::string NameOf(const pb::DeviceInfo& first, const std::vector<int>& cpus) {
  if (!IsCpu(first)) return first.device_id();
  const std::string host = first.device_id().substr(0, 4 + 8);
  return cpus.empty() ? host : absl::StrCat(host, " cpus ", common::NumberListText(cpus));
}

}  // namespace

planner::SharedDevices GroupDevices(const std::vector<pb::DeviceInfo>& devices) {
  const int n = static_cast<int>(devices.size());
  std::vector<int> parent(n);
  std::iota(parent.begin(), parent.end(), 0);
  bool any = false;
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      if (!Shares(devices[i], devices[j])) continue;
      parent[Root(parent, j)] = Root(parent, i);
      any = true;
    }
  }
  planner::SharedDevices out;
  if (!any) return out;
  std::vector<int> index(n, -1);  // root -> device index
  std::vector<std::set<int>> cpus;
  std::vector<int> threads;
  for (int i = 0; i < n; ++i) {
    const int root = Root(parent, i);
    if (index[root] < 0) {
      index[root] = static_cast<int>(out.slots.size());
      out.slots.push_back(1);
      out.names.push_back("");
      cpus.emplace_back();
      threads.push_back(1);
    }
    const int d = index[root];
    out.of_server.push_back(d);
    for (int c : common::ParseNumberList(devices[i].cpus())) cpus[d].insert(c);
    threads[d] = std::max(threads[d], devices[i].threads());
  }
  for (int i = 0; i < n; ++i) {
    const int d = out.of_server[i];
    if (!out.names[d].empty()) continue;
    const std::vector<int> used(cpus[d].begin(), cpus[d].end());
    out.names[d] = NameOf(devices[i], used);
    if (IsCpu(devices[i]) && !used.empty()) {
      out.slots[d] = std::max(1, static_cast<int>(used.size()) / threads[d]);
    }
  }
  return out;
}

}  // namespace pipetrain::coordinator
