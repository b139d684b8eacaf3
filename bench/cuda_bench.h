// `pipetrain-bench cuda`: forward + backward of one GPT block on the cuda backend against
// a cuBLAS product of the block's MLP shape timed in the same run, in fp32 and TF32.
// Without a GPU (or without CUDA in the build) it fails with a message that says so.
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunCudaBench(const BenchOptions& options);
}
