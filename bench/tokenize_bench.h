// `pipetrain-bench tokenize`: GPT-2 BPE throughput (MB/s of text) of our tokenizer on 1,
// 2 and 4 threads against npm's gpt-3-encoder under node (bench/gpt2_js_encode.js,
// encoding timed inside node) on the same text in the same run: the King James Bible
// from Debian's bible-kjv (4.4 MB), or a mixed-script text where `bible` is absent.
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunTokenizeBench(const BenchOptions& options);
}
