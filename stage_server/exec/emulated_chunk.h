// ChunkCompute for the emulated device: runs no arithmetic; every action takes the
// time the analytic cost model gives it on a named device (FLOPs / FLOP rate), and
// outputs have their real sizes, so scheduling, transfers and overlap are measured for
// real. Every figure it produces is labelled emulated.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "common/buffer_pool.h"
#include "common/model/transformer_config.h"
#include "common/model/precision.h"
#include "stage_server/exec/chunk_compute.h"

namespace pipetrain::stage_server {

struct EmulatedDevice {
  std::string name;
  double flops = 0;  // sustained FLOP/s assumed for every action
  // Stages that name one shared device (--device emulated:NAME@SHARED) take turns on
  // it, across processes of the host; "" for a device of its own.
  std::string shared;
};
// "h100", "h200", "a100", or a FLOP rate such as "2.5e12".
absl::StatusOr<EmulatedDevice> EmulatedDeviceByName(const std::string& name);

// Occupies the emulated device for `seconds`: first, when it is `shared` (not ""),
// waiting for the stages sharing it, in any process of the host, to let it go (each
// holds an exclusive lock on SharedDeviceLockPath(shared) while it occupies it).
void OccupyEmulatedDevice(double seconds, const std::string& shared);
std::string SharedDeviceLockPath(const std::string& shared);

class EmulatedChunk final : public ChunkCompute {
 public:
  // `precision`: training.precision's row; its output activations and input gradients
  // travel in its activations' dtype, so that the wire carries what a real chunk's
  // would, and its memory counts what a real chunk's would hold in it.
  EmulatedChunk(const model::TransformerConfig& config, int begin, int end, int rows,
                EmulatedDevice device, bool recompute, std::shared_ptr<common::BufferPool> pool,
                const model::Precision& precision = model::PrecisionTable().front());

  bool has_embedding() const override { return begin_ == 0; }
  bool has_head() const override { return end_ == config_.num_pipeline_layers(); }
  absl::StatusOr<common::Tensor> Forward(int mb, const common::PiecewiseTensor& input,
                                         const common::Tensor* targets) override;
  absl::StatusOr<common::Tensor> Evaluate(const common::PiecewiseTensor& input,
                                          const common::Tensor* targets) override;
  absl::StatusOr<common::Tensor> Backward(int mb, const common::PiecewiseTensor* grad_output,
                                          float loss_grad) override;
  absl::StatusOr<common::Tensor> BackwardInput(int mb, const common::PiecewiseTensor* grad_output,
                                               float loss_grad) override;
  absl::Status BackwardWeight(int mb) override;
  // The modelled share of the last B or I, not a measurement: the forward's time when
  // recomputing (it is part of what backward_input_s sleeps).
  double LastRecomputeSeconds() const override { return last_recompute_s_; }
  void Abandon() override;
  absl::Status ZeroGrads() override { return absl::OkStatus(); }
  absl::StatusOr<double> GradSquaredNorm() override { return 0.0; }
  // No weights, so nothing to reduce (the reduction's time is not emulated yet).
  // No weights: nothing to average.
  int NumGradientLayers() const override { return 0; }
  absl::StatusOr<std::vector<float>> LayerGradients(int) override {
    return absl::FailedPreconditionError("an emulated chunk holds no gradients");
  }
  absl::Status SetLayerGradients(int, std::span<const float>) override {
    return absl::FailedPreconditionError("an emulated chunk holds no gradients");
  }
  absl::StatusOr<std::vector<float>> LayerParams(int) override {
    return absl::FailedPreconditionError("an emulated chunk holds no weights");
  }
  absl::Status SetLayerParams(int, std::span<const float>) override {
    return absl::FailedPreconditionError("an emulated chunk holds no weights");
  }
  bool LayerHoldsTiedParam(int) const override { return false; }
  void OnFinalGradients(std::function<void(int)>) override {}
  // The tied gradient has its real size on the wire; its values mean nothing.
  absl::StatusOr<common::Tensor> TiedGradient(bool embedding_side) override;
  absl::Status AddTiedGradient(bool, const common::PiecewiseTensor&) override {
    return absl::OkStatus();
  }
  absl::Status SumTiedGradients() override { return absl::OkStatus(); }
  absl::Status OptimizerStep(const compute::OptimizerSettings&, std::optional<double>) override;
  size_t ActivationBytes() const override { return held_; }
  size_t PeakActivationBytes() const override { return peak_; }
  void ResetPeak() override { peak_ = held_; }

  // Seconds each action takes for one micro-batch.
  double forward_s() const { return forward_s_; }
  double backward_input_s() const { return backward_input_s_; }
  double backward_weight_s() const { return backward_weight_s_; }

 private:
  absl::StatusOr<common::Tensor> Output(std::vector<int64_t> shape,
                                        common::DType dtype = common::DType::kF32);
  absl::StatusOr<common::Tensor> Activation();  // (rows, T, C) in activations_
  void Hold(int mb, size_t bytes);  // adds to what micro-batch mb holds
  void Release(int mb);

  model::TransformerConfig config_;
  int begin_, end_, rows_;
  EmulatedDevice device_;
  bool recompute_;
  std::shared_ptr<common::BufferPool> pool_;
  common::DType activations_;
  double forward_s_ = 0, backward_input_s_ = 0, backward_weight_s_ = 0, optimizer_s_ = 0;
  double last_recompute_s_ = 0;
  model::ChunkMemory memory_;  // bytes per micro-batch (not per token), as the planner counts
  size_t evaluate_bytes_ = 0;  // an evaluation holds one layer's stash at a time: the largest
  void Peak(size_t extra);
  std::map<int, size_t> in_flight_;
  size_t held_ = 0, peak_ = 0;
};

}  // namespace pipetrain::stage_server
