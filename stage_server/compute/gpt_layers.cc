#include "stage_server/compute/gpt_layers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/model/init.h"
#include "common/status_macros.h"

namespace pipetrain::compute {

template <typename Real>
absl::StatusOr<void*> Stash<Real>::Allocate(BackendT<Real>* backend, int slot,
                                            size_t bytes) {
  if (slot >= static_cast<int>(slots_.size())) slots_.resize(slot + 1);
  ASSIGN_OR_RETURN(slots_[slot], BackendBuffer<Real>::Allocate(backend, bytes));
  return slots_[slot].raw();
}

template <typename Real>
size_t Stash<Real>::owned_bytes() const {
  size_t total = 0;
  for (const BackendBuffer<Real>& b : slots_) total += b.bytes();
  return total;
}

// ---- PipelineLayer ------------------------------------------------------------------

template <typename Real>
absl::Status PipelineLayer<Real>::AllocateParams() {
  specs_ = model::LayerParams(config_, index_);
  for (const model::ParamSpec& s : specs_) {
    offsets_.push_back(num_params_);
    num_params_ += s.num_elements();
  }
  ASSIGN_OR_RETURN(params_, BackendBuffer<Real>::Zeros(backend_, num_params_));
  ASSIGN_OR_RETURN(grads_, BackendBuffer<Real>::Zeros(backend_, num_params_));
  return absl::OkStatus();
}

template <typename Real>
absl::Status PipelineLayer<Real>::Initialize(uint64_t seed) {
  std::vector<std::vector<float>> values = model::InitLayerParams(config_, index_, seed);
  for (size_t i = 0; i < specs_.size(); ++i) {
    std::vector<Real> v(values[i].begin(), values[i].end());
    RETURN_IF_ERROR(backend_->CopyFromHost(param(i), v.data(), v.size() * sizeof(Real)));
  }
  adam_m_.Reset();  // fresh optimizer state
  adam_v_.Reset();
  return ZeroGrads();
}

template <typename Real>
absl::Status PipelineLayer<Real>::ZeroGrads() {
  return backend_->Zero(grads_.raw(), grads_.bytes());
}

template <typename Real>
absl::Status PipelineLayer<Real>::Backward(Stash<Real>& stash, const Real* grad_output,
                                           Real loss_grad, Real* grad_input) {
  RETURN_IF_ERROR(BackwardInput(stash, grad_output, loss_grad, grad_input));
  return BackwardWeight(stash);
}

template <typename Real>
absl::Status PipelineLayer<Real>::EnsureOptimizerState() {
  if (!adam_m_.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(adam_m_, BackendBuffer<Real>::Zeros(backend_, num_params_));
  ASSIGN_OR_RETURN(adam_v_, BackendBuffer<Real>::Zeros(backend_, num_params_));
  return absl::OkStatus();
}

template <typename Real>
absl::Status PipelineLayer<Real>::AdamWStep(float lr, float beta1, float beta2, float eps,
                                            float weight_decay, int step,
                                            Real grad_scale) {
  RETURN_IF_ERROR(EnsureOptimizerState());
  if (grad_scale != Real{1}) {
    RETURN_IF_ERROR(backend_->Scale(num_params_, grad_scale, grads_.data()));
  }
  for (size_t i = 0; i < specs_.size(); ++i) {
    const int64_t off = offsets_[i];
    RETURN_IF_ERROR(backend_->AdamW(specs_[i].num_elements(), params_.data() + off,
                                    grads_.data() + off, adam_m_.data() + off,
                                    adam_v_.data() + off, lr, beta1, beta2, eps,
                                    specs_[i].is_matrix ? weight_decay : 0.0f, step));
  }
  return absl::OkStatus();
}

template <typename Real>
int64_t PipelineLayer<Real>::OutputElementsPerRow() const {
  return kind() == model::LayerKind::kHead ? 1 : int64_t{config_.seq_len} * config_.d_model;
}

namespace {

// Views a stash slot as a typed pointer after allocating it.
template <typename Real>
absl::StatusOr<Real*> NewSlot(Stash<Real>& stash, BackendT<Real>* backend, int slot,
                              int64_t elements) {
  ASSIGN_OR_RETURN(void* p, stash.Allocate(backend, slot, elements * sizeof(Real)));
  return static_cast<Real*>(p);
}

// ---- Embedding: x = wte[tokens] + wpe[t] ----------------------------------------------

template <typename Real>
class EmbeddingLayer : public PipelineLayer<Real> {
 public:
  using Base = PipelineLayer<Real>;
  EmbeddingLayer(const model::GptConfig& c, int index, BackendT<Real>* b) : Base(c, index, b) {}

  absl::Status Forward(int B, const void* input, const int32_t* /*targets*/, Real* output,
                       Stash<Real>& stash) override {
    const model::GptConfig& c = this->config_;
    stash.Reset(B, input);  // the tokens (B, T) are the only thing kept
    return this->backend_->EmbeddingForward(B, c.seq_len, c.d_model, c.vocab_size,
                                            static_cast<const int32_t*>(input),
                                            this->param(0), this->param(1), output);
  }

  absl::Status BackwardInput(Stash<Real>& stash, const Real* grad_output, Real,
                             Real*) override {
    // Token ids have no gradient; keep dout (B, T, C) for the weight half.
    const int64_t n =
        int64_t{stash.rows()} * this->config_.seq_len * this->config_.d_model;
    ASSIGN_OR_RETURN(Real * dout, NewSlot(stash, this->backend_, kDout, n));
    return this->backend_->Copy(dout, grad_output, n * sizeof(Real));
  }

  absl::Status BackwardWeight(Stash<Real>& stash) override {
    const model::GptConfig& c = this->config_;
    RETURN_IF_ERROR(this->backend_->EmbeddingBackward(
        stash.rows(), c.seq_len, c.d_model, c.vocab_size,
        static_cast<const int32_t*>(stash.input()), stash.get(kDout), this->grad(0),
        this->grad(1)));
    stash.Clear();
    return absl::OkStatus();
  }

 private:
  enum Slot { kDout };
};

// ---- Block: x2 = x + attn(ln_1(x)); y = x2 + mlp(ln_2(x2))
// -----------------------------

template <typename Real>
class BlockLayer : public PipelineLayer<Real> {
 public:
  using Base = PipelineLayer<Real>;
  BlockLayer(const model::GptConfig& c, int index, BackendT<Real>* b) : Base(c, index, b) {}

  absl::Status Forward(int B, const void* input, const int32_t*, Real* output,
                       Stash<Real>& s) override {
    BackendT<Real>* be = this->backend_;
    const int T = this->config_.seq_len, C = this->config_.d_model;
    const int NH = this->config_.n_heads, F = this->config_.mlp_dim();
    const int N = B * T;
    const Real* x = static_cast<const Real*>(input);  // (N, C)
    s.Reset(B, input);
    ASSIGN_OR_RETURN(Real * ln1, NewSlot(s, be, kLn1, int64_t{N} * C));      // (N, C)
    ASSIGN_OR_RETURN(Real * mean1, NewSlot(s, be, kMean1, N));               // (N)
    ASSIGN_OR_RETURN(Real * rstd1, NewSlot(s, be, kRstd1, N));               // (N)
    ASSIGN_OR_RETURN(Real * qkv, NewSlot(s, be, kQkv, int64_t{N} * 3 * C));  // (N, 3C)
    ASSIGN_OR_RETURN(Real * probs,
                     NewSlot(s, be, kProbs, int64_t{B} * NH * T * T));   // (B, NH, T, T)
    ASSIGN_OR_RETURN(Real * att, NewSlot(s, be, kAtt, int64_t{N} * C));  // (N, C)
    ASSIGN_OR_RETURN(Real * x2, NewSlot(s, be, kX2, int64_t{N} * C));    // (N, C)
    ASSIGN_OR_RETURN(Real * ln2, NewSlot(s, be, kLn2, int64_t{N} * C));  // (N, C)
    ASSIGN_OR_RETURN(Real * mean2, NewSlot(s, be, kMean2, N));           // (N)
    ASSIGN_OR_RETURN(Real * rstd2, NewSlot(s, be, kRstd2, N));           // (N)
    ASSIGN_OR_RETURN(Real * fc, NewSlot(s, be, kFc, int64_t{N} * F));    // (N, 4C)
    ASSIGN_OR_RETURN(Real * gelu, NewSlot(s, be, kGelu, int64_t{N} * F));  // (N, 4C)

    RETURN_IF_ERROR(be->LayerNormForward(N, C, x, P(kLn1W), P(kLn1B), ln1, mean1, rstd1));
    RETURN_IF_ERROR(be->Matmul(false, false, N, 3 * C, C, 1, ln1, P(kAttnW), 0, qkv));
    RETURN_IF_ERROR(be->AddBias(N, 3 * C, P(kAttnB), qkv));
    RETURN_IF_ERROR(be->AttentionForward(B, T, C, NH, qkv, att, probs));
    RETURN_IF_ERROR(be->Matmul(false, false, N, C, C, 1, att, P(kProjW), 0, x2));
    RETURN_IF_ERROR(be->AddBias(N, C, P(kProjB), x2));
    RETURN_IF_ERROR(be->Add(int64_t{N} * C, x2, x, x2));
    RETURN_IF_ERROR(
        be->LayerNormForward(N, C, x2, P(kLn2W), P(kLn2B), ln2, mean2, rstd2));
    RETURN_IF_ERROR(be->Matmul(false, false, N, F, C, 1, ln2, P(kFcW), 0, fc));
    RETURN_IF_ERROR(be->AddBias(N, F, P(kFcB), fc));
    RETURN_IF_ERROR(be->GeluForward(int64_t{N} * F, fc, gelu));
    RETURN_IF_ERROR(be->Matmul(false, false, N, C, F, 1, gelu, P(kMlpProjW), 0, output));
    RETURN_IF_ERROR(be->AddBias(N, C, P(kMlpProjB), output));
    return be->Add(int64_t{N} * C, output, x2, output);
  }

  absl::Status BackwardInput(Stash<Real>& s, const Real* grad_output, Real,
                             Real* grad_input) override {
    BackendT<Real>* be = this->backend_;
    const int T = this->config_.seq_len, C = this->config_.d_model;
    const int NH = this->config_.n_heads, F = this->config_.mlp_dim();
    const int B = s.rows(), N = B * T;
    const int64_t NC = int64_t{N} * C;
    const Real* x = static_cast<const Real*>(s.input());
    // MLP: y = x2 + gelu(ln2 Wfc + bfc) Wp + bp.
    ASSIGN_OR_RETURN(Real * dy, NewSlot(s, be, kDy, NC));  // (N, C)
    RETURN_IF_ERROR(be->Copy(dy, grad_output, NC * sizeof(Real)));
    ASSIGN_OR_RETURN(Real * df, NewSlot(s, be, kDf, int64_t{N} * F));  // (N, 4C)
    RETURN_IF_ERROR(be->Matmul(false, true, N, F, C, 1, dy, P(kMlpProjW), 0, df));
    RETURN_IF_ERROR(be->GeluBackward(int64_t{N} * F, s.get(kFc), df, df));
    s.Release(kFc);  // pre-GELU values are not needed by the weight half
    ASSIGN_OR_RETURN(Real * dh, NewSlot(s, be, kDh, NC));  // (N, C)
    RETURN_IF_ERROR(be->Matmul(false, true, N, C, F, 1, df, P(kFcW), 0, dh));
    ASSIGN_OR_RETURN(Real * dx2, NewSlot(s, be, kDx2, NC));  // (N, C)
    RETURN_IF_ERROR(be->Copy(dx2, dy, NC * sizeof(Real)));
    RETURN_IF_ERROR(be->LayerNormBackward(N, C, dh, s.get(kX2), P(kLn2W), s.get(kMean2),
                                          s.get(kRstd2), dx2, nullptr, nullptr));
    // Attention: x2 = x + att Wo + bo, att = attn(ln1 Wqkv + bqkv).
    ASSIGN_OR_RETURN(auto datt, BackendBuffer<Real>::Allocate(be, NC * sizeof(Real)));
    RETURN_IF_ERROR(be->Matmul(false, true, N, C, C, 1, dx2, P(kProjW), 0, datt.data()));
    ASSIGN_OR_RETURN(Real * dqkv, NewSlot(s, be, kDqkv, int64_t{N} * 3 * C));  // (N, 3C)
    RETURN_IF_ERROR(be->AttentionBackward(B, T, C, NH, datt.data(), s.get(kQkv),
                                          s.get(kProbs), dqkv));
    s.Release(kQkv);
    s.Release(kProbs);
    ASSIGN_OR_RETURN(Real * dln1, NewSlot(s, be, kDln1, NC));  // (N, C)
    RETURN_IF_ERROR(be->Matmul(false, true, N, C, 3 * C, 1, dqkv, P(kAttnW), 0, dln1));
    RETURN_IF_ERROR(be->Copy(grad_input, dx2, NC * sizeof(Real)));
    return be->LayerNormBackward(N, C, dln1, x, P(kLn1W), s.get(kMean1), s.get(kRstd1),
                                 grad_input, nullptr, nullptr);
  }

  absl::Status BackwardWeight(Stash<Real>& s) override {
    BackendT<Real>* be = this->backend_;
    const int T = this->config_.seq_len, C = this->config_.d_model;
    const int F = this->config_.mlp_dim();
    const int N = s.rows() * T;
    const Real* x = static_cast<const Real*>(s.input());
    // dW = input^T dout for each linear layer, accumulated (beta = 1).
    RETURN_IF_ERROR(
        be->Matmul(true, false, F, C, N, 1, s.get(kGelu), s.get(kDy), 1, G(kMlpProjW)));
    RETURN_IF_ERROR(be->BiasGrad(N, C, s.get(kDy), G(kMlpProjB)));
    RETURN_IF_ERROR(
        be->Matmul(true, false, C, F, N, 1, s.get(kLn2), s.get(kDf), 1, G(kFcW)));
    RETURN_IF_ERROR(be->BiasGrad(N, F, s.get(kDf), G(kFcB)));
    RETURN_IF_ERROR(be->LayerNormBackward(N, C, s.get(kDh), s.get(kX2), P(kLn2W),
                                          s.get(kMean2), s.get(kRstd2), nullptr, G(kLn2W),
                                          G(kLn2B)));
    RETURN_IF_ERROR(
        be->Matmul(true, false, C, C, N, 1, s.get(kAtt), s.get(kDx2), 1, G(kProjW)));
    RETURN_IF_ERROR(be->BiasGrad(N, C, s.get(kDx2), G(kProjB)));
    RETURN_IF_ERROR(
        be->Matmul(true, false, C, 3 * C, N, 1, s.get(kLn1), s.get(kDqkv), 1, G(kAttnW)));
    RETURN_IF_ERROR(be->BiasGrad(N, 3 * C, s.get(kDqkv), G(kAttnB)));
    RETURN_IF_ERROR(be->LayerNormBackward(N, C, s.get(kDln1), x, P(kLn1W), s.get(kMean1),
                                          s.get(kRstd1), nullptr, G(kLn1W), G(kLn1B)));
    s.Clear();
    return absl::OkStatus();
  }

 private:
  // Parameter indices, in model::LayerParams order.
  enum Param {
    kLn1W,
    kLn1B,
    kAttnW,
    kAttnB,
    kProjW,
    kProjB,
    kLn2W,
    kLn2B,
    kFcW,
    kFcB,
    kMlpProjW,
    kMlpProjB,
  };
  // Stash slots: forward activations, then gradients kept by BackwardInput.
  enum Slot {
    kLn1,
    kMean1,
    kRstd1,
    kQkv,
    kProbs,
    kAtt,
    kX2,
    kLn2,
    kMean2,
    kRstd2,
    kFc,
    kGelu,
    kDy,
    kDf,
    kDh,
    kDx2,
    kDqkv,
    kDln1,
  };
  Real* P(Param p) const { return this->param(p); }
  Real* G(Param p) const { return this->grad(p); }
};

// ---- Head: loss = mean cross-entropy(ln_f(x) lm_head^T, targets)
// -----------------------

template <typename Real>
class HeadLayer : public PipelineLayer<Real> {
 public:
  using Base = PipelineLayer<Real>;
  HeadLayer(const model::GptConfig& c, int index, BackendT<Real>* b) : Base(c, index, b) {}

  absl::Status Forward(int B, const void* input, const int32_t* targets, Real* output,
                       Stash<Real>& s) override {
    BackendT<Real>* be = this->backend_;
    const int C = this->config_.d_model, V = this->config_.vocab_size;
    const int N = B * this->config_.seq_len;
    if (targets == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(model::LayerName(this->config_, this->index_), ": forward needs targets"));
    }
    s.Reset(B, input);
    ASSIGN_OR_RETURN(void* tgt, s.Allocate(be, kTargets, N * sizeof(int32_t)));  // (N)
    RETURN_IF_ERROR(be->Copy(tgt, targets, N * sizeof(int32_t)));
    ASSIGN_OR_RETURN(Real * ln, NewSlot(s, be, kLn, int64_t{N} * C));        // (N, C)
    ASSIGN_OR_RETURN(Real * mean, NewSlot(s, be, kMean, N));                 // (N)
    ASSIGN_OR_RETURN(Real * rstd, NewSlot(s, be, kRstd, N));                 // (N)
    ASSIGN_OR_RETURN(Real * probs, NewSlot(s, be, kProbs, int64_t{N} * V));  // (N, V)
    RETURN_IF_ERROR(be->LayerNormForward(N, C, static_cast<const Real*>(input),
                                         this->param(0), this->param(1), ln, mean, rstd));
    // Logits are computed in place of the probabilities they turn into.
    RETURN_IF_ERROR(be->Matmul(false, true, N, V, C, 1, ln, this->param(2), 0, probs));
    return be->CrossEntropyForward(N, V, probs, static_cast<const int32_t*>(tgt), probs,
                                   output);
  }

  absl::Status BackwardInput(Stash<Real>& s, const Real*, Real loss_grad,
                             Real* grad_input) override {
    BackendT<Real>* be = this->backend_;
    const int C = this->config_.d_model, V = this->config_.vocab_size;
    const int N = s.rows() * this->config_.seq_len;
    // dlogits (N, V) replaces the probabilities.
    Real* dlogits = s.get(kProbs);
    RETURN_IF_ERROR(be->CrossEntropyBackward(N, V, dlogits, s.ints(kTargets),
                                             loss_grad / static_cast<Real>(N), dlogits));
    ASSIGN_OR_RETURN(Real * dln, NewSlot(s, be, kDln, int64_t{N} * C));  // (N, C)
    RETURN_IF_ERROR(
        be->Matmul(false, false, N, C, V, 1, dlogits, this->param(2), 0, dln));
    RETURN_IF_ERROR(be->Zero(grad_input, int64_t{N} * C * sizeof(Real)));
    return be->LayerNormBackward(N, C, dln, static_cast<const Real*>(s.input()),
                                 this->param(0), s.get(kMean), s.get(kRstd), grad_input,
                                 nullptr, nullptr);
  }

  absl::Status BackwardWeight(Stash<Real>& s) override {
    BackendT<Real>* be = this->backend_;
    const int C = this->config_.d_model, V = this->config_.vocab_size;
    const int N = s.rows() * this->config_.seq_len;
    RETURN_IF_ERROR(
        be->Matmul(true, false, V, C, N, 1, s.get(kProbs), s.get(kLn), 1, this->grad(2)));
    RETURN_IF_ERROR(be->LayerNormBackward(
        N, C, s.get(kDln), static_cast<const Real*>(s.input()), this->param(0),
        s.get(kMean), s.get(kRstd), nullptr, this->grad(0), this->grad(1)));
    s.Clear();
    return absl::OkStatus();
  }

 private:
  enum Slot { kTargets, kLn, kMean, kRstd, kProbs, kDln };
};

}  // namespace

template <typename Real>
absl::StatusOr<std::unique_ptr<PipelineLayer<Real>>> MakeLayer(const model::GptConfig& config,
                                                               int index, BackendT<Real>* backend) {
  RETURN_IF_ERROR(model::ValidateConfig(config));
  if (index < 0 || index >= config.num_pipeline_layers()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pipeline layer ", index, " is outside [0, ", config.num_pipeline_layers(), ")"));
  }
  std::unique_ptr<PipelineLayer<Real>> layer;
  switch (model::KindOfLayer(config, index)) {
    case model::LayerKind::kEmbedding:
      layer = std::make_unique<EmbeddingLayer<Real>>(config, index, backend);
      break;
    case model::LayerKind::kBlock:
      layer = std::make_unique<BlockLayer<Real>>(config, index, backend);
      break;
    case model::LayerKind::kHead:
      layer = std::make_unique<HeadLayer<Real>>(config, index, backend);
      break;
  }
  RETURN_IF_ERROR(layer->AllocateParams());
  return layer;
}

template class Stash<float>;
template class Stash<double>;
template class PipelineLayer<float>;
template class PipelineLayer<double>;
template absl::StatusOr<std::unique_ptr<PipelineLayer<float>>> MakeLayer(const model::GptConfig&,
                                                                         int, BackendT<float>*);
template absl::StatusOr<std::unique_ptr<PipelineLayer<double>>> MakeLayer(const model::GptConfig&,
                                                                          int, BackendT<double>*);

}  // namespace pipetrain::compute
