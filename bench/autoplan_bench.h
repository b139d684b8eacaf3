// `pipetrain-bench autoplan`: how good pipeline.schedule "auto" is. On a grid of two
// models and two stage memories on 4 emulated stages, and one model on 2 cpu stages, the
// plan "auto" picks is measured next to a sample of the same search space measured by
// hand (the planner's 4 best, the default 1f1b M = K plan, 3 at random): its step over
// the best measured (1.0 = it picked the best; the aim is within 1.05), the
// default plan's step over its own, and its predicted step over its measured one.
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunAutoplanBench(const BenchOptions& options);
}
