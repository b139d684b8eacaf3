#include "coordinator/stages/placement.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/address.h"

namespace pipetrain::coordinator {
namespace {

// The stages' hosts, numbered in order of first appearance.
struct Hosts {
  std::vector<std::string> names;
  std::vector<int> of;  // per stage, its host's number
};

Hosts GroupByHost(const std::vector<StageRecord>& stages) {
  Hosts hosts;
  for (const StageRecord& s : stages) {
    const std::string host = StageHost(s.address);
    auto it = std::find(hosts.names.begin(), hosts.names.end(), host);
    if (it == hosts.names.end()) it = hosts.names.insert(hosts.names.end(), host);
    hosts.of.push_back(static_cast<int>(it - hosts.names.begin()));
  }
  return hosts;
}

// Per stage position, its copies' hosts (numbers of `hosts`) with how many copies each
// holds, in order of the replica that first has one there.
std::vector<std::vector<std::pair<int, int>>> CopiesByHost(const std::vector<int>& host_of_slot,
                                                           int replicas, int k) {
  std::vector<std::vector<std::pair<int, int>>> out(k);
  for (int s = 0; s < k; ++s) {
    for (int r = 0; r < replicas; ++r) {
      const int host = host_of_slot[r * k + s];
      auto it = std::find_if(out[s].begin(), out[s].end(),
                             [&](const auto& p) { return p.first == host; });
      if (it == out[s].end()) {
        out[s].push_back({host, 1});
      } else {
        ++it->second;
      }
    }
  }
  return out;
}

// The sum over stage positions of the hosts each one's copies are on.
int HostSpans(const std::vector<int>& host_of_slot, int replicas, int k) {
  int spans = 0;
  for (const auto& hosts : CopiesByHost(host_of_slot, replicas, k)) {
    spans += static_cast<int>(hosts.size());
  }
  return spans;
}

bool Applies(size_t n, int replicas, int k) {
  return replicas > 1 && k > 0 && n == static_cast<size_t>(replicas) * static_cast<size_t>(k);
}

}  // namespace

std::string StageHost(const std::string& address) {
  absl::StatusOr<common::HostPort> hp = common::ParseHostPort(address, 0, "stage address");
  return hp.ok() ? hp->host : address;
}

std::vector<StageRecord> PlaceReplicas(std::vector<StageRecord> stages, int replicas, int k) {
  const int n = static_cast<int>(stages.size());
  if (!Applies(stages.size(), replicas, k)) return stages;
  const Hosts hosts = GroupByHost(stages);
  const int h = static_cast<int>(hosts.names.size());
  std::vector<int> left(h, 0);  // per host, its stages not yet given to a position
  for (int x : hosts.of) ++left[x];

  // quota[s][x]: how many of position s's copies host x holds.
  std::vector<std::vector<int>> quota(k, std::vector<int>(h, 0));
  for (int s = 0; s < k; ++s) {
    // The position's copies in the input order, per host: ties go to where they are.
    std::vector<int> own(h, 0);
    for (int r = 0; r < replicas; ++r) ++own[hosts.of[r * k + s]];
    int need = replicas;
    while (need > 0) {
      // A host that holds every copy still needed (the one that has most of them
      // already, then the first), else the host with the most stages left.
      int best = -1;
      for (int x = 0; x < h; ++x) {
        if (left[x] >= need && (best < 0 || own[x] > own[best])) best = x;
      }
      if (best < 0) {
        for (int x = 0; x < h; ++x) {
          if (left[x] == 0) continue;
          if (best < 0 || left[x] > left[best] || (left[x] == left[best] && own[x] > own[best])) {
            best = x;
          }
        }
      }
      const int take = std::min(need, left[best]);
      quota[s][best] += take;
      left[best] -= take;
      need -= take;
    }
  }

  // Slots first keep their own stage where its host serves the slot's position, so the
  // order moves only the stages it must; the other slots take the first stage left of a
  // host with copies of their position to hold. The quotas of a host add up to its
  // stages, so a slot always finds one.
  std::vector<int> order(n, -1);
  std::vector<bool> used(n, false);
  for (int i = 0; i < n; ++i) {
    int& q = quota[i % k][hosts.of[i]];
    if (q > 0) {
      --q;
      order[i] = i;
      used[i] = true;
    }
  }
  for (int i = 0; i < n; ++i) {
    if (order[i] >= 0) continue;
    for (int j = 0; j < n; ++j) {
      int& q = quota[i % k][hosts.of[j]];
      if (used[j] || q == 0) continue;
      --q;
      order[i] = j;
      used[j] = true;
      break;
    }
  }
  std::vector<int> placed_hosts(n);
  for (int i = 0; i < n; ++i) placed_hosts[i] = hosts.of[order[i]];
  if (HostSpans(placed_hosts, replicas, k) >= HostSpans(hosts.of, replicas, k)) return stages;
  std::vector<StageRecord> placed;
  placed.reserve(n);
  for (int i = 0; i < n; ++i) placed.push_back(stages[order[i]]);
  return placed;
}

std::vector<int> PositionsSpanningHosts(const std::vector<StageRecord>& placed, int replicas,
                                        int k) {
  std::vector<int> out;
  if (!Applies(placed.size(), replicas, k)) return out;
  const auto copies = CopiesByHost(GroupByHost(placed).of, replicas, k);
  for (int s = 0; s < k; ++s) {
    if (copies[s].size() > 1) out.push_back(s);
  }
  return out;
}

std::string DescribePlacement(const std::vector<StageRecord>& placed, int replicas, int k) {
  if (!Applies(placed.size(), replicas, k)) return "replicas placed: one pipeline";
  const Hosts hosts = GroupByHost(placed);
  const auto copies = CopiesByHost(hosts.of, replicas, k);
  auto n_copies = [](int n) { return absl::StrCat(n, n == 1 ? " copy" : " copies"); };
  std::vector<std::string> parts;
  std::vector<int> spanning;
  for (int s = 0; s < k; ++s) {
    if (copies[s].size() == 1) {
      parts.push_back(absl::StrCat("stage position ", s, " on host ",
                                   hosts.names[copies[s][0].first], " (",
                                   n_copies(copies[s][0].second), ")"));
      continue;
    }
    spanning.push_back(s);
    std::vector<std::string> where;
    for (auto [host, n] : copies[s]) {
      where.push_back(absl::StrCat(n_copies(n), " on ", hosts.names[host]));
    }
    parts.push_back(absl::StrCat("stage position ", s, " spans ", copies[s].size(), " hosts (",
                                 absl::StrJoin(where, ", "), ")"));
  }
  std::string line = absl::StrCat("replicas placed: ", absl::StrJoin(parts, ", "));
  if (!spanning.empty()) {
    absl::StrAppend(&line, "; stage position", spanning.size() == 1 ? " " : "s ",
                    absl::StrJoin(spanning, ", "), spanning.size() == 1 ? " has" : " have",
                    " copies on more than one host: the all-reduce crosses the network there");
  }
  return line;
}

}  // namespace pipetrain::coordinator
