// `pipetrain-bench link`: stage-to-stage throughput of 16 MiB activations through the
// real peer link (gRPC on loopback), against a raw TCP socket on loopback moving the
// same bytes in the same run; with --same-host, also between two stage processes on the
// stream and on the same-host path (shared memory), against one memcpy
// (bench/link_processes.h).
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunLinkBench(const BenchOptions& options);
}
