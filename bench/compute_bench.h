// `pipetrain-bench compute`: training throughput of the CPU backend on the issue's
// config (d_model 256, 8 layers, 4 heads, seq 128, batch 32) at 1 and 2 threads, with
// the achieved GFLOP/s beside the sgemm GFLOP/s measured in the same run, and the same
// model trained by PyTorch on the CPU right after (bench/torch_compute_bench.py under
// /usr/bin/python3; labelled skipped where torch is not importable). With --model llama
// (BenchOptions::model) the model is a stack with Llama-3.2-1B's proportions at the same
// size instead (see its label).
#pragma once

#include <string>

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunComputeBench(const BenchOptions& options);
// Refuses a --model that `compute` does not train, naming the accepted values.
absl::Status CheckComputeModel(const std::string& name);
// `pipetrain-bench compute-124m`: a GPT-2-124M-shaped model (tied, vocab 50257) at
// batch 4 x 64 tokens on 2 threads, llm.c's CPU trainer's shape: tokens/s of the
// OpenBLAS fp32 step, oneDNN fp32 and oneDNN bf16, in the same run.
absl::StatusOr<BenchResult> RunCompute124mBench(const BenchOptions& options);
}
