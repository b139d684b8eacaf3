// `pipetrain-bench cuda`: forward + backward of one GPT block on the cuda backend against
// a cuBLAS product of the block's MLP shape timed in the same run, in fp32 and TF32.
// Without a GPU (or without CUDA in the build) it fails with a message that says so.
#pragma once

#include "bench/benchmark.h"

namespace pipetrain::bench {
absl::StatusOr<BenchResult> RunCudaBench(const BenchOptions& options);
// `pipetrain-bench cuda-train` (cuda_train_bench.cc): whole training steps of a
// GPT-2-small-shaped and a Llama-3.2-1B-shaped model as one stage on GPU 0 in TF32 and
// bf16: tokens/s and MFU (over the datasheet peak and over the bf16 product rate measured
// in the same run), next to PyTorch eager on the GPU (bench/torch_compute_bench.py).
absl::StatusOr<BenchResult> RunCudaTrainBench(const BenchOptions& options);
// `pipetrain-bench cuda-ipc` (cuda_ipc_bench.cc): a 16 MiB activation between two
// processes on GPU 0 through a CUDA IPC ring (stage_server/link/shm/cuda_ipc_region.h), against
// device -> pinned host -> device and one device-to-device copy in the same run.
absl::StatusOr<BenchResult> RunCudaIpcBench(const BenchOptions& options);
// Its receiving process (pipetrain-bench --cuda-ipc-worker HANDLE REPS).
int RunCudaIpcWorker(int argc, char** argv);
}
