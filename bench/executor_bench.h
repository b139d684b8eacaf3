// `pipetrain-bench executor`: the runtime's own overhead. Four emulated stages (each
// action sleeps for its modelled time; no arithmetic) joined by real peer links on
// loopback run a 1F1B step; its wall time is compared with the planner's simulated
// step for the same costs (ratio, 1.0 = no overhead).
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunExecutorBench(const BenchOptions& options);
}
