#include "stage_server/compute/llama_layers.h"

#include "common/model/llama_family.h"
#include "common/status_macros.h"
#include "stage_server/compute/llama_block.h"
#include "stage_server/compute/normed_head.h"

namespace pipetrain::compute {
namespace {

// ---- Embedding: x = embed_tokens[tokens] (no position embedding: positions are rotary) --

template <typename Real>
class LlamaEmbeddingLayer : public EmbeddingLayer<Real> {
  using E = model::LlamaEmbedding;

 public:
  LlamaEmbeddingLayer(const model::TransformerConfig& c, int index, BackendT<Real>* b)
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
    const model::TransformerConfig& c = this->config_;
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
    const model::TransformerConfig& c = this->config_;
    return this->backend_->EmbeddingForward(B, T, c.d_model, c.vocab_size, tokens,
                                            this->param(E::kEmbedTokens), nullptr, x);
  }
};

// ---- Head: loss = mean cross-entropy(norm(x) lm_head^T, targets) -----------------------
// The skeleton is NormedHeadLayer's; the norm is an RMSNorm, whose statistic is each
// row's rstd.

template <typename Real>
class LlamaHeadLayer : public NormedHeadLayer<Real> {
  using P = model::LlamaHead;

 public:
  LlamaHeadLayer(const model::TransformerConfig& c, int index, BackendT<Real>* b)
      : NormedHeadLayer<Real>(c, index, b, P::kLmHead, /*stats_per_row=*/1) {}

 private:
  absl::Status NormForward(int rows, const Real* x, Real* h, Real* rstd) override {
    const float eps = static_cast<float>(this->config_.norm_eps);
    return this->backend_->RmsNormForward(rows, this->config_.d_model, eps, x,
                                          this->param(P::kNorm), h, rstd);
  }
  absl::Status NormBackwardInput(int rows, const Real* dh, const Real* x, const Real* rstd,
                                 Real* dx) override {
    return this->backend_->RmsNormBackward(rows, this->config_.d_model, dh, x,
                                           this->param(P::kNorm), rstd, dx, nullptr);
  }
  absl::Status NormBackwardWeight(int rows, const Real* dh, const Real* x,
                                  const Real* rstd) override {
    return this->backend_->RmsNormBackward(rows, this->config_.d_model, dh, x,
                                           this->param(P::kNorm), rstd, nullptr,
                                           this->grad(P::kNorm));
  }
};

}  // namespace

template <typename Real>
absl::StatusOr<Layers<Real>> MakeLlamaLayers(const model::TransformerConfig& config, int begin,
                                             int end, BackendT<Real>* backend) {
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

template absl::StatusOr<Layers<float>> MakeLlamaLayers(const model::TransformerConfig&, int, int,
                                                       BackendT<float>*);
template absl::StatusOr<Layers<double>> MakeLlamaLayers(const model::TransformerConfig&, int, int,
                                                        BackendT<double>*);

}  // namespace pipetrain::compute
