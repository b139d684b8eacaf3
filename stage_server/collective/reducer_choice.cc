#include "stage_server/collective/reducer_choice.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "stage_server/collective/coordinator_store.h"
#include "stage_server/collective/nccl_reducer.h"

namespace pipetrain::stage_server::collective {

namespace {

constexpr char kNcclPlacePrefix[] = "nccl ";

// What every replica publishes once: the host it listens on for gloo, a newline, and
// where it runs (a host name holds no newline).
struct Arrival {
  std::vector<std::string> hosts;
  std::vector<std::string> places;
};

absl::StatusOr<Arrival> SplitArrivals(const ReducerOptions& options,
                                      const std::vector<std::string>& values) {
  Arrival out;
  for (size_t r = 0; r < values.size(); ++r) {
    std::vector<std::string> parts = absl::StrSplit(values[r], absl::MaxSplits('\n', 1));
    if (parts.size() != 2 || parts[0].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ReducerWho(options), ": replica ", r, " published '", values[r],
                       "' in the rendezvous, not its listen host and place"));
    }
    out.hosts.push_back(std::move(parts[0]));
    out.places.push_back(std::move(parts[1]));
  }
  return out;
}

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
  ASSIGN_OR_RETURN(std::vector<std::string> values,
                   ExchangeWithReplicas(options, store, "place/",
                                        absl::StrCat(options.listen_host, "\n", place), deadline));
  ASSIGN_OR_RETURN(Arrival arrival, SplitArrivals(options, values));
  out.choice = ChooseCollective(arrival.places);
  if (out.choice.nccl) {
    ASSIGN_OR_RETURN(out.reducer, CreateNcclReducer(options, *cuda_device, store, deadline));
  } else {
    ASSIGN_OR_RETURN(out.reducer,
                     ConnectGlooReducer(options, store, std::move(arrival.hosts), deadline));
  }
  return out;
}

}  // namespace pipetrain::stage_server::collective
