#include <algorithm>

#include "bench/allreduce_bench.h"
#include "bench/autoplan_bench.h"
#include "bench/benchmark.h"
#include "bench/codec_bench.h"
#include "bench/executor_bench.h"
#include "bench/link_bench.h"
#include "bench/scaling_bench.h"
#include "bench/model_size_bench.h"
#include "bench/recovery_bench.h"
#include "bench/compute_bench.h"
#include "bench/coordinator_load_bench.h"
#include "bench/cuda_bench.h"
#include "bench/tokenize_bench.h"

namespace pipetrain::bench {

const std::vector<Benchmark>& AllBenchmarks() {
  static const std::vector<Benchmark> all = {
      {"codec",
       "tensor codec: encode + reassemble a 64 MiB tensor vs one memcpy (ratio, lower is "
       "better, 1.0 = memcpy speed)",
       RunCodecBench},
      {"executor",
       "executor overhead: 4 emulated stages over real links, 1F1B step time vs the "
       "planner's simulated step (ratio, lower is better, 1.0 = no overhead)",
       RunExecutorBench},
      {"link",
       "peer link: 16 MiB activations stage to stage over gRPC on loopback vs raw TCP "
       "(ratio, higher is better, 1.0 = raw TCP speed); --same-host: also between two stage "
       "processes on the stream and on shared memory, vs one memcpy of the bytes",
       RunLinkBench},
      {"scaling",
       "stages vs speed, EMULATED stages: speedup over K = 1 for K = 1..8, M = 1..32 and 4 "
       "schedules vs the ideal K*M/(M+K-1) and the simulator's bound (1.0 = ideal); "
       "PIPETRAIN_BENCH_SCALING_FLOPS, _ROWS and _TRANSPORT (auto|off) change the emulated "
       "rate, the frames and the stages' --same-host-transport",
       RunScalingBench},
      {"autoplan",
       "pipeline.schedule \"auto\" on 4 EMULATED stages, 2 models x 2 stage memories: the "
       "step of the plan it picks over the best of a measured sample of the same space "
       "(1.0 = the best; aim <= 1.05), the default 1f1b M=K plan's step over it, and its "
       "predicted step over its measured one",
       RunAutoplanBench},
      {"model-size",
       "largest GPT that trains on K = 1, 2, 4, 8 real stages under one --memory-limit, "
       "with and without re-materialization, deeper and wider: params vs K x the K = 1 "
       "maximum, and measured peaks vs the planner's (GPipe's first experiment)",
       RunModelSizeBench},
      {"recovery",
       "fault tolerance on the quickstart's model, 4 real cpu stages and a spare: step time "
       "with in-memory snapshots vs without (ratio, 1.0 = free) and their memory; a stage "
       "and the coordinator SIGKILLed mid-job: losses vs an uninterrupted run, steps done "
       "again, seconds from the kill to the next step",
       RunRecoveryBench},
      {"compute",
       "cpu backend: training tokens/s of d_model 256, 8 layers, seq 128, batch 32 on 1 "
       "and 2 threads with oneDNN products, against the OpenBLAS engine in the same run "
       "(speedup), oneDNN's rate for the model's largest product (fraction) and PyTorch "
       "CPU on the same model (ours/PyTorch); --model llama: Llama-3.2-1B's proportions "
       "(GQA, SwiGLU, rotary, RMSNorm, tied) at the same size",
       RunComputeBench},
      {"compute-124m",
       "cpu backend on a GPT-2-124M-shaped model (vocab 50257 tied) at batch 4 x 64 tokens on "
       "2 threads: tokens/s of the OpenBLAS fp32 step, oneDNN fp32 and oneDNN bf16 (speedups "
       "over OpenBLAS)",
       RunCompute124mBench},
      {"cuda",
       "cuda backend: forward + backward of one GPT block (d_model 768, seq 1024) in fp32 "
       "and TF32, TFLOP/s against a cuBLAS product of its MLP shape in the same run; "
       "64 MiB host copies staged through pinned memory against plain pageable ones",
       RunCudaBench},
      {"cuda-train",
       "cuda backend: training steps of a GPT-2-small-shaped (seq 1024) and a "
       "Llama-3.2-1B-shaped model as one stage on GPU 0 in TF32 and bf16: tokens/s and MFU "
       "(over the datasheet peak and the bf16 product rate measured in the same run), next "
       "to PyTorch eager on the GPU on the same model (ours/PyTorch)",
       RunCudaTrainBench},
      {"cuda-ipc",
       "same-host path between GPUs: a 16 MiB activation from one process's device memory "
       "to another's on GPU 0 through a CUDA IPC ring (copy in, copy out), against "
       "device -> pinned host -> device and one device-to-device copy in the same run",
       RunCudaIpcBench},
      {"allreduce",
       "gloo ring all-reduce of 16 and 64 MiB of floats between 2 and 4 processes on "
       "loopback: bus bandwidth vs raw TCP moving the same bytes in a ring (ratio, higher "
       "is better, 1.0 = raw TCP speed), and a reduce-scatter + all-gather of the same "
       "buffer over the all-reduce's time; then the step time of R = 2 replicas over R = 1 "
       "at equal work per replica (1.0 = free) and the share of the all-reduce hidden "
       "behind the backward",
       RunAllreduceBench},
      {"tokenize",
       "GPT-2 BPE (--tokenizer llama3: Llama 3's): MB/s of text on 1, 2 and 4 threads vs "
       "npm's gpt-3-encoder (llama3-tokenizer-js) under node on the same text (ratio, higher "
       "is better, 1.0 = JavaScript speed)",
       RunTokenizeBench},
      {"coordinator-load",
       "the coordinator under load: its memory over 200 small jobs run one after another "
       "(flat = bounded per finished job), then 50 WatchJob streams, 50 clients polling "
       "GetJob every 100 ms and 20 queued jobs for 20 s, three times (GetJob p50/p99 ms, errors, "
       "memory before and after), then 1000 short-lived connections",
       RunCoordinatorLoadBench},
  };
  return all;
}

double Median(std::vector<double>& samples) {
  if (samples.empty()) return 0;
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

}  // namespace pipetrain::bench
