#include "common/model/optimizer_split.h"

#include "absl/strings/str_cat.h"
#include "common/model/state_bytes.h"

namespace pipetrain::model {

namespace {

// Where copy `copy`'s piece starts: floor(elements * copy / copies), exact in 128 bits.
uint64_t PieceStart(uint64_t elements, int copies, int copy) {
  return static_cast<uint64_t>(static_cast<unsigned __int128>(elements) *
                               static_cast<unsigned>(copy) / static_cast<unsigned>(copies));
}

}  // namespace

CopyRange RangeOfCopy(uint64_t elements, int copies, int copy) {
  return {PieceStart(elements, copies, copy), PieceStart(elements, copies, copy + 1)};
}

std::vector<uint64_t> PieceSizes(uint64_t elements, int copies) {
  std::vector<uint64_t> sizes;
  sizes.reserve(copies);
  for (int r = 0; r < copies; ++r) sizes.push_back(RangeOfCopy(elements, copies, r).size());
  return sizes;
}

absl::Status CheckSplit(const std::string& job_id, int stage, uint64_t params, int copies) {
  if (copies < 1) {
    return absl::InvalidArgumentError(absl::StrCat("job '", job_id, "' stage ", stage,
                                                   ": the optimizer cannot be split among ",
                                                   copies, " copies; pipeline.replicas >= 1"));
  }
  if (params < static_cast<uint64_t>(copies)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job_id, "' stage ", stage, " holds ", params,
        " parameters, fewer than its ", copies,
        " copies to split the optimizer among (pipeline.shard_optimizer); give the stage more "
        "layers (pipeline.stages or partition) or set pipeline.shard_optimizer to false"));
  }
  return absl::OkStatus();
}

double SplitStateBytesPerParam(common::DType products, int copies) {
  return static_cast<double>(WeightBytesPerParam() + GradientBytesPerParam() +
                             ProductCopyBytesPerParam(products)) +
         static_cast<double>(OptimizerBytesPerParam()) / (copies < 1 ? 1 : copies);
}

}  // namespace pipetrain::model
