// ShardCompute over real GPT layers: one compute::LayerStack (a model chunk) on a
// compute backend. Host tensors (received ones in pieces) are copied into backend
// scratch buffers sized once, and outputs come back in buffers from a shared pool, so the hot
// path allocates nothing after the first micro-batch.
#pragma once

#include <memory>

#include "common/buffer_pool.h"
#include "stage_server/compute/layer_stack.h"
#include "stage_server/shard_compute.h"

namespace pipetrain::stage_server {

class StackShard final : public ShardCompute {
 public:
  // `stack` runs on `backend`, which must outlive the shard. B is the micro-batch rows.
  static absl::StatusOr<std::unique_ptr<StackShard>> Create(
      std::unique_ptr<compute::LayerStack> stack, int rows,
      std::shared_ptr<common::BufferPool> pool);

  bool has_embedding() const override { return stack_->has_embedding(); }
  bool has_head() const override { return stack_->has_head(); }
  absl::StatusOr<common::Tensor> Forward(int mb, const common::PiecewiseTensor& input,
                                         const common::Tensor* targets) override;
  absl::StatusOr<common::Tensor> Evaluate(const common::PiecewiseTensor& input,
                                          const common::Tensor* targets) override;
  absl::StatusOr<common::Tensor> Backward(int mb, const common::PiecewiseTensor* grad_output,
                                          float loss_grad) override;
  absl::StatusOr<common::Tensor> BackwardInput(int mb,
                                               const common::PiecewiseTensor* grad_output,
                                               float loss_grad) override;
  absl::Status BackwardWeight(int mb) override { return stack_->BackwardWeight(mb); }
  void Abandon() override { stack_->Abandon(); }
  absl::Status ZeroGrads() override { return stack_->ZeroGrads(); }
  absl::StatusOr<double> GradSquaredNorm() override { return stack_->GradSquaredNorm(); }
  absl::Status OptimizerStep(const OptimizerSettings& settings,
                             std::optional<double> global_grad_norm) override;
  size_t ActivationBytes() const override { return stack_->ActivationBytes(); }
  size_t PeakActivationBytes() const override { return stack_->PeakActivationBytes(); }
  void ResetPeak() override { stack_->ResetPeak(); }

  compute::LayerStack& stack() { return *stack_; }

 private:
  StackShard(std::unique_ptr<compute::LayerStack> stack, int rows,
             std::shared_ptr<common::BufferPool> pool)
      : stack_(std::move(stack)), rows_(rows), pool_(std::move(pool)) {}
  absl::Status CheckShape(common::DType got_dtype, const std::vector<int64_t>& got_shape,
                          common::DType dtype, std::vector<int64_t> shape,
                          const char* what) const;
  // Checks and copies a forward's input and targets into the backend scratch.
  absl::Status StageInputs(const common::PiecewiseTensor& input, const common::Tensor* targets);
  // The forward's output, from the backend scratch into a pooled host tensor.
  absl::StatusOr<common::Tensor> OutputTensor();
  absl::StatusOr<common::Tensor> RunBackward(int mb, const common::PiecewiseTensor* grad_output,
                                             float loss_grad, bool split);
  absl::StatusOr<common::Tensor> HostTensor(std::vector<int64_t> shape, const void* src);

  std::unique_ptr<compute::LayerStack> stack_;
  int rows_;
  std::shared_ptr<common::BufferPool> pool_;
  // Backend scratch: the stack copies its inputs, so one of each suffices.
  compute::BackendBuffer<float> input_, targets_, output_, grad_output_, grad_input_;
};

}  // namespace pipetrain::stage_server
