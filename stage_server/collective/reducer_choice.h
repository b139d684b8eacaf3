// Which collective library the R replicas of one stage position reduce with: NCCL where
// every replica is a CUDA stage on a GPU of its own (NCCL takes one rank per GPU and
// reduces in device memory, over NVLink or the network), gloo over TCP otherwise. Each
// replica publishes where it runs through the coordinator and reads the others', so all
// of them make the same choice.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stage_server/collective/gradient_reducer.h"

namespace pipetrain::stage_server::collective {

// Where a CPU stage runs, as its replicas see it.
inline constexpr char kCpuPlace[] = "cpu";

// Where a CUDA stage on `cuda_device` runs: "nccl host=H gpu=BUS" (H this host's name,
// BUS the device's PCI bus id) when this build has NCCL and the id can be read; else a
// phrase saying why NCCL cannot be used ("cuda:0, built without NCCL").
std::string CudaPlace(int cuda_device);

struct CollectiveChoice {
  bool nccl = false;
  std::string reason;  // one line for the stage's log
};

// From every replica's place (kCpuPlace or CudaPlace's), in replica order: NCCL only
// when every place is an NCCL one and no two are the same GPU.
CollectiveChoice ChooseCollective(const std::vector<std::string>& places);

struct ChosenReducer {
  std::unique_ptr<GradientReducer> reducer;
  CollectiveChoice choice;
};

// Connects this replica to the others of its stage position with the library
// ChooseCollective picks (R = 1: no connection, no exchange). `cuda_device`: the
// stage's CUDA device, nullopt for a CPU stage. Errors as CreateGlooReducer's.
absl::StatusOr<ChosenReducer> CreateReducer(const ReducerOptions& options,
                                            std::optional<int> cuda_device);

}  // namespace pipetrain::stage_server::collective
