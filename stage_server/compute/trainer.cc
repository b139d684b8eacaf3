#include "stage_server/compute/trainer.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "stage_server/compute/cuda_backend.h"

namespace pipetrain::compute {

absl::StatusOr<double> LossAndGrads(ModelChunk& model, const model::TokenBatch& batch,
                                    int micro_batches) {
  if (!model.has_embedding() || !model.has_head()) {
    return absl::InvalidArgumentError("LossAndGrads needs a chunk holding the whole model");
  }
  if (micro_batches < 1 || batch.rows % micro_batches != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro_batches (", micro_batches, ") must divide the batch (", batch.rows, ")"));
  }
  BackendT<float>* be = model.backend();
  const int rows = batch.rows / micro_batches;
  const int64_t tokens = int64_t{rows} * model.config().seq_len;
  const size_t bytes = BytesOf<int32_t>(tokens);
  ASSIGN_OR_RETURN(auto inputs, BackendBuffer<float>::Elements<int32_t>(be, tokens));
  ASSIGN_OR_RETURN(auto targets, BackendBuffer<float>::Elements<int32_t>(be, tokens));
  ASSIGN_OR_RETURN(auto loss, BackendBuffer<float>::Elements(be, 1));
  double total = 0;
  for (int mb = 0; mb < micro_batches; ++mb) {
    RETURN_IF_ERROR(
        be->CopyFromHost(inputs.raw(), batch.inputs.data() + mb * tokens, bytes));
    RETURN_IF_ERROR(
        be->CopyFromHost(targets.raw(), batch.targets.data() + mb * tokens, bytes));
    RETURN_IF_ERROR(model.Forward(mb, rows, inputs.raw(), targets.ints(), loss.data()));
    float value = 0;
    RETURN_IF_ERROR(be->CopyToHost(&value, loss.data(), loss.bytes()));
    total += value;
    RETURN_IF_ERROR(model.Backward(mb, nullptr, nullptr, 1.0f / micro_batches));
  }
  return total / micro_batches;
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainOptions& options,
                                                         std::string text) {
  RETURN_IF_ERROR(model::ValidateConfig(options.model));
  if (options.batch < 1 || options.micro_batches < 1 ||
      options.batch % options.micro_batches != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch (", options.batch, ") must be a positive multiple of micro_batches (",
        options.micro_batches, ")"));
  }
  RETURN_IF_ERROR(model::CheckTextLength(text, int64_t{options.model.seq_len} + 1));
  std::unique_ptr<Trainer> t(new Trainer(options, std::move(text)));
  if (options.cuda_device >= 0) {
    ASSIGN_OR_RETURN(t->backend_,
                     CreateCudaBackend(options.cuda_device, {.tf32 = options.tf32}));
  } else {
    ASSIGN_OR_RETURN(t->backend_, CpuBackend::Create(options.threads, options.products));
  }
  RETURN_IF_ERROR(t->backend_->SetProductOperands(options.precision.products));
  ASSIGN_OR_RETURN(t->model_,
                   ModelChunk::Create(options.model, 0, options.model.num_pipeline_layers(),
                                      t->backend_.get(),
                                      {.recompute = options.recompute,
                                       .boundary = options.precision.activations}));
  RETURN_IF_ERROR(t->model_->Initialize(options.seed));
  return t;
}

absl::StatusOr<StepStats> Trainer::Step() {
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(model::TokenBatch batch,
                   model::SampleBatch(text_, options_.model, options_.batch, options_.seed, step_));
  RETURN_IF_ERROR(model_->ZeroGrads());
  StepStats stats;
  ASSIGN_OR_RETURN(stats.loss, LossAndGrads(*model_, batch, options_.micro_batches));
  RETURN_IF_ERROR(model_->SumTiedGradients());
  ASSIGN_OR_RETURN(stats.grad_norm, model_->OptimizerStep(options_.optimizer));
  RETURN_IF_ERROR(backend_->Synchronize());  // a device's step ends when its work does
  stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stats.step = ++step_;
  stats.tokens_per_second =
      static_cast<double>(options_.batch) * options_.model.seq_len / stats.seconds;
  return stats;
}

absl::StatusOr<std::vector<StepStats>> TrainLocal(
    const TrainOptions& options, std::string text,
    const std::function<void(const StepStats&)>& on_step) {
  ASSIGN_OR_RETURN(auto trainer, Trainer::Create(options, std::move(text)));
  std::vector<StepStats> all;
  for (int i = 0; i < options.steps; ++i) {
    ASSIGN_OR_RETURN(StepStats stats, trainer->Step());
    if (on_step) on_step(stats);
    all.push_back(stats);
  }
  return all;
}

}  // namespace pipetrain::compute
