// `pipetrain-bench cuda` in a build without CUDA: there is nothing to measure.
#include "absl/strings/str_cat.h"
#include "bench/cuda_bench.h"
#include "common/cuda_probe.h"

namespace pipetrain::bench {

absl::StatusOr<BenchResult> RunCudaBench(const BenchOptions& options) {
  return absl::FailedPreconditionError(
      absl::StrCat("no usable GPU: ", common::ProbeCuda().reason));
}

absl::StatusOr<BenchResult> RunCudaTrainBench(const BenchOptions& options) {
  return RunCudaBench(options);
}

absl::StatusOr<BenchResult> RunCudaIpcBench(const BenchOptions& options) {
  return RunCudaBench(options);
}

int RunCudaIpcWorker(int, char**) { return 1; }

}  // namespace pipetrain::bench
