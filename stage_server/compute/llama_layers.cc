#include "stage_server/compute/llama_layers.h"

#include "absl/strings/str_cat.h"
#include "common/model/llama_family.h"
#include "common/status_macros.h"
#include "stage_server/compute/llama_block.h"

namespace pipetrain::compute {
namespace {

// ---- Embedding: x = embed_tokens[tokens] (no position embedding: positions are rotary) --

template <typename Real>
class LlamaEmbeddingLayer : public EmbeddingLayer<Real> {
  using E = model::LlamaEmbedding;

 public:
  LlamaEmbeddingLayer(const model::GptConfig& c, int index, BackendT<Real>* b)
      : EmbeddingLayer<Real>(c, index, b) {}

  absl::Status Forward(int B, const void* input, const int32_t*, Real* output,
                       Stash<Real>& stash) override {
    stash.Reset(B, input);  // the tokens (B, T) are the only thing kept
    return Embed(B, this->config_.seq_len, static_cast<const int32_t*>(input), output);
  }

  absl::Status EmbedPosition(const int32_t* token, int, Real* x) override {
    return Embed(1, 1, token, x);
  }

  absl::Status BackwardInput(Stash<Real>& stash, const Real* grad_output, Real,
                             Real*) override {
    const int64_t n = int64_t{stash.rows()} * this->config_.seq_len * this->config_.d_model;
    ASSIGN_OR_RETURN(Real * dout, stash.New(this->backend_, kDout, n));
    return this->backend_->Copy(dout, grad_output, BytesOf<Real>(n));
  }

  absl::Status BackwardWeight(Stash<Real>& stash) override {
    const model::GptConfig& c = this->config_;
    RETURN_IF_ERROR(this->backend_->EmbeddingBackward(
        stash.rows(), c.seq_len, c.d_model, c.vocab_size,
        static_cast<const int32_t*>(stash.input()), stash.get(kDout),
        this->grad(E::kEmbedTokens), nullptr));
    stash.Clear();
    return absl::OkStatus();
  }

 private:
  enum Slot { kDout };

  absl::Status Embed(int B, int T, const int32_t* tokens, Real* x) {
    const model::GptConfig& c = this->config_;
    return this->backend_->EmbeddingForward(B, T, c.d_model, c.vocab_size, tokens,
                                            this->param(E::kEmbedTokens), nullptr, x);
  }
};

// ---- Head: loss = mean cross-entropy(norm(x) lm_head^T, targets) -----------------------

template <typename Real>
class LlamaHeadLayer : public HeadLayer<Real> {
  using P = model::LlamaHead;

 public:
  LlamaHeadLayer(const model::GptConfig& c, int index, BackendT<Real>* b)
      : HeadLayer<Real>(c, index, b) {}

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
    ASSIGN_OR_RETURN(int32_t * tgt, s.template New<int32_t>(be, kTargets, N));  // (N)
    RETURN_IF_ERROR(be->Copy(tgt, targets, BytesOf<int32_t>(N)));
    ASSIGN_OR_RETURN(Real * rstd, s.New(be, kRstd, N));                 // (N)
    ASSIGN_OR_RETURN(Real * probs, s.New(be, kProbs, int64_t{N} * V));  // (N, V)
    // The norm's output is read again only by the weight-gradient product: with product
    // copies the stash keeps its copy and its values live for this forward only.
    BackendBuffer<Real> h_values;
    Real* h = nullptr;
    void* h_copy = nullptr;
    if (this->product_copies()) {
      ASSIGN_OR_RETURN(h_values, BackendBuffer<Real>::Elements(be, int64_t{N} * C));
      h = h_values.data();
      ASSIGN_OR_RETURN(h_copy, s.NewCopy(be, kH, int64_t{N} * C));
    } else {
      ASSIGN_OR_RETURN(h, s.New(be, kH, int64_t{N} * C));
    }
    RETURN_IF_ERROR(LogitsRows(N, static_cast<const Real*>(input), h, rstd, probs, h_copy));
    return be->CrossEntropyForward(N, V, probs, tgt, probs, output);
  }

  absl::Status Logits(int rows, const Real* x, Real* logits) override {
    BackendT<Real>* be = this->backend_;
    ASSIGN_OR_RETURN(auto h, BackendBuffer<Real>::Elements(be, rows * int64_t{this->config_.d_model}));
    ASSIGN_OR_RETURN(auto rstd, BackendBuffer<Real>::Elements(be, rows));
    return LogitsRows(rows, x, h.data(), rstd.data(), logits);
  }

  absl::Status BackwardInput(Stash<Real>& s, const Real*, Real loss_grad,
                             Real* grad_input) override {
    BackendT<Real>* be = this->backend_;
    const int C = this->config_.d_model, V = this->config_.vocab_size;
    const int N = s.rows() * this->config_.seq_len;
    Real* dlogits = s.get(kProbs);  // (N, V) replaces the probabilities
    RETURN_IF_ERROR(be->CrossEntropyBackward(N, V, dlogits, s.ints(kTargets),
                                             loss_grad / static_cast<Real>(N), dlogits));
    ASSIGN_OR_RETURN(Real * dh, s.New(be, kDh, int64_t{N} * C));  // (N, C)
    RETURN_IF_ERROR(this->MatmulByParam(N, C, V, dlogits, P::kLmHead, false, dh));
    RETURN_IF_ERROR(be->Zero(grad_input, BytesOf<Real>(int64_t{N} * C)));
    return be->RmsNormBackward(N, C, dh, static_cast<const Real*>(s.input()), W(P::kNorm),
                               s.get(kRstd), grad_input, nullptr);
  }

  absl::Status BackwardWeight(Stash<Real>& s) override {
    BackendT<Real>* be = this->backend_;
    const int C = this->config_.d_model, V = this->config_.vocab_size;
    const int N = s.rows() * this->config_.seq_len;
    if (this->product_copies()) {
      RETURN_IF_ERROR(be->MatmulByCopy(true, false, V, C, N, 1, Values<Real>(s.get(kProbs)),
                                       CopyOf<Real>(s.raw(kH)), 1, G(P::kLmHead)));
    } else {
      RETURN_IF_ERROR(
          be->Matmul(true, false, V, C, N, 1, s.get(kProbs), s.get(kH), 1, G(P::kLmHead)));
    }
    RETURN_IF_ERROR(be->RmsNormBackward(N, C, s.get(kDh), static_cast<const Real*>(s.input()),
                                        W(P::kNorm), s.get(kRstd), nullptr, G(P::kNorm)));
    s.Clear();
    return absl::OkStatus();
  }

 private:
  enum Slot { kTargets, kH, kRstd, kProbs, kDh };

  // h (rows, C) = norm(x), keeping its rstd (rows) and its product copy in h_copy when
  // given; out (rows, V) = h lm_head^T.
  absl::Status LogitsRows(int rows, const Real* x, Real* h, Real* rstd, Real* out,
                          void* h_copy = nullptr) {
    BackendT<Real>* be = this->backend_;
    const int C = this->config_.d_model, V = this->config_.vocab_size;
    const float eps = static_cast<float>(this->config_.norm_eps);
    RETURN_IF_ERROR(be->RmsNormForward(rows, C, eps, x, W(P::kNorm), h, rstd));
    if (h_copy != nullptr) RETURN_IF_ERROR(be->MakeProductCopy(int64_t{rows} * C, h, h_copy));
    return this->MatmulByParam(rows, V, C, h, P::kLmHead, true, out, h_copy);
  }
  Real* W(P::Param p) const { return this->param(p); }
  Real* G(P::Param p) const { return this->grad(p); }
};

}  // namespace

template <typename Real>
absl::StatusOr<Layers<Real>> MakeLlamaLayers(const model::GptConfig& config, int begin, int end,
                                             BackendT<Real>* backend) {
  std::shared_ptr<const LlamaRotary<Real>> rotary;
  if (model::ChunkTableBytes(config, begin, end) > 0) {
    ASSIGN_OR_RETURN(rotary, LlamaRotary<Real>::Make(config, backend));
  }
  Layers<Real> layers;
  for (int index = begin; index < end; ++index) {
    switch (model::KindOfLayer(config, index)) {
      case model::LayerKind::kEmbedding:
        layers.push_back(std::make_unique<LlamaEmbeddingLayer<Real>>(config, index, backend));
        break;
      case model::LayerKind::kBlock:
        layers.push_back(MakeLlamaBlock(config, index, backend, rotary));
        break;
      case model::LayerKind::kHead:
        layers.push_back(std::make_unique<LlamaHeadLayer<Real>>(config, index, backend));
        break;
    }
  }
  return layers;
}

template absl::StatusOr<Layers<float>> MakeLlamaLayers(const model::GptConfig&, int, int,
                                                       BackendT<float>*);
template absl::StatusOr<Layers<double>> MakeLlamaLayers(const model::GptConfig&, int, int,
                                                        BackendT<double>*);

}  // namespace pipetrain::compute
