// `pipetrain-bench codec`: encode + reassemble a 64 MiB tensor through the wire codec,
// against one plain memcpy of the same bytes in the same run.
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunCodecBench(const BenchOptions& options);
}
