// `pipetrain-bench tokenize [--tokenizer gpt2|llama3]`: BPE throughput (MB/s of text) of
// our tokenizer on 1, 2 and 4 threads against the JavaScript encoder under node, encoding
// timed inside node, on the same text in the same run: npm's gpt-3-encoder for gpt2
// (bench/gpt2_js_encode.js), llama3-tokenizer-js for llama3 (bench/llama3_js_encode.js).
// The text: the King James Bible from Debian's bible-kjv (4.4 MB), or a mixed-script
// text where `bible` is absent.
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunTokenizeBench(const BenchOptions& options);
}
