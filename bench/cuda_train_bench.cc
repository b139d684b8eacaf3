// CUDA build of `pipetrain-bench cuda-train` (cuda_bench.h): whole training steps of a
// GPT-2-small-shaped and a Llama-3.2-1B-shaped model as one stage on GPU 0 (the Trainer
// on the cuda backend), in TF32 and bf16, next to PyTorch eager on the same model in the
// same run, and the device's bf16 product rate measured first (cublasGemmEx on random
// bf16 operands), so that MFU is given against the datasheet peak and the measured rate.
#include <cuda_runtime_api.h>
#include <cublas_v2.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/compute_bench.h"
#include "bench/cuda_bench.h"
#include "common/cuda_probe.h"
#include "common/model/transformer_config.h"
#include "common/model/llama_family.h"
#include "common/status_macros.h"
#include "stage_server/compute/trainer.h"

namespace pipetrain::bench {
namespace {

// H200 SXM dense peaks by the datasheet (the device tool's H200.md): bf16 and TF32 tensor
// products without sparsity.
constexpr double kBf16PeakTflops = 989.0;
constexpr double kTf32PeakTflops = 494.7;

absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda-train bench: ", what, ": ", cudaGetErrorName(e),
                                          " (", cudaGetErrorString(e), ")"));
}

absl::Status Cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuda-train bench: ", what, ": cuBLAS status ",
                                          static_cast<int>(s)));
}

// n bf16 values (as bits) of uniform numbers in [-1.7, 1.7) from a counter hash: never
// zeros, which run faster than real data and hide unwritten outputs.
std::vector<uint16_t> RandomBf16(int64_t n, uint32_t seed) {
  std::vector<uint16_t> out(n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 2246822519u;
    h ^= h >> 13;
    const float x = (static_cast<float>(h & 0xffff) / 65536.0f - 0.5f) * 3.4f;
    uint32_t bits = 0;
    std::memcpy(&bits, &x, sizeof(bits));
    out[i] = static_cast<uint16_t>(bits >> 16);  // truncated: any bf16 value will do
  }
  return out;
}

// TFLOP/s of an n x n x n bf16 product with fp32 accumulation (cublasGemmEx), the median of
// `reps` after 3 warm-ups, timed with CUDA events.
absl::StatusOr<double> Bf16ProductTflops(int n, int reps) {
  const int64_t elems = int64_t{n} * n;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  cublasHandle_t handle = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  auto cleanup = [&] {
    cudaFree(a), cudaFree(b), cudaFree(c);
    if (handle != nullptr) cublasDestroy(handle);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  };
  auto run = [&]() -> absl::StatusOr<double> {
    for (void** p : {&a, &b, &c}) {
      RETURN_IF_ERROR(Cuda(cudaMalloc(p, elems * sizeof(uint16_t)), "cudaMalloc"));
    }
    const size_t bytes = elems * sizeof(uint16_t);
    RETURN_IF_ERROR(Cuda(cudaMemcpy(a, RandomBf16(elems, 1).data(), bytes,
                                    cudaMemcpyHostToDevice), "cudaMemcpy"));
    RETURN_IF_ERROR(Cuda(cudaMemcpy(b, RandomBf16(elems, 2).data(), bytes,
                                    cudaMemcpyHostToDevice), "cudaMemcpy"));
    RETURN_IF_ERROR(Cublas(cublasCreate(&handle), "cublasCreate"));
    RETURN_IF_ERROR(Cuda(cudaEventCreate(&start), "cudaEventCreate"));
    RETURN_IF_ERROR(Cuda(cudaEventCreate(&stop), "cudaEventCreate"));
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&] {
      return Cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a,
                                 CUDA_R_16BF, n, b, CUDA_R_16BF, n, &zero, c, CUDA_R_16BF, n,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    "cublasGemmEx");
    };
    for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(gemm());
    std::vector<double> samples;
    for (int i = 0; i < reps; ++i) {
      RETURN_IF_ERROR(Cuda(cudaEventRecord(start), "cudaEventRecord"));
      RETURN_IF_ERROR(gemm());
      RETURN_IF_ERROR(Cuda(cudaEventRecord(stop), "cudaEventRecord"));
      RETURN_IF_ERROR(Cuda(cudaEventSynchronize(stop), "cudaEventSynchronize"));
      float ms = 0;
      RETURN_IF_ERROR(Cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime"));
      samples.push_back(ms / 1e3);
    }
    return 2.0 * n * n * n / Median(samples) / 1e12;
  };
  absl::StatusOr<double> tflops = run();
  cleanup();
  return tflops;
}

struct TrainModel {
  std::string name;  // figure prefix
  model::TransformerConfig config;
  int batch = 0;
};

// GPT-2 small at its full context, and Llama-3.2-1B's shape (vocab 128256 tied, d_model
// 2048, 32 heads, 8 KV heads, SwiGLU 8192, 16 layers, its rotary base and llama3 scaling).
std::vector<TrainModel> Models() {
  TrainModel gpt{"gpt2_124m",
                 {.vocab_size = 50257, .seq_len = 1024, .d_model = 768, .n_heads = 12,
                  .n_layers = 12, .tie_embeddings = true},
                 8};
  TrainModel llama{"llama_1b",
                   {.vocab_size = 128256, .seq_len = 1024, .d_model = 2048, .n_heads = 32,
                    .n_layers = 16, .tie_embeddings = true, .family = model::kLlamaFamily},
                   4};
  model::TransformerConfig& c = llama.config;
  c.n_kv_heads = 8;
  c.ffn_dim = 8192;
  c.rope_theta = model::kLlamaDefaultRopeTheta;
  c.norm_eps = model::kLlamaDefaultNormEps;
  c.rope_scaling = {.factor = 32, .low_freq_factor = 1, .high_freq_factor = 4,
                    .original_context = 8192};
  return {gpt, llama};
}

// Model FLOPs per token of one training step (forward and both backward halves), the
// analytic count of every pipeline layer (causal attention's half; no recomputation).
double FlopsPerToken(const model::TransformerConfig& c) {
  double flops = 0;
  for (int l = 0; l < c.num_pipeline_layers(); ++l) {
    const model::LayerCost cost = model::CostOfLayer(c, l);
    flops += cost.forward_flops + cost.backward_input_flops + cost.backward_weight_flops;
  }
  return flops;
}

}  // namespace

absl::StatusOr<BenchResult> RunCudaTrainBench(const BenchOptions& options) {
  const common::CudaProbe& probe = common::ProbeCuda();
  if (probe.devices.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("no usable GPU: ", probe.reason));
  }
  const int reps = options.repetitions > 0 ? options.repetitions : 5;
  BenchResult result;
  result.Label("device", probe.devices[0].name);
  result.Label("peaks", absl::StrCat("datasheet dense bf16 ", kBf16PeakTflops, ", TF32 ",
                                     kTf32PeakTflops, " TFLOP/s"));
  ASSIGN_OR_RETURN(const double measured, Bf16ProductTflops(8192, 10));
  result.Add("bf16_product_tflops", measured);
  std::string torch_label = "not run";
  const std::string text = BenchText();
  for (const TrainModel& m : Models()) {
    compute::TrainOptions o;
    o.model = m.config;
    o.batch = m.batch;
    o.cuda_device = 0;
    o.optimizer = {.lr = 3e-4f};
    const double tokens = static_cast<double>(o.batch) * o.model.seq_len;
    const double flops_per_token = FlopsPerToken(o.model);
    result.Label(m.name, absl::StrCat("d_model ", o.model.d_model, ", ", o.model.n_layers,
                                      " layers, vocab ", o.model.vocab_size, ", seq ",
                                      o.model.seq_len, ", batch ", o.batch));
    result.Add(m.name + "_gflop_per_token", flops_per_token / 1e9);
    for (const bool bf16 : {false, true}) {
      const std::string mode = m.name + (bf16 ? "_bf16_" : "_tf32_");
      o.tf32 = !bf16;
      ASSIGN_OR_RETURN(o.precision, model::PrecisionNamed(bf16 ? "bf16" : "fp32"));
      ASSIGN_OR_RETURN(const double step_s, MedianStepSeconds(o, text, reps));
      const double tflops = flops_per_token * tokens / step_s / 1e12;
      result.Add(mode + "step_seconds", step_s);
      result.Add(mode + "tokens_per_s", tokens / step_s);
      result.Add(mode + "model_tflops", tflops);
      result.Add(mode + "mfu", tflops / (bf16 ? kBf16PeakTflops : kTf32PeakTflops));
      if (bf16) result.Add(mode + "mfu_of_measured_bf16", tflops / measured);
      auto torch = RunPyTorch(o, 8, reps, bf16 ? " --device cuda" : " --device cuda --tf32");
      if (!torch.ok()) {
        torch_label = absl::StrCat("failed: ", torch.status().message());
      } else if (torch->contains("error")) {
        torch_label = absl::StrCat("skipped: ", torch->at("error").get<std::string>());
      } else {
        torch_label = absl::StrCat("torch ", torch->at("torch_version").get<std::string>(),
                                   " eager on the GPU (bench/torch_compute_bench.py under ",
                                   PyTorchInterpreter(), ")");
        const double torch_tokens = torch->at("tokens_per_s").get<double>();
        result.Add(mode + "pytorch_tokens_per_s", torch_tokens);
        result.Add(mode + "pytorch_mfu", flops_per_token * torch_tokens / 1e12 /
                                             (bf16 ? kBf16PeakTflops : kTf32PeakTflops));
        result.Add(mode + "ours_over_pytorch", tokens / step_s / torch_tokens);
      }
    }
  }
  result.Label("pytorch", torch_label);
  return result;
}

}  // namespace pipetrain::bench
