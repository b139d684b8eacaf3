// `pipetrain-bench recovery`: what fault tolerance costs and what it saves, on the
// quickstart's model (examples/tiny-gpt.json) on 4 real CPU stages plus a spare. The
// step-time overhead of in-memory snapshots (jobs with and without them, alternated) and
// the memory they take per stage; then a stage SIGKILLed mid-job (restored from the
// snapshots, and with snapshots off from the newest checkpoint) and a coordinator
// SIGKILLed mid-job: each job's losses against an uninterrupted run's, the steps done
// again, and the time from the kill to the loss being found and to the next step done.
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunRecoveryBench(const BenchOptions& options);
}
