// The single-process trainer: the whole model on one CPU backend, trained on a byte-level
// text. It is the reference every pipeline test compares against and the baseline of
// `pipetrain train-local`; `pipetrain eval` uses LossAndGrads on a fixed batch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/batch.h"
#include "common/model/precision.h"
#include "common/model/transformer_config.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/model_chunk.h"

namespace pipetrain::compute {

// Runs forward and backward of `batch` as `micro_batches` equal micro-batches on a
// chunk holding the whole model, accumulating gradients (+=, the caller zeroes them)
// of the mean loss over all rows; returns that mean loss.
absl::StatusOr<double> LossAndGrads(ModelChunk& model, const model::TokenBatch& batch,
                                    int micro_batches = 1);

struct TrainOptions {
  model::TransformerConfig model;
  int steps = 10;
  int batch = 8;          // rows per step
  int micro_batches = 1;  // gradient accumulation; must divide batch
  uint64_t seed = 0;      // initialisation and batch sampling
  OptimizerSettings optimizer;
  int threads = 1;  // the cpu backend's product threads
  bool recompute = false;
  // oneDNN, or the OpenBLAS baseline the compute bench compares it with.
  CpuBackend::ProductEngine products = CpuBackend::ProductEngine::kOneDnn;
  // training.precision's row: the products' operands and the activations' dtype.
  model::Precision precision = model::PrecisionTable().front();
  // >= 0: train on that GPU with the cuda backend (threads and products unused), with
  // TF32 products when `tf32` is set; -1: the cpu backend.
  int cuda_device = -1;
  bool tf32 = false;
};

struct StepStats {
  int step = 0;  // from 1
  double loss = 0;
  double seconds = 0;
  double tokens_per_second = 0;
  double grad_norm = 0;  // before clipping; 0 when clipping is off
};

class Trainer {
 public:
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainOptions& options,
                                                         std::string text);
  // One optimizer step on a fresh batch.
  absl::StatusOr<StepStats> Step();
  ModelChunk& model() { return *model_; }
  const TrainOptions& options() const { return options_; }

 private:
  Trainer(TrainOptions options, std::string text)
      : options_(std::move(options)), text_(std::move(text)) {}

  TrainOptions options_;
  std::string text_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<ModelChunk> model_;
  int step_ = 0;
};

// Trains for options.steps steps, calling on_step (if set) after each; returns every
// step's figures: the reference run the tests compare with. `pipetrain train-local`
// drives a Trainer itself, step by step, to print progress and save the weights.
absl::StatusOr<std::vector<StepStats>> TrainLocal(
    const TrainOptions& options, std::string text,
    const std::function<void(const StepStats&)>& on_step = nullptr);

}  // namespace pipetrain::compute
