// The pipeline layers of a model (embedding, block, head) written against the backend
// interface. Each layer owns its parameters, gradients and AdamW moments in backend
// memory; what one micro-batch's forward keeps for its backward lives in a Stash the
// caller owns, so several micro-batches can be in flight at once. Each model family
// (common/model/model_family.h) implements the three kinds once (GPT-2: gpt2_layers.cc),
// for training and for generation one position at a time; MakeLayers picks the family's.
//
// Layer inputs and outputs (all in backend memory, B = micro-batch rows, T = seq_len):
//   embedding: input tokens (B, T) int32       -> output x (B, T, C)
//   block:     input x (B, T, C)               -> output x (B, T, C)
//   head:      input x (B, T, C) + targets     -> output loss (1), the mean over B*T
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/transformer_config.h"
#include "common/model/optimizer_split.h"
#include "stage_server/compute/backend.h"
#include "stage_server/compute/backend_buffer.h"

namespace pipetrain::compute {

// What one layer keeps between forward and backward for one micro-batch: a pointer to
// the layer's input (owned by whoever produced it) and numbered owned buffers.
template <typename Real>
class Stash {
 public:
  int rows() const { return rows_; }
  const void* input() const { return input_; }
  void Reset(int rows, const void* input) {
    rows_ = rows;
    input_ = input;
    slots_.clear();
  }
  // Allocates slot `slot` with `elements` elements of T (Real or int32_t), replacing
  // what was there.
  template <typename T = Real>
  absl::StatusOr<T*> New(BackendT<Real>* backend, int slot, int64_t elements) {
    if (slot >= static_cast<int>(slots_.size())) slots_.resize(slot + 1);
    absl::StatusOr<BackendBuffer<Real>> b =
        BackendBuffer<Real>::template Elements<T>(backend, elements);
    if (!b.ok()) return b.status();
    slots_[slot] = *std::move(b);
    return static_cast<T*>(slots_[slot].raw());
  }
  // Allocates slot `slot` as the product copy of `elements` elements
  // (Backend::MakeProductCopy, ProductCopyBytes(elements) bytes), replacing what was there.
  absl::StatusOr<void*> NewCopy(BackendT<Real>* backend, int slot, int64_t elements) {
    if (slot >= static_cast<int>(slots_.size())) slots_.resize(slot + 1);
    absl::StatusOr<BackendBuffer<Real>> b = BackendBuffer<Real>::Allocate(
        backend, static_cast<size_t>(backend->ProductCopyBytes(elements)));
    if (!b.ok()) return b.status();
    slots_[slot] = *std::move(b);
    return slots_[slot].raw();
  }
  Real* get(int slot) const {
    return slot < static_cast<int>(slots_.size()) ? slots_[slot].data() : nullptr;
  }
  const void* raw(int slot) const {
    return slot < static_cast<int>(slots_.size()) ? slots_[slot].raw() : nullptr;
  }
  int32_t* ints(int slot) const {
    return slot < static_cast<int>(slots_.size()) ? slots_[slot].ints() : nullptr;
  }
  void Release(int slot) {
    if (slot < static_cast<int>(slots_.size())) slots_[slot].Reset();
  }
  void Clear() { slots_.clear(); }
  size_t owned_bytes() const;

 private:
  int rows_ = 0;
  const void* input_ = nullptr;
  std::vector<BackendBuffer<Real>> slots_;
};

template <typename Real>
class PipelineLayer;

// A chunk's pipeline layers, in order.
template <typename Real>
using Layers = std::vector<std::unique_ptr<PipelineLayer<Real>>>;

// Creates pipeline layers [begin, end) of the model, of its family, as one chunk holds
// them (parameters allocated, not initialised). Layers made together share the tables
// they only read, made here once (model::ChunkTableBytes: Llama's blocks share one pair
// of rotary tables).
template <typename Real>
absl::StatusOr<Layers<Real>> MakeLayers(const model::TransformerConfig& config, int begin, int end,
                                        BackendT<Real>* backend);
// Pipeline layer `index` alone: MakeLayers of [index, index + 1).
template <typename Real>
absl::StatusOr<std::unique_ptr<PipelineLayer<Real>>> MakeLayer(
    const model::TransformerConfig& config, int index, BackendT<Real>* backend);

template <typename Real>
class PipelineLayer {
 public:
  virtual ~PipelineLayer() = default;

  const model::TransformerConfig& config() const { return config_; }
  int index() const { return index_; }  // global pipeline-layer index
  model::LayerKind kind() const { return model::KindOfLayer(config_, index_); }
  const std::vector<model::ParamSpec>& specs() const { return specs_; }
  int64_t num_params() const { return num_params_; }

  // Parameter i (model::LayerParams order) and its gradient, in backend memory. Whoever
  // writes parameters through these pointers calls ParamsChanged afterwards.
  Real* param(int i) const { return params_.data() + offsets_[i]; }
  Real* grad(int i) const { return grads_.data() + offsets_[i]; }
  Real* all_params() const { return params_.data(); }  // (num_params)
  Real* all_grads() const { return grads_.data(); }    // (num_params)
  // Where parameter i starts in the layer's flat parameters.
  uint64_t offset(int i) const { return static_cast<uint64_t>(offsets_[i]); }
  // AdamW's first and second moments (checkpoints carry them), kept for the piece of the
  // flat parameters moment_piece() names: all of them, or one copy's piece when the
  // copies of a stage split the optimizer. They exist from the first optimizer step on,
  // or after EnsureOptimizerState.
  bool has_optimizer_state() const { return !adam_m_.empty(); }
  absl::Status EnsureOptimizerState();  // zeroed moments if there are none yet
  model::CopyRange moment_piece() const { return moment_piece_; }
  // Keeps the moments of `piece` only from now on: before any optimizer state exists
  // (FAILED_PRECONDITION after), within the layer's parameters (INVALID_ARGUMENT).
  absl::Status SetMomentPiece(model::CopyRange piece);
  // The moments of flat parameter `flat`, which lies in moment_piece().
  Real* adam_m_at(uint64_t flat) const { return adam_m_.data() + (flat - moment_piece_.begin); }
  Real* adam_v_at(uint64_t flat) const { return adam_v_.data() + (flat - moment_piece_.begin); }

  // The copy of parameter i the products read (Backend::MakeProductCopy; bf16 products
  // only), remade from the parameters when they changed since the last one: once per
  // step, after the optimizer. nullptr while the backend's products take fp32.
  absl::StatusOr<const void*> ProductCopy(int i);
  // The parameters were written (loaded, imported, stepped): the next ProductCopy remakes
  // the copy. The layer's own writers (Initialize, AdamWStep) call it themselves.
  void ParamsChanged() { product_copy_fresh_ = false; }

  // Sets the parameters to model::InitLayerParams(config, index, seed) and zeroes gradients
  // and optimizer state.
  absl::Status Initialize(uint64_t seed);
  absl::Status ZeroGrads();

  // Forward of one micro-batch of B rows. `input` is tokens (int32) for the embedding
  // and x (Real) otherwise; `targets` (B, T) int32 is used by the head only. Writes
  // `output` and fills `stash` (the input pointer must stay valid until backward).
  virtual absl::Status Forward(int B, const void* input, const int32_t* targets,
                               Real* output, Stash<Real>& stash) = 0;
  // Gradient w.r.t. the input, written to grad_input (B, T, C) (overwritten; ignored by
  // the embedding, which may get nullptr). grad_output is (B, T, C), or for the head
  // ignored in favour of loss_grad, dL/d(loss) (1/M for the mean over M micro-batches).
  // Keeps in `stash` what BackwardWeight needs and frees what it no longer needs.
  virtual absl::Status BackwardInput(Stash<Real>& stash, const Real* grad_output,
                                     Real loss_grad, Real* grad_input) = 0;
  // Accumulates (+=) the parameter gradients of this micro-batch, then clears `stash`.
  virtual absl::Status BackwardWeight(Stash<Real>& stash) = 0;
  // Both halves; the same results as BackwardInput followed by BackwardWeight.
  absl::Status Backward(Stash<Real>& stash, const Real* grad_output, Real loss_grad,
                        Real* grad_input);

  // One AdamW step on every parameter, weight decay on matrices only. The gradient is
  // first multiplied by grad_scale (for global-norm clipping).
  // With a moment piece, on that piece.
  absl::Status AdamWStep(float lr, float beta1, float beta2, float eps,
                         float weight_decay, int step, Real grad_scale) {
    return AdamWStep(lr, beta1, beta2, eps, weight_decay, step, grad_scale, moment_piece_);
  }
  // The same on the parameters in `range` of the layer's flat parameters only, within
  // moment_piece() (INVALID_ARGUMENT otherwise): each element's update is the one the
  // whole step gives it, bit for bit; the rest, their gradients and moments untouched.
  absl::Status AdamWStep(float lr, float beta1, float beta2, float eps, float weight_decay,
                         int step, Real grad_scale, model::CopyRange range);

  // Elements of one micro-batch row in this layer's output ((T, C), or 1 for the head).
  int64_t OutputElementsPerRow() const;

 protected:
  template <typename R>
  friend absl::StatusOr<Layers<R>> MakeLayers(const model::TransformerConfig&, int, int,
                                              BackendT<R>*);
  PipelineLayer(const model::TransformerConfig& config, int index, BackendT<Real>* backend)
      : config_(config), index_(index), backend_(backend) {}
  absl::Status AllocateParams();
  // c (m, n) = a (m, k) @ op(param i), op transposing when trans_w: a product by a
  // weight, read from its product copy when there is one. `a_copy`, when given, is a's
  // product copy, read instead of a.
  absl::Status MatmulByParam(int m, int n, int k, const Real* a, int i, bool trans_w, Real* c,
                             const void* a_copy = nullptr);
  // Whether the backend's products read product copies (bf16): then the activations a
  // layer keeps only for its weight gradients' products are kept as copies.
  bool product_copies() const { return backend_->ProductCopyBytes(1) > 0; }

  model::TransformerConfig config_;
  int index_;
  BackendT<Real>* backend_;
  std::vector<model::ParamSpec> specs_;
  std::vector<int64_t> offsets_;
  int64_t num_params_ = 0;
  BackendBuffer<Real> params_, grads_;
  BackendBuffer<Real> adam_m_, adam_v_;  // moment_piece_.size() each, once they exist
  model::CopyRange moment_piece_;
  // Every parameter as the products take it, at the parameters' offsets, in
  // product_copy_dtype_; made by ProductCopy, stale once product_copy_fresh_ is false.
  BackendBuffer<Real> product_copy_;
  common::DType product_copy_dtype_ = common::DType::kF32;
  bool product_copy_fresh_ = false;
};

// ---- The three kinds, and what generation asks of each --------------------------------
// Generation (kv_cache_decoder.h) runs one position at a time through the same layers,
// with the same arithmetic as their Forward for that position.

template <typename Real>
class EmbeddingLayer : public PipelineLayer<Real> {
 public:
  // x (C) of `token` (one int32 in backend memory) at position `position`.
  virtual absl::Status EmbedPosition(const int32_t* token, int position, Real* x) = 0;

 protected:
  using PipelineLayer<Real>::PipelineLayer;
};

template <typename Real>
class BlockLayer : public PipelineLayer<Real> {
 public:
  // What a block keeps while generating one text: its keys and values of the positions
  // so far, and the buffers one position needs (allocated once, by NewCache).
  class Cache {
   public:
    virtual ~Cache() = default;
  };
  virtual absl::StatusOr<std::unique_ptr<Cache>> NewCache() = 0;
  // x (C) at position `position` (< seq_len) through the block, in place, attending to
  // the positions 0..position of `cache` (this one's keys and values are added to it).
  virtual absl::Status DecodePosition(Cache& cache, int position, Real* x) = 0;

 protected:
  using PipelineLayer<Real>::PipelineLayer;
};

template <typename Real>
class HeadLayer : public PipelineLayer<Real> {
 public:
  // The next-token logits (rows, V) of x (rows, C): the head's forward without the loss.
  virtual absl::Status Logits(int rows, const Real* x, Real* logits) = 0;

 protected:
  using PipelineLayer<Real>::PipelineLayer;
};

}  // namespace pipetrain::compute
