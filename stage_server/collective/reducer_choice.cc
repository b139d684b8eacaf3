#include "stage_server/collective/reducer_choice.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "stage_server/collective/coordinator_store.h"
#include "stage_server/collective/nccl_reducer.h"

namespace pipetrain::stage_server::collective {

namespace {

constexpr char kNcclPlacePrefix[] = "nccl ";

}  // namespace

CollectiveChoice ChooseCollective(const std::vector<std::string>& places) {
  for (size_t r = 0; r < places.size(); ++r) {
    if (!absl::StartsWith(places[r], kNcclPlacePrefix)) {
      return {false, absl::StrCat("gloo: replica ", r, " runs on ", places[r])};
    }
    for (size_t q = 0; q < r; ++q) {
      if (places[q] == places[r]) {
        return {false, absl::StrCat("gloo: replicas ", q, " and ", r, " share one GPU (",
                                    places[r].substr(sizeof kNcclPlacePrefix - 1),
                                    "), and NCCL takes one GPU per replica")};
      }
    }
  }
  return {true,
          absl::StrCat("nccl: the ", places.size(), " replicas each have a GPU of their own")};
}

absl::StatusOr<ChosenReducer> CreateReducer(const ReducerOptions& options,
                                            std::optional<int> cuda_device) {
  RETURN_IF_ERROR(CheckReducerOptions(options));
  ChosenReducer out;
  if (options.replicas == 1) {
    out.choice = {false, "none: one replica"};
    ASSIGN_OR_RETURN(out.reducer, CreateGlooReducer(options));
    return out;
  }
  const absl::Time deadline = absl::Now() + options.connect_deadline;
  CoordinatorStore store(options.coordinator_address, options.security, options.job_id,
                         StageRendezvousPrefix(options), options.connect_deadline);
  const std::string place = cuda_device.has_value() ? CudaPlace(*cuda_device) : kCpuPlace;
  ASSIGN_OR_RETURN(std::vector<std::string> places,
                   ExchangeWithReplicas(options, store, "place/", place, deadline));
  out.choice = ChooseCollective(places);
  ReducerOptions rest = options;
  rest.connect_deadline = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  if (out.choice.nccl) {
    ASSIGN_OR_RETURN(out.reducer, CreateNcclReducer(rest, *cuda_device, store));
  } else {
    ASSIGN_OR_RETURN(out.reducer, CreateGlooReducer(rest));
  }
  return out;
}

}  // namespace pipetrain::stage_server::collective
