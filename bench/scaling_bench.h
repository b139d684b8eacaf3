// `pipetrain-bench scaling`: stages vs speed, GPipe's second experiment on emulated
// stages. One real cluster (a coordinator and 8 `pipetrain-stage --device emulated:RATE`
// processes) runs a job per (K, M, schedule) through the `pipetrain` CLI; the median
// tokens/s is normalised to K = 1 and set beside the ideal K*M/(M+K-1) and the
// simulator's bound. PIPETRAIN_BENCH_DATA_OUT=FILE also writes the table for gnuplot;
// PIPETRAIN_BENCH_SCALING_FLOPS=RATE changes the emulated rate (default 2.5e11).
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunScalingBench(const BenchOptions& options);
}
