// ChunkCompute over real GPT layers: one compute::ModelChunk (a model chunk) on a
// compute backend. Host tensors (received ones in pieces) are copied into backend
// scratch buffers sized once, and outputs come back in buffers from a shared pool, so the hot
// path allocates nothing after the first micro-batch. With bf16 activations
// (ChunkOptions::boundary) the host tensors of x and its gradient are bf16, 2 bytes an
// element on the wire, and the backend holds them widened to f32: the layers already
// rounded them to bf16 values, so nothing is lost either way.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "common/buffer_pool.h"
#include "stage_server/exec/chunk_compute.h"
#include "stage_server/compute/model_chunk.h"

namespace pipetrain::stage_server {

// A tensor a chunk stages through backend scratch memory: its host (wire) dtype and
// shape. The backend holds a bf16 tensor widened to f32.
struct ScratchTensor {
  common::DType dtype = common::DType::kF32;
  std::vector<int64_t> shape;
  // Its dtype's size times its elements, saturating at UINT64_MAX instead of
  // overflowing (a request sets the shape); 0 when a dimension is not positive.
  uint64_t Bytes() const;
  uint64_t BackendBytes() const;  // the same for its backend buffer
};

// The scratch of a chunk of pipeline layers [begin, end) with `rows` rows per
// micro-batch: the tensors of chunk_compute.h a micro-batch passes in and out, x and
// its gradients in `activations` (kF32 or kBF16).
struct ScratchLayout {
  ScratchTensor input;                       // tokens with the embedding, else x
  std::optional<ScratchTensor> targets;      // with the head
  ScratchTensor output;                      // the loss with the head, else x
  std::optional<ScratchTensor> grad_output;  // without the head
  std::optional<ScratchTensor> grad_input;   // without the embedding
  static ScratchLayout Of(const model::TransformerConfig& config, int begin, int end, int rows,
                          common::DType activations = common::DType::kF32);
  uint64_t Bytes() const;  // of the backend buffers, saturating
};

class BackendChunk final : public ChunkCompute {
 public:
  // `layers` runs on `backend`, which must outlive the chunk. B is the micro-batch rows.
  static absl::StatusOr<std::unique_ptr<BackendChunk>> Create(
      std::unique_ptr<compute::ModelChunk> layers, int rows,
      std::shared_ptr<common::BufferPool> pool);
  // Bytes Create allocates on the backend for the chunk of pipeline layers [begin, end)
  // with `rows` rows per micro-batch (its ScratchLayout), saturating at UINT64_MAX
  // instead of overflowing, so that a configuration can be checked against a memory
  // limit before anything is allocated; 0 for a shape Create refuses.
  static uint64_t BufferBytes(const model::TransformerConfig& config, int begin, int end, int rows);

  bool has_embedding() const override { return layers_->has_embedding(); }
  bool has_head() const override { return layers_->has_head(); }
  absl::StatusOr<common::Tensor> Forward(int mb, const common::PiecewiseTensor& input,
                                         const common::Tensor* targets) override;
  absl::StatusOr<common::Tensor> Evaluate(const common::PiecewiseTensor& input,
                                          const common::Tensor* targets) override;
  absl::StatusOr<common::Tensor> Backward(int mb, const common::PiecewiseTensor* grad_output,
                                          float loss_grad) override;
  absl::StatusOr<common::Tensor> BackwardInput(int mb, const common::PiecewiseTensor* grad_output,
                                               float loss_grad) override;
  absl::Status BackwardWeight(int mb) override { return layers_->BackwardWeight(mb); }
  double LastRecomputeSeconds() const override { return layers_->last_recompute_seconds(); }
  void Abandon() override { layers_->Abandon(); }
  absl::Status ZeroGrads() override { return layers_->ZeroGrads(); }
  absl::StatusOr<double> GradSquaredNorm() override { return layers_->GradSquaredNorm(); }
  int NumGradientLayers() const override { return layers_->num_layers(); }
  absl::StatusOr<std::vector<float>> LayerGradients(int layer) override {
    return layers_->LayerGradients(layer);
  }
  absl::Status SetLayerGradients(int layer, std::span<const float> values) override {
    return layers_->SetLayerGradients(layer, values);
  }
  absl::StatusOr<std::vector<float>> LayerParams(int layer) override {
    return layers_->LayerParams(layer);
  }
  absl::Status SetLayerParams(int layer, std::span<const float> values) override {
    return layers_->SetLayerParams(layer, values);
  }
  bool LayerHoldsTiedParam(int layer) const override { return layers_->LayerHoldsTiedParam(layer); }
  void OnFinalGradients(std::function<void(int)> on_final) override {
    layers_->OnFinalGradients(std::move(on_final));
  }
  absl::StatusOr<common::Tensor> TiedGradient(bool embedding_side) override;
  absl::Status AddTiedGradient(bool embedding_side, const common::PiecewiseTensor& other) override;
  absl::Status SumTiedGradients() override { return layers_->SumTiedGradients(); }
  absl::Status OptimizerStep(const compute::OptimizerSettings& settings,
                             std::optional<double> global_grad_norm) override;
  size_t ActivationBytes() const override { return layers_->ActivationBytes(); }
  size_t PeakActivationBytes() const override { return layers_->PeakActivationBytes(); }
  void ResetPeak() override { layers_->ResetPeak(); }

  compute::ModelChunk& layers() { return *layers_; }

 private:
  BackendChunk(std::unique_ptr<compute::ModelChunk> layers, ScratchLayout layout,
               std::shared_ptr<common::BufferPool> pool)
      : layers_(std::move(layers)), layout_(std::move(layout)), pool_(std::move(pool)) {}
  // OK when a tensor passed in is `want`'s dtype and shape; else INVALID_ARGUMENT
  // naming `what`.
  static absl::Status CheckShape(common::DType dtype, const std::vector<int64_t>& shape,
                                 const ScratchTensor& want, const char* what);
  int Rows() const { return static_cast<int>(layout_.input.shape[0]); }
  // Checks and copies a forward's input and targets into the backend scratch.
  absl::Status StageInputs(const common::PiecewiseTensor& input, const common::Tensor* targets);
  // Copies a received tensor into backend scratch `dst`: as it lies, or a bf16 one
  // widened to f32.
  absl::Status CopyIn(const common::PiecewiseTensor& t, void* dst);
  absl::StatusOr<common::Tensor> RunBackward(int mb, const common::PiecewiseTensor* grad_output,
                                             float loss_grad, bool split);
  // A pooled host tensor of `spec` with the contents of backend scratch `src`.
  absl::StatusOr<common::Tensor> HostTensor(const ScratchTensor& spec, const void* src);

  std::unique_ptr<compute::ModelChunk> layers_;
  const ScratchLayout layout_;
  std::shared_ptr<common::BufferPool> pool_;
  // Backend scratch, as layout_ says (each buffer holds its tensor's dtype): the layers
  // copy their inputs, so one of each suffices.
  compute::BackendBuffer<float> input_, targets_, output_, grad_output_, grad_input_;
  // Host staging for bf16 tensors: their bits, and their values as f32.
  std::vector<uint16_t> bf16_staging_;
  std::vector<float> f32_staging_;
};

}  // namespace pipetrain::stage_server
