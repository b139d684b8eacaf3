// `pipetrain-bench compute`: training throughput of the CPU backend on the issue's
// config (d_model 256, 8 layers, 4 heads, seq 128, batch 32) at 1 and 2 threads, with
// the achieved GFLOP/s beside the sgemm GFLOP/s measured in the same run, and the same
// model trained by PyTorch on the CPU right after (bench/torch_compute_bench.py under
// /usr/bin/python3; labelled skipped where torch is not importable).
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunComputeBench(const BenchOptions& options);
}
