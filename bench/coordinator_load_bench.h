// `pipetrain-bench coordinator-load`: the coordinator under many watchers. A
// real coordinator and one stage: first hundreds of small jobs run one after another,
// with the coordinator's resident memory read after each round (it must stay flat: what
// it keeps per finished job is bounded); then GetJob's latency on the idle coordinator
// (the baseline); then 50 WatchJob streams, 50 clients polling GetJob and 20 queued jobs
// for a bounded time, N times, with GetJob's latency (p50, p99, also as multiples of the
// baseline's), the errors and the memory before and after; then a storm of short-lived
// connections.
#pragma once

#include "absl/status/statusor.h"
#include "bench/benchmark.h"

namespace pipetrain::bench {

absl::StatusOr<BenchResult> RunCoordinatorLoadBench(const BenchOptions& options);

}  // namespace pipetrain::bench
