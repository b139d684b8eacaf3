#include "stage_server/backend_chunk.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/checked_math.h"
#include "common/status_macros.h"

namespace pipetrain::stage_server {

using common::DType;
using common::PiecewiseTensor;
using common::Tensor;
using compute::BackendBuffer;

absl::StatusOr<std::unique_ptr<BackendChunk>> BackendChunk::Create(
    std::unique_ptr<compute::ModelChunk> layers, int rows,
    std::shared_ptr<common::BufferPool> pool) {
  if (rows <= 0) return absl::InvalidArgumentError("micro-batch rows must be > 0");
  auto* backend = layers->backend();
  const model::GptConfig& c = layers->config();
  const size_t act = size_t{4} * rows * c.seq_len * c.d_model;
  const size_t ids = size_t{4} * rows * c.seq_len;
  std::unique_ptr<BackendChunk> s(new BackendChunk(std::move(layers), rows, std::move(pool)));
  const bool emb = s->layers_->has_embedding(), head = s->layers_->has_head();
  ASSIGN_OR_RETURN(s->input_, BackendBuffer<float>::Allocate(backend, emb ? ids : act));
  if (head) {
    ASSIGN_OR_RETURN(s->targets_, BackendBuffer<float>::Allocate(backend, ids));
  }
  ASSIGN_OR_RETURN(s->output_, BackendBuffer<float>::Allocate(backend, head ? 4 : act));
  if (!head) {
    ASSIGN_OR_RETURN(s->grad_output_, BackendBuffer<float>::Allocate(backend, act));
  }
  if (!emb) {
    ASSIGN_OR_RETURN(s->grad_input_, BackendBuffer<float>::Allocate(backend, act));
  }
  return s;
}

uint64_t BackendChunk::BufferBytes(const model::GptConfig& c, int begin, int end, int rows) {
  const auto mul = common::SaturatingMul;
  const auto add = common::SaturatingAdd;
  if (rows <= 0 || c.seq_len <= 0 || c.d_model <= 0) return 0;  // Create refuses these
  const uint64_t ids = mul(mul(4, static_cast<uint64_t>(rows)), static_cast<uint64_t>(c.seq_len));
  const uint64_t act = mul(ids, static_cast<uint64_t>(c.d_model));
  const bool emb = begin == 0, head = end == c.num_pipeline_layers();
  // As Create allocates them: input, targets (head), output, grad_output, grad_input.
  uint64_t total = emb ? ids : act;
  if (head) total = add(total, ids);
  total = add(total, head ? 4 : act);
  if (!head) total = add(total, act);
  if (!emb) total = add(total, act);
  return total;
}

absl::Status BackendChunk::CheckShape(DType got_dtype, const std::vector<int64_t>& got_shape,
                                      DType dtype, std::vector<int64_t> shape,
                                      const char* what) const {
  if (got_dtype == dtype && got_shape == shape) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is ", common::DTypeName(got_dtype), " ", common::ShapeString(got_shape),
                   ", expected ", common::DTypeName(dtype), " ", common::ShapeString(shape)));
}

absl::StatusOr<Tensor> BackendChunk::HostTensor(std::vector<int64_t> shape, const void* src) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  ASSIGN_OR_RETURN(Tensor t, Tensor::FromBuffer(DType::kF32, std::move(shape),
                                                pool_->Acquire(n * sizeof(float))));
  RETURN_IF_ERROR(layers_->backend()->CopyToHost(t.bytes().data(), src, t.num_bytes()));
  return t;
}

absl::Status BackendChunk::StageInputs(const PiecewiseTensor& input, const Tensor* targets) {
  const model::GptConfig& c = layers_->config();
  const int64_t B = rows_, T = c.seq_len, C = c.d_model;
  auto* backend = layers_->backend();
  if (has_embedding()) {
    RETURN_IF_ERROR(CheckShape(input.dtype(), input.shape(), DType::kI32, {B, T}, "tokens"));
  } else {
    RETURN_IF_ERROR(CheckShape(input.dtype(), input.shape(), DType::kF32, {B, T, C}, "activation"));
  }
  RETURN_IF_ERROR(backend->CopyFromHostPieces(input_.raw(), input.pieces()));
  if (has_head()) {
    if (targets == nullptr) return absl::InvalidArgumentError("the head needs targets");
    RETURN_IF_ERROR(CheckShape(targets->dtype(), targets->shape(), DType::kI32, {B, T}, "targets"));
    RETURN_IF_ERROR(
        backend->CopyFromHost(targets_.raw(), targets->bytes().data(), targets->num_bytes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> BackendChunk::OutputTensor() {
  const model::GptConfig& c = layers_->config();
  if (has_head()) return HostTensor({1}, output_.raw());
  return HostTensor({rows_, c.seq_len, c.d_model}, output_.raw());
}

absl::StatusOr<Tensor> BackendChunk::Forward(int mb, const PiecewiseTensor& input,
                                             const Tensor* targets) {
  RETURN_IF_ERROR(StageInputs(input, targets));
  RETURN_IF_ERROR(layers_->Forward(mb, rows_, input_.raw(), has_head() ? targets_.ints() : nullptr,
                                   output_.data()));
  return OutputTensor();
}

absl::StatusOr<Tensor> BackendChunk::Evaluate(const PiecewiseTensor& input, const Tensor* targets) {
  RETURN_IF_ERROR(StageInputs(input, targets));
  RETURN_IF_ERROR(layers_->Evaluate(rows_, input_.raw(), has_head() ? targets_.ints() : nullptr,
                                    output_.data()));
  return OutputTensor();
}

absl::StatusOr<Tensor> BackendChunk::RunBackward(int mb, const PiecewiseTensor* grad_output,
                                                 float loss_grad, bool split) {
  const model::GptConfig& c = layers_->config();
  const int64_t B = rows_, T = c.seq_len, C = c.d_model;
  const float* gout = nullptr;
  if (!has_head()) {
    if (grad_output == nullptr) return absl::InvalidArgumentError("backward needs a gradient");
    RETURN_IF_ERROR(
        CheckShape(grad_output->dtype(), grad_output->shape(), DType::kF32, {B, T, C}, "gradient"));
    RETURN_IF_ERROR(
        layers_->backend()->CopyFromHostPieces(grad_output_.raw(), grad_output->pieces()));
    gout = grad_output_.data();
  }
  float* gin = has_embedding() ? nullptr : grad_input_.data();
  if (split) {
    RETURN_IF_ERROR(layers_->BackwardInput(mb, gout, gin, loss_grad));
  } else {
    RETURN_IF_ERROR(layers_->Backward(mb, gout, gin, loss_grad));
  }
  if (has_embedding()) return Tensor();
  return HostTensor({B, T, C}, grad_input_.raw());
}

absl::StatusOr<Tensor> BackendChunk::Backward(int mb, const PiecewiseTensor* grad_output,
                                              float loss_grad) {
  return RunBackward(mb, grad_output, loss_grad, /*split=*/false);
}

absl::StatusOr<Tensor> BackendChunk::BackwardInput(int mb, const PiecewiseTensor* grad_output,
                                                   float loss_grad) {
  return RunBackward(mb, grad_output, loss_grad, /*split=*/true);
}

absl::StatusOr<Tensor> BackendChunk::TiedGradient(bool embedding_side) {
  const std::string name = layers_->TiedParamName(embedding_side);
  ASSIGN_OR_RETURN(std::vector<float> g, layers_->GetGrad(name));
  const model::GptConfig& c = layers_->config();
  ASSIGN_OR_RETURN(Tensor t, Tensor::FromBuffer(DType::kF32, {c.vocab_size, c.d_model},
                                                pool_->Acquire(g.size() * sizeof(float))));
  std::copy(g.begin(), g.end(), t.data<float>().begin());
  return t;
}

absl::Status BackendChunk::AddTiedGradient(bool embedding_side, const PiecewiseTensor& other) {
  const model::GptConfig& c = layers_->config();
  RETURN_IF_ERROR(CheckShape(other.dtype(), other.shape(), common::DType::kF32,
                             {c.vocab_size, c.d_model}, "tied-embedding gradient"));
  std::vector<float> values(other.num_bytes() / sizeof(float));
  other.CopyTo(std::as_writable_bytes(std::span<float>(values)));
  return layers_->AddToGrad(layers_->TiedParamName(embedding_side), values);
}

absl::Status BackendChunk::OptimizerStep(const OptimizerSettings& s,
                                         std::optional<double> global_grad_norm) {
  compute::AdamWOptions o;
  o.lr = s.lr;
  o.beta1 = s.beta1;
  o.beta2 = s.beta2;
  o.eps = s.eps;
  o.weight_decay = s.weight_decay;
  o.max_grad_norm = s.grad_clip_norm;
  return layers_->OptimizerStep(o, global_grad_norm).status();
}

}  // namespace pipetrain::stage_server
