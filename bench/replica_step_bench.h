// The second half of `pipetrain-bench allreduce`: what data-parallel replicas cost a
// training step. Jobs of R = 1 and R = 2 replicas of one real cpu stage at equal work
// per replica (R = 2 trains twice the batch), alternated, on a local cluster: the step
// time ratio, and from the R = 2 job's measured timeline how long the gradient
// all-reduce took and how much of it the backward hid.
#pragma once

#include "absl/status/status.h"
#include "bench/benchmark.h"

namespace pipetrain::bench {

absl::Status AddReplicaStepFigures(const BenchOptions& options, BenchResult& out);

}  // namespace pipetrain::bench
