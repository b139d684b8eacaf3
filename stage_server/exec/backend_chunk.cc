#include "stage_server/exec/backend_chunk.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/checked_math.h"
#include "common/status_macros.h"
#include "stage_server/link/host_tensor.h"

namespace pipetrain::stage_server {

using common::DType;
using common::PiecewiseTensor;
using common::Tensor;
using compute::BackendBuffer;

uint64_t ScratchTensor::Bytes() const { return SaturatingTensorBytes(dtype, shape); }

uint64_t ScratchTensor::BackendBytes() const {
  return SaturatingTensorBytes(dtype == DType::kBF16 ? DType::kF32 : dtype, shape);
}

ScratchLayout ScratchLayout::Of(const model::TransformerConfig& c, int begin, int end, int rows,
                                DType activations) {
  const ScratchTensor ids{DType::kI32, {rows, c.seq_len}};
  const ScratchTensor x{activations, {rows, c.seq_len, c.d_model}};
  const bool embedding = begin == 0, head = end == c.num_pipeline_layers();
  ScratchLayout layout;
  layout.input = embedding ? ids : x;
  if (head) layout.targets = ids;
  layout.output = head ? ScratchTensor{DType::kF32, {1}} : x;  // the micro-batch's loss
  if (!head) layout.grad_output = x;
  if (!embedding) layout.grad_input = x;
  return layout;
}

uint64_t ScratchLayout::Bytes() const {
  uint64_t total = common::SaturatingAdd(input.BackendBytes(), output.BackendBytes());
  for (const std::optional<ScratchTensor>& t : {targets, grad_output, grad_input}) {
    if (t) total = common::SaturatingAdd(total, t->BackendBytes());
  }
  return total;
}

namespace {

// The shared (V, C) matrix's gradient, as both holders hold it.
ScratchTensor TiedGradientSpec(const model::TransformerConfig& c) {
  return {DType::kF32, {c.vocab_size, c.d_model}};
}

// An absent tensor has no buffer.
absl::StatusOr<BackendBuffer<float>> AllocateScratch(compute::Backend* backend,
                                                     const std::optional<ScratchTensor>& t) {
  if (!t) return BackendBuffer<float>();
  return BackendBuffer<float>::Allocate(backend, t->BackendBytes());
}

}  // namespace

absl::StatusOr<std::unique_ptr<BackendChunk>> BackendChunk::Create(
    std::unique_ptr<compute::ModelChunk> layers, int rows,
    std::shared_ptr<common::BufferPool> pool) {
  if (rows <= 0) return absl::InvalidArgumentError("micro-batch rows must be > 0");
  auto* backend = layers->backend();
  ScratchLayout layout = ScratchLayout::Of(layers->config(), layers->begin(), layers->end(), rows,
                                           layers->options().boundary);
  std::unique_ptr<BackendChunk> s(
      new BackendChunk(std::move(layers), std::move(layout), std::move(pool)));
  const ScratchLayout& l = s->layout_;
  ASSIGN_OR_RETURN(s->input_, AllocateScratch(backend, l.input));
  ASSIGN_OR_RETURN(s->targets_, AllocateScratch(backend, l.targets));
  ASSIGN_OR_RETURN(s->output_, AllocateScratch(backend, l.output));
  ASSIGN_OR_RETURN(s->grad_output_, AllocateScratch(backend, l.grad_output));
  ASSIGN_OR_RETURN(s->grad_input_, AllocateScratch(backend, l.grad_input));
  return s;
}

uint64_t BackendChunk::BufferBytes(const model::TransformerConfig& c, int begin, int end,
                                   int rows) {
  if (rows <= 0 || c.seq_len <= 0 || c.d_model <= 0) return 0;  // Create refuses these
  return ScratchLayout::Of(c, begin, end, rows).Bytes();
}

absl::Status BackendChunk::CheckShape(DType dtype, const std::vector<int64_t>& shape,
                                      const ScratchTensor& want, const char* what) {
  if (dtype == want.dtype && shape == want.shape) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(what, " is ", common::DTypeName(dtype), " ", common::ShapeString(shape),
                   ", expected ", common::DTypeName(want.dtype), " ",
                   common::ShapeString(want.shape)));
}

absl::StatusOr<Tensor> BackendChunk::HostTensor(const ScratchTensor& spec, const void* src) {
  ASSIGN_OR_RETURN(Tensor t, PooledTensor(*pool_, spec.dtype, spec.shape));
  if (spec.dtype != DType::kBF16) {
    RETURN_IF_ERROR(layers_->backend()->CopyToHost(t.bytes().data(), src, t.num_bytes()));
    return t;
  }
  const size_t n = t.num_bytes() / sizeof(uint16_t);
  f32_staging_.resize(n);
  RETURN_IF_ERROR(layers_->backend()->CopyToHost(f32_staging_.data(), src, n * sizeof(float)));
  auto* bits = reinterpret_cast<uint16_t*>(t.bytes().data());
  for (size_t i = 0; i < n; ++i) bits[i] = common::FloatToBf16Bits(f32_staging_[i]);
  return t;
}

absl::Status BackendChunk::CopyIn(const PiecewiseTensor& t, void* dst) {
  auto* backend = layers_->backend();
  if (t.dtype() != DType::kBF16) return backend->CopyFromHostPieces(dst, t.pieces());
  const size_t n = t.num_bytes() / sizeof(uint16_t);
  bf16_staging_.resize(n);
  f32_staging_.resize(n);
  t.CopyTo(std::as_writable_bytes(std::span<uint16_t>(bf16_staging_)));
  for (size_t i = 0; i < n; ++i) f32_staging_[i] = common::Bf16BitsToFloat(bf16_staging_[i]);
  return backend->CopyFromHost(dst, f32_staging_.data(), n * sizeof(float));
}

absl::Status BackendChunk::StageInputs(const PiecewiseTensor& input, const Tensor* targets) {
  auto* backend = layers_->backend();
  RETURN_IF_ERROR(CheckShape(input.dtype(), input.shape(), layout_.input,
                             has_embedding() ? "tokens" : "activation"));
  RETURN_IF_ERROR(CopyIn(input, input_.raw()));
  if (layout_.targets) {
    if (targets == nullptr) return absl::InvalidArgumentError("the head needs targets");
    RETURN_IF_ERROR(CheckShape(targets->dtype(), targets->shape(), *layout_.targets, "targets"));
    RETURN_IF_ERROR(
        backend->CopyFromHost(targets_.raw(), targets->bytes().data(), targets->num_bytes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> BackendChunk::Forward(int mb, const PiecewiseTensor& input,
                                             const Tensor* targets) {
  RETURN_IF_ERROR(StageInputs(input, targets));
  RETURN_IF_ERROR(layers_->Forward(mb, Rows(), input_.raw(),
                                   has_head() ? targets_.ints() : nullptr, output_.data()));
  return HostTensor(layout_.output, output_.raw());
}

absl::StatusOr<Tensor> BackendChunk::Evaluate(const PiecewiseTensor& input, const Tensor* targets) {
  RETURN_IF_ERROR(StageInputs(input, targets));
  RETURN_IF_ERROR(layers_->Evaluate(Rows(), input_.raw(), has_head() ? targets_.ints() : nullptr,
                                    output_.data()));
  return HostTensor(layout_.output, output_.raw());
}

absl::StatusOr<Tensor> BackendChunk::RunBackward(int mb, const PiecewiseTensor* grad_output,
                                                 float loss_grad, bool split) {
  const float* gout = nullptr;
  if (layout_.grad_output) {
    if (grad_output == nullptr) return absl::InvalidArgumentError("backward needs a gradient");
    RETURN_IF_ERROR(
        CheckShape(grad_output->dtype(), grad_output->shape(), *layout_.grad_output, "gradient"));
    RETURN_IF_ERROR(CopyIn(*grad_output, grad_output_.raw()));
    gout = grad_output_.data();
  }
  float* gin = layout_.grad_input ? grad_input_.data() : nullptr;
  if (split) {
    RETURN_IF_ERROR(layers_->BackwardInput(mb, gout, gin, loss_grad));
  } else {
    RETURN_IF_ERROR(layers_->Backward(mb, gout, gin, loss_grad));
  }
  if (!layout_.grad_input) return Tensor();
  return HostTensor(*layout_.grad_input, grad_input_.raw());
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
  const ScratchTensor spec = TiedGradientSpec(layers_->config());
  ASSIGN_OR_RETURN(Tensor t, PooledTensor(*pool_, spec.dtype, spec.shape));
  std::copy(g.begin(), g.end(), t.data<float>().begin());
  return t;
}

absl::Status BackendChunk::AddTiedGradient(bool embedding_side, const PiecewiseTensor& other) {
  const ScratchTensor spec = TiedGradientSpec(layers_->config());
  RETURN_IF_ERROR(CheckShape(other.dtype(), other.shape(), spec, "tied-embedding gradient"));
  std::vector<float> values(static_cast<size_t>(spec.shape[0] * spec.shape[1]));
  other.CopyTo(std::as_writable_bytes(std::span<float>(values)));
  return layers_->AddToGrad(layers_->TiedParamName(embedding_side), values);
}

absl::Status BackendChunk::OptimizerStep(const compute::OptimizerSettings& settings,
                                         std::optional<double> global_grad_norm) {
  return layers_->OptimizerStep(settings, global_grad_norm).status();
}

}  // namespace pipetrain::stage_server
