// `pipetrain-bench compute`: training throughput of the CPU backend on a small
// config (d_model 256, 8 layers, 4 heads, seq 128, batch 32) at 1 and 2 threads, with
// the achieved GFLOP/s beside the sgemm GFLOP/s measured in the same run, and the same
// model trained by PyTorch on the CPU right after (bench/torch_compute_bench.py under
// /usr/bin/python3; labelled skipped where torch is not importable). With --model llama
// (BenchOptions::model) the model is a stack with Llama-3.2-1B's proportions at the same
// size instead (see its label).
#pragma once

#include <string>

#include "bench/benchmark.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/trainer.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunComputeBench(const BenchOptions& options);
// Refuses a --model that `compute` does not train, naming the accepted values.
absl::Status CheckComputeModel(const std::string& name);
// `pipetrain-bench compute-124m`: a GPT-2-124M-shaped model (tied, vocab 50257) at
// batch 4 x 64 tokens on 2 threads, llm.c's CPU trainer's shape: tokens/s of the
// OpenBLAS fp32 step, oneDNN fp32 and oneDNN bf16, in the same run.
absl::StatusOr<BenchResult> RunCompute124mBench(const BenchOptions& options);

// Trains `o`'s model (its batch and precision) with PyTorch (bench/torch_compute_bench.py,
// PIPETRAIN_BENCH_DIR overriding the folder) at `threads` threads for one warm-up and
// `steps` timed steps, `extra_flags` appended (" --device cuda --tf32"). Returns the
// script's JSON object, which has "error" instead of figures when torch is not importable.
absl::StatusOr<nlohmann::json> RunPyTorch(const compute::TrainOptions& o, int threads,
                                          int steps, const std::string& extra_flags = "");
// About 1 MiB of pseudo-random English-like text to train on (throughput does not
// depend on it).
std::string BenchText();
// Median seconds of `reps` training steps of `o` on `text` after one warm-up step.
absl::StatusOr<double> MedianStepSeconds(const compute::TrainOptions& o, const std::string& text,
                                         int reps);
// The interpreter RunPyTorch uses (PIPETRAIN_PYTHON, or /usr/bin/python3).
std::string PyTorchInterpreter();
}
