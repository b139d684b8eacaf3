// `pipetrain-bench allreduce`: gloo's ring all-reduce of one stage's gradients between
// 2 and 4 processes on loopback (rendezvous through an in-process coordinator store
// server), against raw TCP moving the same bytes between the same processes.
#pragma once

#include "absl/status/statusor.h"
#include "bench/benchmark.h"

namespace pipetrain::bench {

absl::StatusOr<BenchResult> RunAllreduceBench(const BenchOptions& options);

// The hidden worker mode (`pipetrain-bench --allreduce-worker ADDR PREFIX RANK SIZE
// FLOATS REPS`): one replica; prints "times gloo=... raw=..." (seconds per repetition)
// on stdout. Returns the process's exit code.
int RunAllreduceWorker(int argc, char** argv);

}  // namespace pipetrain::bench
