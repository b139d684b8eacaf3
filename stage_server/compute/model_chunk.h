// ModelChunk: the pipeline layers [begin, end) of a model on one backend, as a stage
// server's executor drives them: forward and backward of numbered micro-batches (several
// in flight, in any order a schedule picks), the split backward of zero-bubble
// schedules, optional activation recomputation, gradient accumulation and AdamW.
//
// All tensors passed in and out live in the backend's memory (B = micro-batch rows):
//   input:       tokens (B, T) int32 if the chunk holds the embedding, else x (B, T, C)
//   targets:     (B, T) int32, required iff the chunk holds the head, else nullptr
//   output:      x (B, T, C), or the micro-batch's mean loss (1) if it holds the head
//   grad_output: dL/d output (B, T, C); nullptr for a chunk holding the head, whose
//                starting gradient is loss_grad (1/M when the step's loss is the mean
//                over M micro-batches)
//   grad_input:  dL/d input (B, T, C); nullptr allowed when the chunk holds the embedding
// Inputs are copied, so callers may reuse their buffers as soon as a call returns.
// Besides its layers' parameters and its micro-batches' activations, a chunk holds the
// tables its layers share, made once at Create (model::ChunkTableBytes).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/transformer_config.h"
#include "stage_server/compute/backend.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/gpt_layers.h"
#include "stage_server/compute/optimizer_settings.h"

namespace pipetrain::compute {

struct ChunkOptions {
  // Keep only each micro-batch's chunk input between forward and backward, and run the
  // forward again before backward. Results are bit-identical; memory is lower.
  bool recompute = false;
  // The dtype of the residual stream between layers: kBF16 (training.precision "bf16")
  // rounds every layer's output activation (not the head's loss) and every gradient a
  // layer passes down to bf16 values, held in Real. A stage boundary is a layer
  // boundary, so they cross it in 2 bytes an element without loss and K stages still
  // compute what one does.
  common::DType boundary = common::DType::kF32;
  // The copies of this stage that split the optimizer, and which one this is: the chunk
  // steps, and sums the squared norm of, only its piece of every layer's parameters.
  OptimizerSplit split = {};
};

// Not thread-safe: one executor thread drives a chunk (and its backend). ModelChunk
// (float) is what stage servers use; ModelChunkT<double> exists for gradient checks.
template <typename Real>
class ModelChunkT {
 public:
  static absl::StatusOr<std::unique_ptr<ModelChunkT>> Create(const model::TransformerConfig& config,
                                                             int begin, int end,
                                                             BackendT<Real>* backend,
                                                             ChunkOptions options = {});

  const model::TransformerConfig& config() const { return config_; }
  int begin() const { return begin_; }
  int end() const { return end_; }
  bool has_embedding() const { return begin_ == 0; }
  bool has_head() const { return end_ == config_.num_pipeline_layers(); }
  // The layers by kind (generation asks each kind for its own part): the chunk must hold
  // the embedding, block `b` (from 0) or the head.
  EmbeddingLayer<Real>& embedding() { return static_cast<EmbeddingLayer<Real>&>(layer(0)); }
  BlockLayer<Real>& block(int b) { return static_cast<BlockLayer<Real>&>(layer(b + 1)); }
  HeadLayer<Real>& head() {
    return static_cast<HeadLayer<Real>&>(layer(config_.num_pipeline_layers() - 1));
  }
  const ChunkOptions& options() const { return options_; }
  BackendT<Real>* backend() const { return backend_; }
  // Elements of the output of a micro-batch of B rows: B*T*C, or 1 with the head.
  int64_t OutputElements(int B) const;
  int64_t InputBytes(int B) const;  // bytes of the input of a micro-batch of B rows
  // Elements of grad_input for B rows: B*T*C, or 0 for a chunk holding the embedding.
  int64_t GradInputElements(int B) const {
    return has_embedding() ? 0 : int64_t{B} * config_.seq_len * config_.d_model;
  }

  // Deterministic initialisation (see init.h); the same weights for any partition.
  absl::Status Initialize(uint64_t seed);

  // ---- Micro-batches ----------------------------------------------------------------
  // Fails with FailedPrecondition if `mb` is already in flight.
  absl::Status Forward(int mb, int B, const void* input, const int32_t* targets, Real* output);
  // Evaluation: the same arithmetic as Forward, so the same output bit for bit, but
  // nothing is kept for a backward: each layer's stash and input go as soon as the
  // layer has run, and no micro-batch is left in flight. The peak counts what one
  // layer holds at once.
  absl::Status Evaluate(int B, const void* input, const int32_t* targets, Real* output);
  // Full backward (input and weight halves) of a forwarded micro-batch; its gradients
  // add to the parameter gradients and its activations are freed.
  absl::Status Backward(int mb, const Real* grad_output, Real* grad_input, Real loss_grad = 1);
  // The split backward: BackwardInput produces grad_input and keeps what the weight
  // half needs; BackwardWeight (later, any order among micro-batches) accumulates the
  // parameter gradients and frees the micro-batch. Together they equal Backward.
  absl::Status BackwardInput(int mb, const Real* grad_output, Real* grad_input, Real loss_grad = 1);
  absl::Status BackwardWeight(int mb);
  // Seconds the last Backward or BackwardInput spent re-running the forward (with
  // options().recompute; 0 without). Measured between two backend synchronisations,
  // so on an asynchronous device it is the recompute's device time, not its launch.
  double last_recompute_seconds() const { return last_recompute_s_; }
  int in_flight() const { return static_cast<int>(micro_batches_.size()); }
  // Drops every in-flight micro-batch (after a failed step).
  void Abandon() { micro_batches_.clear(); }

  // Bytes of activations held now for every in-flight micro-batch, and the most held
  // at any point since creation or the last ResetPeak (recomputation's transient
  // stashes included).
  size_t ActivationBytes() const;
  size_t PeakActivationBytes() const { return peak_bytes_; }
  void ResetPeak() { peak_bytes_ = ActivationBytes(); }

  // ---- Parameters and gradients -------------------------------------------------------
  std::vector<model::ParamSpec> Params() const;  // model::RangeParams(config, begin, end)
  int64_t NumParams() const;
  // Host copies, by Hugging Face name; NotFound names the chunk's range.
  enum class Field { kParam, kGrad, kAdamM, kAdamV };
  absl::StatusOr<std::vector<Real>> GetParam(absl::string_view name) const {
    return CopyOut(name, Field::kParam);
  }
  absl::StatusOr<std::vector<Real>> GetGrad(absl::string_view name) const {
    return CopyOut(name, Field::kGrad);
  }
  absl::Status SetParam(absl::string_view name, const std::vector<Real>& values) {
    return CopyIn(name, Field::kParam, values);
  }
  // AdamW state, for checkpoints: the two moments of a parameter and the step count.
  // Under a split, a copy gives its piece's moments and zeros for the rest, and takes
  // its piece's from the values it is given.
  absl::StatusOr<std::vector<Real>> GetOptimizerMoment(absl::string_view name, bool second) const {
    return CopyOut(name, second ? Field::kAdamV : Field::kAdamM);
  }
  absl::Status SetOptimizerMoment(absl::string_view name, bool second,
                                  const std::vector<Real>& values) {
    return CopyIn(name, second ? Field::kAdamV : Field::kAdamM, values);
  }
  void set_step(int step) { step_ = step; }
  absl::Status ZeroGrads();
  // Tied embeddings (model.tie_embeddings). The name under which this chunk holds the
  // shared (V, C) matrix: the token embedding with the embedding, its copy with the head
  // (model::TiedParamsOf); empty for an untied model.
  std::string TiedParamName(bool embedding_side) const;
  // grad(name) += other: the other holder's gradient. Both holders adding the
  // other's to their own get the same sum bit for bit (addition commutes).
  absl::Status AddToGrad(absl::string_view name, const std::vector<Real>& other);
  // For a chunk holding both the embedding and the head of a tied model (one device):
  // both gradients become their sum. A no-op otherwise.
  absl::Status SumTiedGradients();
  // Sum of squares of every gradient in this chunk (add across stages, then sqrt, for
  // the global norm). A tied copy is left out: its original counts once. With a split
  // (ChunkOptions::split), only this copy's piece of each layer: add across the copies too.
  absl::StatusOr<double> GradSquaredNorm();
  // Data-parallel replicas (averaged layer by layer, see ChunkCompute): layer i's
  // (0-based in this chunk) gradients as one host buffer, as they lie, and back.
  int num_layers() const { return static_cast<int>(layers_.size()); }
  absl::StatusOr<std::vector<Real>> LayerGradients(int i) const { return LayerOut(i, false); }
  absl::Status SetLayerGradients(int i, std::span<const Real> values) {
    return LayerIn(i, false, values);
  }
  // Layer i's weights the same way (copies that split the optimizer gather each other's
  // updated pieces through them); setting them remakes the products' copy.
  absl::StatusOr<std::vector<Real>> LayerParams(int i) const { return LayerOut(i, true); }
  absl::Status SetLayerParams(int i, std::span<const Real> values) {
    return LayerIn(i, true, values);
  }
  // With model.tie_embeddings: layer i holds wte or the head's copy of it.
  bool LayerHoldsTiedParam(int i) const;
  // Called with i right after layer i's parameter gradients were added to by Backward
  // or BackwardWeight (not BackwardInput, which adds none), so final when set for the
  // step's last gradient action; empty: not called.
  void OnFinalGradients(std::function<void(int)> on_final) { on_final_ = std::move(on_final); }

  // One AdamW step (the step counter starts at 1). With grad_clip_norm > 0 the gradients
  // are clipped by `global_grad_norm`, or by this chunk's own norm if not given (right
  // for a single stage; a pipeline passes the norm over all stages). Does not zero the
  // gradients. Returns the gradient norm used (0 when clipping is off and none given).
  // With a split of more than one copy, steps only this copy's piece of each layer
  // (PipelineLayer::AdamWStep), and clipping needs the global norm (FAILED_PRECONDITION
  // without: this copy's gradients alone do not give it).
  absl::StatusOr<double> OptimizerStep(const OptimizerSettings& settings,
                                       std::optional<double> global_grad_norm = {});
  int step() const { return step_; }

  PipelineLayer<Real>& layer(int global_index) { return *layers_[global_index - begin_]; }

 private:
  struct MicroBatch {
    int rows = 0;
    bool input_done = false;                   // BackwardInput has run
    BackendBuffer<Real> input;                 // copy of the chunk input
    BackendBuffer<Real> targets;               // copy of the targets (head chunks)
    std::vector<BackendBuffer<Real>> outputs;  // outputs of layers but the last
    std::vector<Stash<Real>> stashes;          // one per layer
    size_t Bytes() const;
  };

  ModelChunkT(const model::TransformerConfig& config, int begin, int end, BackendT<Real>* backend,
              ChunkOptions options)
      : config_(config), begin_(begin), end_(end), backend_(backend), options_(options) {}

  // Runs every layer's forward, filling mbs's stashes and outputs; the last output goes
  // to `output`.
  absl::Status RunForward(MicroBatch& mb, Real* output);
  absl::Status RunBackwardInput(MicroBatch& mb, const Real* grad_output, Real* grad_input,
                                Real loss_grad, bool fused);
  absl::StatusOr<MicroBatch*> Find(int mb, const char* what);
  absl::StatusOr<std::pair<PipelineLayer<Real>*, int>> FindParam(absl::string_view name) const;
  void NotePeak();
  absl::StatusOr<std::vector<Real>> CopyOut(absl::string_view name, Field field) const;
  absl::Status CopyIn(absl::string_view name, Field field, const std::vector<Real>& values);
  // Layer i's flat weights (params) or gradients, to and from the host.
  absl::StatusOr<std::vector<Real>> LayerOut(int i, bool params) const;
  absl::Status LayerIn(int i, bool params, std::span<const Real> values);
  // Parameter i's weights or gradient (not its moments: HeldPart).
  static Real* Address(const PipelineLayer<Real>& layer, int i, Field field);
  // The part of parameter i's `field` this chunk holds: `count` elements from element
  // `skip` of the parameter, at `device`. All of it, except moments under a split (the
  // part in the layer's moment piece; none when they do not meet).
  struct Part {
    Real* device;
    uint64_t skip;
    uint64_t count;
  };
  static Part HeldPart(const PipelineLayer<Real>& layer, int i, Field field);
  // Rounds a tensor crossing a layer boundary to options_.boundary.
  absl::Status AtBoundary(int64_t n, Real* x);

  model::TransformerConfig config_;
  int begin_, end_;
  BackendT<Real>* backend_;
  ChunkOptions options_;
  std::vector<std::unique_ptr<PipelineLayer<Real>>> layers_;
  std::map<int, MicroBatch> micro_batches_;
  size_t peak_bytes_ = 0;
  double last_recompute_s_ = 0;
  int step_ = 0;
  std::function<void(int)> on_final_;
};

using ModelChunk = ModelChunkT<float>;

}  // namespace pipetrain::compute
