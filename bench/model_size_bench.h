// `pipetrain-bench model-size`: GPipe's first experiment, the largest GPT that trains on
// K = 1, 2, 4, 8 real stage servers capped by the same --memory-limit, with and without
// re-materialization, for deeper and for wider models. The planner's binary search gives
// the candidate; two training steps through the coordinator confirm it (stepping down
// while a run fails or a stage's reported peak exceeds the cap). Figures: parameters,
// the ratio to K times the K = 1 maximum, re-materialization's gain, measured peaks
// against the cap and the planner's prediction; also a gnuplot-readable table.
//
// Environment: PIPETRAIN_BENCH_MEMORY_LIMIT (bytes per stage, default 128 MiB),
// PIPETRAIN_BENCH_MODEL_SIZE_STAGES ("1,2,4,8"), PIPETRAIN_BENCH_MODEL_SIZE_FAMILIES
// ("depth,width"), PIPETRAIN_BENCH_DATA_OUT (write the table to this file).
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunModelSizeBench(const BenchOptions& options);
}
