// Stage servers that share a device: several stages on one GPU (how a one-GPU machine
// runs a pipeline), or on the cores of one host. The coordinator groups its stages by
// the device each reports (coordinator/stages/device_groups.h); `pipetrain plan` takes
// --stages-per-device. The plan then shares each device's time between the stages on
// it: the simulator gives a device's slots to one compute action each (simulator.h),
// and the R replicas, which compute in step, slow each other where they share one.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pipetrain::planner {

struct SharedDevices {
  // Per stage server, in the order the runner gives them places (position s of replica
  // r takes server r x K + s): the index of the device it computes on.
  std::vector<int> of_server;
  // Per device: how many of its stages compute at full speed at once (a GPU 1; a host
  // its cores over a stage's threads), and its name for reports ("cpu:HOST", "cuda:UUID").
  std::vector<int> slots;
  std::vector<std::string> names;
  bool empty() const { return of_server.empty(); }
};

// `servers` consecutive stage servers to a device of `slots`, for `count` servers.
SharedDevices EvenlyShared(int count, int servers_per_device, int slots);

// What one replica's simulation needs: per stage position its device (renumbered from
// 0) and each device's slots for this replica, and how much slower the stage's compute
// runs because the other replicas' stages on the same device compute in step with it
// (1: not at all). Replica 0 stands for all.
struct ReplicaDevices {
  std::vector<int> device_of_stage;
  std::vector<int> slots;
  std::vector<double> slowdown;
  // Per renumbered device: its name where more than one of the K x R servers is on it,
  // else "".
  std::vector<std::string> shared_name;
};

// For K stages x R replicas on `devices`; servers past the list's end have a device of
// their own. Empty `devices`: every stage its own device, no slowdown.
ReplicaDevices ForReplica(const SharedDevices& devices, int stages, int replicas);

// Errors: a server's device that is not in `slots`, a device of no slots, names
// missing; each names what is wrong.
absl::Status CheckSharedDevices(const SharedDevices& devices);

// "stages 0-3 share cpu:HOST (2 at once)" per device that K x R servers share, joined
// by "; "; "" when none is shared.
std::string DescribeSharing(const SharedDevices& devices, int stages, int replicas);

}  // namespace pipetrain::planner
