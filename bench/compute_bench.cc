#include "bench/compute_bench.h"

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/json_command.h"
#include "common/model/llama_family.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/trainer.h"

namespace pipetrain::bench {
namespace {

using model::TransformerConfig;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Median GFLOP/s of the model's largest product (the MLP's input projection of one step:
// (B*T, C) x (C, n), LargestProductColumns) on one product engine at `threads` threads,
// with `operands`.
absl::StatusOr<double> ProductGflops(compute::CpuBackend::ProductEngine engine, int threads,
                                     common::DType operands, int m, int n, int k, int reps) {
  ASSIGN_OR_RETURN(std::unique_ptr<compute::Products> products,
                   compute::CpuBackend::MakeProducts(engine, threads));
  std::vector<float> a(int64_t{m} * k, 0.5f), b(int64_t{k} * n, 0.25f), c(int64_t{m} * n);
  const compute::ProductShape p = compute::ProductShape::RowMajor(false, false, m, n, k, k, n, n,
                                                                  1.0f, 0.0f);
  std::vector<double> times;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = Clock::now();
    RETURN_IF_ERROR(products->Run(operands, p, a.data(), b.data(), c.data()));
    if (r > 0) times.push_back(Seconds(t0, Clock::now()));  // the first call warms up
  }
  return 2.0 * m * n * k / Median(times) / 1e9;
}

// "fp32" or "bf16", as training.precision spells it.
std::string PrecisionName(const model::Precision& p) { return std::string(p.name); }

// The interpreter that runs the PyTorch side: Debian's, which sees python3-torch
// (PIPETRAIN_PYTHON overrides it).
std::string PythonPath() {
  const char* env = std::getenv("PIPETRAIN_PYTHON");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/python3";
}

// The folder of torch_compute_bench.py: the source tree's bench/ (PIPETRAIN_BENCH_DIR in
// the environment overrides it, where the binary runs away from its source tree).
std::string BenchDir() {
  const char* env = std::getenv("PIPETRAIN_BENCH_DIR");
  return env != nullptr && *env != '\0' ? env : PIPETRAIN_BENCH_DIR;
}

// The PyTorch script's flags for a Llama model's own fields; none for GPT-2's.
std::string TorchLlamaFlags(const TransformerConfig& c) {
  if (c.family != model::kLlamaFamily) return "";
  const model::RopeScaling& r = c.rope_scaling;
  return absl::StrFormat(
      " --model llama --kv-heads %d --ffn-dim %d --rope-theta %g --norm-eps %g "
      "--rope-scaling %g,%g,%g,%d%s",
      c.n_kv_heads, c.ffn_dim, c.rope_theta, c.norm_eps, r.factor, r.low_freq_factor,
      r.high_freq_factor, r.original_context, c.tie_embeddings ? " --tie-embeddings" : "");
}

}  // namespace

// Bytes of a pseudo-random English-like text; the throughput does not depend on it.
std::string BenchText() {
  const char* words[] = {"pipeline ", "stage ", "gradient ", "the ",
                         "of ",       "a ",     "micro ",    "batch. ",
                         "model ",    "and ",   "weights ",  "loss "};
  std::string text;
  uint32_t state = 1;
  while (text.size() < (1 << 20)) {
    state = state * 1664525u + 1013904223u;
    text += words[(state >> 16) % 12];
  }
  return text;
}

// Median seconds of `reps` training steps after one warm-up step (first touch of every
// buffer, the primitives made).
absl::StatusOr<double> MedianStepSeconds(const compute::TrainOptions& o, const std::string& text,
                                   int reps) {
  ASSIGN_OR_RETURN(auto trainer, compute::Trainer::Create(o, text));
  RETURN_IF_ERROR(trainer->Step().status());
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    ASSIGN_OR_RETURN(compute::StepStats s, trainer->Step());
    times.push_back(s.seconds);
  }
  return Median(times);
}

std::string PyTorchInterpreter() { return PythonPath(); }

absl::StatusOr<nlohmann::json> RunPyTorch(const compute::TrainOptions& o, int threads,
                                          int steps, const std::string& extra_flags) {
  const std::string command = absl::StrFormat(
      "'%s' '%s/torch_compute_bench.py' --threads %d --steps %d --vocab %d --seq %d "
      "--d-model %d --heads %d --layers %d --batch %d --precision %s%s%s 2>&1",
      PythonPath(), BenchDir(), threads, steps, o.model.vocab_size, o.model.seq_len,
      o.model.d_model, o.model.n_heads, o.model.n_layers, o.batch, PrecisionName(o.precision),
      TorchLlamaFlags(o.model), extra_flags);
  return RunJsonCommand(command);
}

namespace {

// What --model trains: the bench's small GPT-2 (as it always was) or a stack
// with Llama-3.2-1B's proportions at the same width, depth, length and vocabulary:
// heads of 64, 4 query heads a key/value head (32 / 8), ffn_dim 4 x d_model
// (8192 / 2048), its rotary base and llama3 scaling, RMSNorm's epsilon, tied embeddings.
struct ComputeModel {
  TransformerConfig config;
  std::string label;
};

ComputeModel Gpt2Model() {
  return {TransformerConfig{
              .vocab_size = 256, .seq_len = 128, .d_model = 256, .n_heads = 4, .n_layers = 8},
          "vocab 256, seq 128, d_model 256, 4 heads, 8 layers; batch 32"};
}

ComputeModel LlamaModel() {
  TransformerConfig c{.vocab_size = 256,
                      .seq_len = 128,
                      .d_model = 256,
                      .n_heads = 4,
                      .n_layers = 8,
                      .tie_embeddings = true,
                      .family = model::kLlamaFamily};
  c.n_kv_heads = 1;
  c.ffn_dim = 4 * c.d_model;
  c.rope_theta = model::kLlamaDefaultRopeTheta;
  c.norm_eps = model::kLlamaDefaultNormEps;
  c.rope_scaling = {.factor = 32, .low_freq_factor = 1, .high_freq_factor = 4,
                    .original_context = 8192};
  return {c,
          "Llama-3.2-1B shape scaled down: vocab 256 tied, seq 128, d_model 256, 4 heads of "
          "64, 1 KV head (4 query heads a KV head, as 32/8), SwiGLU ffn_dim 1024 (4 x d_model, "
          "as 8192/2048), rope_theta 500000 with llama3 scaling (32, 1, 4, 8192), RMSNorm eps "
          "1e-5, 8 layers; batch 32 (Llama-3.2-1B: vocab 128256, d_model 2048, 32 heads, "
          "8 KV heads, 16 layers)"};
}

// Columns of the model's largest product, (B*T, C) x (C, n): GPT-2's MLP up-projection
// (4C), Llama's gate and up projections, adjacent in memory and multiplied as one (2F).
int LargestProductColumns(const TransformerConfig& c) {
  return c.family == model::kLlamaFamily ? 2 * c.mlp_dim() : c.mlp_dim();
}

}  // namespace

absl::Status CheckComputeModel(const std::string& name) {
  if (name == "gpt2" || name == model::kLlamaFamily) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model '", name, "'; accepted: gpt2, llama"));
}

absl::StatusOr<BenchResult> RunComputeBench(const BenchOptions& options) {
  const int reps = options.repetitions > 0 ? options.repetitions : 3;
  RETURN_IF_ERROR(CheckComputeModel(options.model));
  const ComputeModel trained = options.model == "gpt2" ? Gpt2Model() : LlamaModel();
  compute::TrainOptions o;
  o.model = trained.config;
  o.batch = 32;
  o.optimizer = {.lr = 3e-4f};
  const double tokens = static_cast<double>(o.batch) * o.model.seq_len;
  double flops_per_token = 0;
  for (int l = 0; l < o.model.num_pipeline_layers(); ++l) {
    const model::LayerCost cost = model::CostOfLayer(o.model, l);
    flops_per_token +=
        cost.forward_flops + cost.backward_input_flops + cost.backward_weight_flops;
  }
  BenchResult result;
  result.Label("model", trained.label);
  result.Label("precision", PrecisionName(options.precision));
  result.Add("gflop_per_step", flops_per_token * tokens / 1e9);
  const std::string text = BenchText();
  std::string pytorch_label;
  using Engine = compute::CpuBackend::ProductEngine;
  const int m = o.batch * o.model.seq_len, n = LargestProductColumns(o.model);
  const int k = o.model.d_model;
  for (int threads : {1, 2}) {
    o.threads = threads;
    // The fp32 OpenBLAS path first (the baseline), then oneDNN in fp32 and, with
    // --precision bf16, in bf16, in the same run.
    o.products = Engine::kOpenBlas;
    o.precision = model::PrecisionTable().front();
    ASSIGN_OR_RETURN(const double openblas_s, MedianStepSeconds(o, text, reps));
    o.products = Engine::kOneDnn;
    ASSIGN_OR_RETURN(const double fp32_s, MedianStepSeconds(o, text, reps));
    o.precision = options.precision;
    double step_s = fp32_s;
    if (options.precision.products != common::DType::kF32) {
      ASSIGN_OR_RETURN(step_s, MedianStepSeconds(o, text, reps));
    }
    const double gflops = flops_per_token * tokens / step_s / 1e9;
    ASSIGN_OR_RETURN(const double product,
                     ProductGflops(Engine::kOneDnn, threads, o.precision.products, m, n, k, reps));
    ASSIGN_OR_RETURN(const double sgemm, ProductGflops(Engine::kOpenBlas, threads,
                                                       common::DType::kF32, m, n, k, reps));
    const std::string t = absl::StrCat("threads", threads, "_");
    result.Add(t + "step_seconds", step_s);
    result.Add(t + "tokens_per_s", tokens / step_s);
    result.Add(t + "achieved_gflop_per_s", gflops);
    result.Add(t + "product_gflop_per_s", product);
    result.Add(t + "fraction_of_product", gflops / product);
    result.Add(t + "openblas_step_seconds", openblas_s);
    result.Add(t + "openblas_tokens_per_s", tokens / openblas_s);
    result.Add(t + "openblas_sgemm_gflop_per_s", sgemm);
    result.Add(t + "speedup_over_openblas", openblas_s / step_s);
    if (options.precision.products != common::DType::kF32) {
      result.Add(t + "onednn_fp32_step_seconds", fp32_s);
      result.Add(t + "speedup_over_onednn_fp32", fp32_s / step_s);
    }
    // PyTorch on the same model and thread count, right after ours.
    auto torch = RunPyTorch(o, threads, reps);
    if (!torch.ok()) {
      pytorch_label = absl::StrCat("failed: ", torch.status().message());
    } else if (torch->contains("error")) {
      pytorch_label = absl::StrCat("skipped: ", torch->at("error").get<std::string>());
    } else {
      const double torch_tokens = torch->at("tokens_per_s").get<double>();
      pytorch_label = absl::StrCat("torch ", torch->at("torch_version").get<std::string>(),
                                   " on the CPU in ", PrecisionName(o.precision), ", ",
                                   torch->at("attention").get<std::string>(),
                                   " attention (bench/torch_compute_bench.py under ",
                                   PythonPath(), ")");
      result.Add(t + "pytorch_step_seconds", torch->at("step_seconds").get<double>());
      result.Add(t + "pytorch_tokens_per_s", torch_tokens);
      result.Add(t + "ours_over_pytorch", tokens / step_s / torch_tokens);
    }
  }
  result.Label("pytorch", pytorch_label);
  return result;
}

absl::StatusOr<BenchResult> RunCompute124mBench(const BenchOptions& options) {
  const int reps = options.repetitions > 0 ? options.repetitions : 2;
  compute::TrainOptions o;
  o.model = TransformerConfig{.vocab_size = 50257, .seq_len = 64, .d_model = 768, .n_heads = 12,
                              .n_layers = 12, .tie_embeddings = true};
  o.batch = 4;
  o.threads = 2;
  o.optimizer = {.lr = 3e-4f};
  const double tokens = static_cast<double>(o.batch) * o.model.seq_len;
  BenchResult result;
  result.Label("model", "GPT-2 124M shape: vocab 50257 tied, d_model 768, 12 heads, 12 layers; "
                        "batch 4 x 64 tokens; 2 threads");
  using Engine = compute::CpuBackend::ProductEngine;
  const std::string text = BenchText();
  o.products = Engine::kOpenBlas;
  ASSIGN_OR_RETURN(const double openblas_s, MedianStepSeconds(o, text, reps));
  o.products = Engine::kOneDnn;
  ASSIGN_OR_RETURN(const double fp32_s, MedianStepSeconds(o, text, reps));
  ASSIGN_OR_RETURN(o.precision, model::PrecisionNamed("bf16"));
  ASSIGN_OR_RETURN(const double bf16_s, MedianStepSeconds(o, text, reps));
  result.Add("openblas_fp32_tokens_per_s", tokens / openblas_s);
  result.Add("onednn_fp32_tokens_per_s", tokens / fp32_s);
  result.Add("onednn_bf16_tokens_per_s", tokens / bf16_s);
  result.Add("fp32_speedup_over_openblas", openblas_s / fp32_s);
  result.Add("bf16_speedup_over_openblas", openblas_s / bf16_s);
  return result;
}

}  // namespace pipetrain::bench
