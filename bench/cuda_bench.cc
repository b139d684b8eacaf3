// CUDA build of `pipetrain-bench cuda` (cuda_bench.h). Times with CUDA events on the
// backend's stream after a warm-up, median of the repetitions; FLOPs of the block are
// the model's analytic count (CostOfLayer), so the causal half of attention that the
// backend computes and throws away does not count as work. Host copies are timed by
// the wall clock, as their callers wait for them.
#include "bench/cuda_bench.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_probe.h"
#include "common/model/transformer_config.h"
#include "common/model/init.h"
#include "common/status_macros.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/gpt_layers.h"

namespace pipetrain::bench {
namespace {

using compute::BackendBuffer;
using compute::CudaBackend;

absl::Status EventStatus(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda bench: ", what, ": ", cudaGetErrorName(e),
                                          " (", cudaGetErrorString(e), ")"));
}

// Two CUDA events, destroyed with the object.
struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  ~EventPair() {
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  }
};

// Median seconds of `fn` over `reps` runs after `warmup` untimed ones.
absl::StatusOr<double> MedianSeconds(CudaBackend& be, int warmup, int reps,
                                     const std::function<absl::Status()>& fn) {
  EventPair ev;
  RETURN_IF_ERROR(EventStatus(cudaEventCreate(&ev.start), "cudaEventCreate"));
  RETURN_IF_ERROR(EventStatus(cudaEventCreate(&ev.stop), "cudaEventCreate"));
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(fn());
  RETURN_IF_ERROR(be.Synchronize());
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    RETURN_IF_ERROR(EventStatus(cudaEventRecord(ev.start, be.stream()), "cudaEventRecord"));
    RETURN_IF_ERROR(fn());
    RETURN_IF_ERROR(EventStatus(cudaEventRecord(ev.stop, be.stream()), "cudaEventRecord"));
    RETURN_IF_ERROR(EventStatus(cudaEventSynchronize(ev.stop), "cudaEventSynchronize"));
    float ms = 0;
    RETURN_IF_ERROR(
        EventStatus(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cudaEventElapsedTime"));
    samples.push_back(ms / 1e3);
  }
  RETURN_IF_ERROR(be.Synchronize());
  return Median(samples);
}

// A device buffer of n floats of N(0, scale^2) (never zeros: they run faster and hide
// indexing errors).
absl::StatusOr<BackendBuffer<float>> RandomBuffer(compute::Backend* be, int64_t n,
                                                  uint64_t stream, double scale) {
  std::vector<float> host(n);
  const uint64_t key = model::InitStreamKey(99, 5000, static_cast<int>(stream));
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(scale * model::NormalAt(key, i));
  ASSIGN_OR_RETURN(auto buf, BackendBuffer<float>::Elements(be, n));
  RETURN_IF_ERROR(be->CopyFromHost(buf.raw(), host.data(), buf.bytes()));
  return buf;
}

// Median wall seconds of `fn` followed by a device synchronize, over `reps` runs after
// `warmup` untimed ones: what a caller of a host copy waits, DMA included.
absl::StatusOr<double> MedianWallSeconds(int warmup, int reps,
                                         const std::function<absl::Status()>& fn) {
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(fn());
  RETURN_IF_ERROR(EventStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  std::vector<double> samples;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(fn());
    RETURN_IF_ERROR(EventStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
    samples.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return Median(samples);
}

// Host copies of a 64 MiB pageable buffer (a big activation as it arrives from or goes
// to the network): the backend's staged copies against one plain pageable cudaMemcpy,
// measured in the same run; *_staged_vs_pageable > 1 means staging is faster.
absl::Status AddHostCopyFigures(int warmup, int reps, BenchResult& result) {
  constexpr size_t kBytes = size_t{64} << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> be, CudaBackend::Create(0, {}));
  std::vector<float> host(kBytes / compute::BytesOf<float>(1));
  const uint64_t key = model::InitStreamKey(99, 5001, 0);
  for (size_t i = 0; i < host.size(); ++i) {
    host[i] = static_cast<float>(model::NormalAt(key, i));
  }
  ASSIGN_OR_RETURN(auto dev, BackendBuffer<float>::Allocate(be.get(), kBytes));
  result.Label("host copies", "64 MiB pageable, staged through pinned slots vs cudaMemcpy");
  const auto gbps = [&](double seconds) { return kBytes / seconds / 1e9; };
  ASSIGN_OR_RETURN(double h2d_staged, MedianWallSeconds(warmup, reps, [&] {
                     return be->CopyFromHost(dev.raw(), host.data(), kBytes);
                   }));
  // One plain cudaMemcpy of the whole buffer: the driver stages pageable memory itself.
  const auto plain = [&](void* to, const void* from, cudaMemcpyKind kind) {
    return [=]() { return EventStatus(cudaMemcpy(to, from, kBytes, kind), "cudaMemcpy"); };
  };
  ASSIGN_OR_RETURN(double h2d_plain, MedianWallSeconds(warmup, reps,
                                                       plain(dev.raw(), host.data(),
                                                             cudaMemcpyHostToDevice)));
  ASSIGN_OR_RETURN(double d2h_staged, MedianWallSeconds(warmup, reps, [&] {
                     return be->CopyToHost(host.data(), dev.raw(), kBytes);
                   }));
  ASSIGN_OR_RETURN(double d2h_plain, MedianWallSeconds(warmup, reps,
                                                       plain(host.data(), dev.raw(),
                                                             cudaMemcpyDeviceToHost)));
  result.Add("h2d_staged_gbps", gbps(h2d_staged));
  result.Add("h2d_pageable_gbps", gbps(h2d_plain));
  result.Add("h2d_staged_vs_pageable", h2d_plain / h2d_staged);
  result.Add("d2h_staged_gbps", gbps(d2h_staged));
  result.Add("d2h_pageable_gbps", gbps(d2h_plain));
  result.Add("d2h_staged_vs_pageable", d2h_plain / d2h_staged);
  return absl::OkStatus();
}

// A 16 MiB activation leaving one stage's device memory for the next's: the device ends
// of the TCP path (the backend's staged copy to pageable host memory, then from it to the
// other buffer, as a send and a receive do around the wire), against a plain cudaMemcpy
// device-to-host plus host-to-device of the same bytes, and against one device-to-device
// copy (what CUDA IPC between two stages of one GPU would do), in the same run.
absl::Status AddActivationFigures(int warmup, int reps, BenchResult& result) {
  constexpr size_t kBytes = size_t{16} << 20;
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> be, CudaBackend::Create(0, {}));
  const int64_t n = static_cast<int64_t>(kBytes / compute::BytesOf<float>(1));
  ASSIGN_OR_RETURN(auto from, RandomBuffer(be.get(), n, 6, 1.0));
  ASSIGN_OR_RETURN(auto to, BackendBuffer<float>::Elements(be.get(), n));
  std::vector<float> host(n);
  const auto gbps = [&](double seconds) { return kBytes / seconds / 1e9; };
  ASSIGN_OR_RETURN(double staged, MedianWallSeconds(warmup, reps, [&]() -> absl::Status {
                     RETURN_IF_ERROR(be->CopyToHost(host.data(), from.raw(), kBytes));
                     return be->CopyFromHost(to.raw(), host.data(), kBytes);
                   }));
  {  // what arrived through the staged path is what left
    std::vector<float> sent(n), got(n);
    RETURN_IF_ERROR(be->CopyToHost(sent.data(), from.raw(), kBytes));
    RETURN_IF_ERROR(be->CopyToHost(got.data(), to.raw(), kBytes));
    if (sent != got) return absl::InternalError("cuda bench: the staged activation changed");
  }
  ASSIGN_OR_RETURN(double plain, MedianWallSeconds(warmup, reps, [&]() -> absl::Status {
                     RETURN_IF_ERROR(EventStatus(
                         cudaMemcpy(host.data(), from.raw(), kBytes, cudaMemcpyDeviceToHost),
                         "cudaMemcpy"));
                     return EventStatus(
                         cudaMemcpy(to.raw(), host.data(), kBytes, cudaMemcpyHostToDevice),
                         "cudaMemcpy");
                   }));
  ASSIGN_OR_RETURN(double d2d, MedianWallSeconds(warmup, reps, [&]() -> absl::Status {
                     return EventStatus(
                         cudaMemcpy(to.raw(), from.raw(), kBytes, cudaMemcpyDeviceToDevice),
                         "cudaMemcpy");
                   }));
  result.Label("activation", "16 MiB device to device: staged D2H + H2D (the TCP path's ends), "
                             "plain cudaMemcpy D2H + H2D, one D2D copy");
  result.Add("activation_staged_gbps", gbps(staged));
  result.Add("activation_plain_d2h_h2d_gbps", gbps(plain));
  result.Add("activation_d2d_gbps", gbps(d2d));
  result.Add("activation_staged_vs_plain", plain / staged);
  result.Add("activation_staged_vs_d2d", d2d / staged);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BenchResult> RunCudaBench(const BenchOptions& options) {
  const common::CudaProbe& probe = common::ProbeCuda();
  if (probe.devices.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no usable GPU: ", probe.reason));
  }
  const int reps = options.repetitions > 0 ? options.repetitions : 20;
  const int warmup = 3;
  // GPT-2 small's block at its full context; B * T = 8192 rows.
  model::TransformerConfig config;
  config.vocab_size = 256;
  config.seq_len = 1024;
  config.d_model = 768;
  config.n_heads = 12;
  config.n_layers = 1;
  const int B = 8, T = config.seq_len, C = config.d_model;
  const int64_t rows = int64_t{B} * T;
  const model::LayerCost cost = model::CostOfLayer(config, /*pipeline_layer=*/1);
  const double block_flops =
      (cost.forward_flops + cost.backward_input_flops + cost.backward_weight_flops) * rows;
  // The MLP's first product, (B*T, C) @ (C, 4C): the block's largest matmul shape.
  const int m = static_cast<int>(rows), n = config.mlp_dim(), k = C;
  const double matmul_flops = 2.0 * m * n * k;

  BenchResult result;
  result.Label("device", probe.devices[0].name);
  result.Label("block", absl::StrCat("d_model ", C, ", heads ", config.n_heads, ", seq ", T,
                                     ", batch ", B, " (forward + backward)"));
  result.Label("matmul", absl::StrCat(m, " x ", n, " x ", k, " (the block's c_fc product)"));
  for (bool tf32 : {false, true}) {
    const std::string mode = tf32 ? "tf32" : "fp32";
    double matmul_tflops = 0;
    ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> be, CudaBackend::Create(0, {.tf32 = tf32}));
    {
      ASSIGN_OR_RETURN(auto a, RandomBuffer(be.get(), int64_t{m} * k, 1, 1.0));
      ASSIGN_OR_RETURN(auto b, RandomBuffer(be.get(), int64_t{k} * n, 2, 1.0));
      ASSIGN_OR_RETURN(auto c, BackendBuffer<float>::Elements(be.get(), int64_t{m} * n));
      ASSIGN_OR_RETURN(double t, MedianSeconds(*be, warmup, reps, [&] {
                         return be->Matmul(false, false, m, n, k, 1.0f, a.data(), b.data(),
                                           0.0f, c.data());
                       }));
      matmul_tflops = matmul_flops / t / 1e12;
      result.Add(mode + "_matmul_tflops", matmul_tflops);
    }
    {
      ASSIGN_OR_RETURN(auto layer, compute::MakeLayer<float>(config, 1, be.get()));
      RETURN_IF_ERROR(layer->Initialize(/*seed=*/7));
      ASSIGN_OR_RETURN(auto x, RandomBuffer(be.get(), rows * C, 3, 1.0));
      ASSIGN_OR_RETURN(auto dout, RandomBuffer(be.get(), rows * C, 4, 1e-3));
      ASSIGN_OR_RETURN(auto out, BackendBuffer<float>::Elements(be.get(), rows * C));
      ASSIGN_OR_RETURN(auto dx, BackendBuffer<float>::Elements(be.get(), rows * C));
      compute::Stash<float> stash;
      ASSIGN_OR_RETURN(double t, MedianSeconds(*be, warmup, reps, [&]() -> absl::Status {
                         RETURN_IF_ERROR(layer->Forward(B, x.data(), nullptr, out.data(), stash));
                         return layer->Backward(stash, dout.data(), 1.0f, dx.data());
                       }));
      result.Add(mode + "_block_ms", t * 1e3);
      const double block_tflops = block_flops / t / 1e12;
      result.Add(mode + "_block_tflops", block_tflops);
      // The fraction of the measured matmul rate the whole block achieves.
      result.Add(mode + "_block_vs_matmul", block_tflops / matmul_tflops);
    }
  }
  RETURN_IF_ERROR(AddHostCopyFigures(warmup, reps, result));
  RETURN_IF_ERROR(AddActivationFigures(warmup, reps, result));
  return result;
}

}  // namespace pipetrain::bench
