#include "tests/testing/reference_training.h"

#include <map>
#include <random>
#include <tuple>
#include <utility>

#include "common/model/precision.h"
#include "gtest/gtest.h"

namespace pipetrain::testing {

model::TransformerConfig TinyModel(bool tied, bool llama) {
  model::TransformerConfig c{64, 8, 16, 2, 6};
  c.tie_embeddings = tied;
  if (llama) {
    c.family = "llama";
    c.n_kv_heads = 1;
    c.ffn_dim = 40;
    c.rope_theta = 10000;
    c.norm_eps = 1e-5;
  }
  return c;
}

compute::OptimizerSettings TestAdam() {
  compute::OptimizerSettings o;
  o.lr = 1e-2f;
  o.beta1 = 0.9f;
  o.beta2 = 0.95f;
  o.eps = 1e-8f;
  o.weight_decay = 0.1f;
  return o;
}

model::TokenBatch RandomBatch(int step) {
  std::mt19937 rng(1000 + step);
  model::TokenBatch b;
  b.rows = kBatch;
  for (int i = 0; i < kBatch * TinyModel().seq_len; ++i) {
    b.inputs.push_back(rng() % TinyModel().vocab_size);
    b.targets.push_back(rng() % TinyModel().vocab_size);
  }
  return b;
}

common::Tensor Rows(const std::vector<int32_t>& all, int mb, int rows) {
  return model::MicroBatchRows(all, mb, rows, TinyModel().seq_len);
}

namespace {

Reference Train(int steps, float clip, bool tied, common::DType products, bool llama) {
  Reference r;
  r.backend = *compute::CpuBackend::Create(1);
  EXPECT_TRUE(r.backend->SetProductOperands(products).ok());
  // training.precision's row with these products: bf16's holds activations in bf16.
  compute::ChunkOptions options;
  for (const model::Precision& p : model::PrecisionTable()) {
    if (p.products == products) options.boundary = p.activations;
  }
  r.model = *compute::ModelChunk::Create(TinyModel(tied, llama), 0, TinyModel().num_pipeline_layers(),
                                         r.backend.get(), options);
  EXPECT_TRUE(r.model->Initialize(kSeed).ok());
  compute::OptimizerSettings adam = TestAdam();
  adam.grad_clip_norm = clip;
  // Each step is compute::Trainer::Step's (zero, LossAndGrads, OptimizerStep by the
  // chunk's own norm), so the clipped cases also hold the trainer to one stage.
  for (int step = 0; step < steps; ++step) {
    EXPECT_TRUE(r.model->ZeroGrads().ok());
    auto loss = compute::LossAndGrads(*r.model, RandomBatch(step), kMicroBatches);
    EXPECT_TRUE(loss.ok()) << loss.status();
    r.losses.push_back(*loss);
    EXPECT_TRUE(r.model->SumTiedGradients().ok());  // a no-op unless tied
    auto norm = r.model->OptimizerStep(adam);
    EXPECT_TRUE(norm.ok()) << norm.status();
    r.grad_norms.push_back(norm.value_or(0));
  }
  return r;
}

}  // namespace

const Reference& SharedReference(int steps, float clip, bool tied, common::DType products,
                                 bool llama) {
  static auto* by_run =
      new std::map<std::tuple<int, float, bool, common::DType, bool>, Reference>();
  const auto key = std::make_tuple(steps, clip, tied, products, llama);
  auto it = by_run->find(key);
  if (it == by_run->end()) {
    it = by_run->emplace(key, Train(steps, clip, tied, products, llama)).first;
  }
  return it->second;
}

std::vector<double> ReferenceEvalLosses(int steps, const model::TokenBatch& batch, float clip,
                                        bool tied, common::DType products, bool llama) {
  compute::ModelChunk& model = *SharedReference(steps, clip, tied, products, llama).model;
  const int rows = batch.rows / kMicroBatches, T = TinyModel().seq_len;
  std::vector<double> losses;
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    float loss = 0;
    absl::Status s = model.Forward(mb, rows, batch.inputs.data() + mb * rows * T,
                                   batch.targets.data() + mb * rows * T, &loss);
    EXPECT_TRUE(s.ok()) << s;
    losses.push_back(loss);
  }
  model.Abandon();
  return losses;
}

}  // namespace pipetrain::testing
