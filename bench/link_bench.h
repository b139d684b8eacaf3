// `pipetrain-bench link`: stage-to-stage throughput of 16 MiB activations through the
// real peer link (gRPC on loopback), against a raw TCP socket on loopback moving the
// same bytes in the same run.
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunLinkBench(const BenchOptions& options);
}
