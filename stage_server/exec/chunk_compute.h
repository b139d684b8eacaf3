// What the executor needs from the model chunk it runs: forward, backward (full or split)
// and the optimizer on host tensors, whatever device does the work. Inputs that came
// from a neighbour may lie in several pieces (the network's buffers): a chunk copies
// them once, straight into the memory it computes on. BackendChunk runs
// the real GPT layers on a compute backend; EmulatedChunk only takes the time a cost
// model gives, for measuring the runtime itself.
//
// Tensors (B = micro-batch rows, T = seq_len, C = d_model):
//   input        tokens (B, T) i32 if the chunk holds the embedding, else x (B, T, C) f32
//   targets      (B, T) i32, for a chunk holding the head, else nullptr
//   output       x (B, T, C) f32, or the micro-batch's mean loss, shape (1), with the head
//   grad_output  dL/d output (B, T, C); nullptr with the head (its gradient is loss_grad)
//   grad_input   dL/d input (B, T, C); empty for a chunk holding the embedding
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "common/piecewise_tensor.h"
#include "common/tensor.h"
#include "stage_server/compute/optimizer_settings.h"

namespace pipetrain::stage_server {

// Sums a buffer with the other data-parallel replicas' and divides by their number.
// Where the replicas split the optimizer (pipeline.shard_optimizer), only this copy's
// piece of the buffer (common/model/optimizer_split.h) gets the mean; the rest is left
// as it was, and the chunk reads nothing else of it.
using GradientAverage = std::function<absl::Status(std::span<float>)>;
// Replicas that split the optimizer: every piece of a layer's weights becomes its
// owner's (each copy updated its own piece), in place.
using WeightGather = std::function<absl::Status(std::span<float>)>;

class ChunkCompute {
 public:
  virtual ~ChunkCompute() = default;

  virtual bool has_embedding() const = 0;
  virtual bool has_head() const = 0;

  virtual absl::StatusOr<common::Tensor> Forward(int mb, const common::PiecewiseTensor& input,
                                                 const common::Tensor* targets) = 0;
  // Evaluation (forward-only steps): Forward's output, bit for bit, keeping nothing
  // for a backward and leaving no micro-batch in flight.
  virtual absl::StatusOr<common::Tensor> Evaluate(const common::PiecewiseTensor& input,
                                                  const common::Tensor* targets) = 0;
  virtual absl::StatusOr<common::Tensor> Backward(int mb,
                                                  const common::PiecewiseTensor* grad_output,
                                                  float loss_grad) = 0;
  virtual absl::StatusOr<common::Tensor> BackwardInput(int mb,
                                                       const common::PiecewiseTensor* grad_output,
                                                       float loss_grad) = 0;
  virtual absl::Status BackwardWeight(int mb) = 0;
  // Seconds the last Backward or BackwardInput spent re-running the forward before it
  // (activation recomputation); 0 when the chunk does not recompute. The executor
  // reports it as the action's recompute_us.
  virtual double LastRecomputeSeconds() const = 0;
  // Drops in-flight micro-batches after a failed step.
  virtual void Abandon() = 0;

  virtual absl::Status ZeroGrads() = 0;
  // This chunk's share of the squared global gradient norm.
  virtual absl::StatusOr<double> GradSquaredNorm() = 0;
  // Data-parallel replicas: the chunk's gradients are averaged layer by layer, each
  // layer's as soon as they are final. The layers with gradients (0: nothing to average,
  // as on an emulated device), and layer i's gradients as one f32 host buffer, as they
  // lie, and back.
  virtual int NumGradientLayers() const = 0;
  virtual absl::StatusOr<std::vector<float>> LayerGradients(int layer) = 0;
  virtual absl::Status SetLayerGradients(int layer, std::span<const float> values) = 0;
  // Layer i's weights the same way, for copies that gather each other's updated pieces.
  virtual absl::StatusOr<std::vector<float>> LayerParams(int layer) = 0;
  virtual absl::Status SetLayerParams(int layer, std::span<const float> values) = 0;
  // With tied embeddings: layer i holds wte or the head's copy, whose gradient is summed
  // with its other holder's at the optimizer step, so averaged only after that.
  virtual bool LayerHoldsTiedParam(int layer) const = 0;
  // `on_final(i)` runs inside the next Backward or BackwardWeight each time layer i's
  // gradients are complete: set it for the step's last gradient action of the chunk.
  // An empty function clears it.
  virtual void OnFinalGradients(std::function<void(int)> on_final) = 0;
  // Tied embeddings (model.tie_embeddings): the gradient of the shared (V, C) f32
  // matrix as this chunk holds it, wte's (embedding_side) or the head's copy's, and
  // adding the other holder's to it, so that both hold the sum before the optimizer.
  virtual absl::StatusOr<common::Tensor> TiedGradient(bool embedding_side) = 0;
  virtual absl::Status AddTiedGradient(bool embedding_side,
                                       const common::PiecewiseTensor& other) = 0;
  // For a chunk holding both (a one-stage job): both become their sum, in the chunk's own
  // memory (compute::ModelChunk::SumTiedGradients), the same bits as the two calls above.
  virtual absl::Status SumTiedGradients() = 0;
  // AdamW; clipping (when on) uses global_grad_norm, the norm over the whole model.
  virtual absl::Status OptimizerStep(const compute::OptimizerSettings& settings,
                                     std::optional<double> global_grad_norm) = 0;

  // Activation bytes held now, and the most held since the last ResetPeak (moments
  // inside an action included).
  virtual size_t ActivationBytes() const = 0;
  virtual size_t PeakActivationBytes() const = 0;
  virtual void ResetPeak() = 0;
};

}  // namespace pipetrain::stage_server
