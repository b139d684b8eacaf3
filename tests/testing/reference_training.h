// The single-stage reference every pipeline test compares against: a tiny GPT, its
// deterministic random batches, and the whole model trained on one model chunk with
// the same AdamW settings the pipelines use.
#pragma once

#include <memory>
#include <vector>

#include "common/tensor.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/optimizer_settings.h"
#include "stage_server/compute/trainer.h"

namespace pipetrain::testing {

inline constexpr int kBatch = 8, kMicroBatches = 4;
inline constexpr uint64_t kSeed = 17;

// 8 pipeline layers; `tied` sets model.tie_embeddings; `llama`: the Llama family, with
// two query heads sharing one key/value head.
model::TransformerConfig TinyModel(bool tied = false, bool llama = false);
compute::OptimizerSettings TestAdam();
model::TokenBatch RandomBatch(int step);  // kBatch rows of random tokens
// Rows [mb * rows, (mb + 1) * rows) of a (kBatch, T) token array as a (rows, T) tensor.
common::Tensor Rows(const std::vector<int32_t>& all, int mb, int rows);

struct Reference {
  std::unique_ptr<compute::CpuBackend> backend;
  std::unique_ptr<compute::ModelChunk> model;
  std::vector<double> losses;      // per step
  std::vector<double> grad_norms;  // per step, before clipping (0 when clipping is off)
};
// Trained once per process for `steps` steps, kMicroBatches micro-batches each, with
// the gradients clipped to the global norm `clip` when it is > 0, on TinyModel(tied, llama),
// with the products' operands in `products` (Backend::SetProductOperands) and the
// activations of training.precision's row with those products.
const Reference& SharedReference(int steps, float clip = 0, bool tied = false,
                                 common::DType products = common::DType::kF32,
                                 bool llama = false);
// Per micro-batch losses of SharedReference(steps)'s model on `batch` (kMicroBatches
// micro-batches), through the training forward, then dropped: what a pipeline's
// evaluation after `steps` training steps must report. Changes no weight or gradient.
std::vector<double> ReferenceEvalLosses(int steps, const model::TokenBatch& batch, float clip = 0,
                                        bool tied = false,
                                        common::DType products = common::DType::kF32,
                                        bool llama = false);

}  // namespace pipetrain::testing
