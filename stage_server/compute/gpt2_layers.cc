#include "stage_server/compute/gpt2_layers.h"

#include <cmath>

#include "absl/functional/function_ref.h"
#include "common/model/gpt2_family.h"
#include "common/status_macros.h"
#include "stage_server/compute/normed_head.h"

namespace pipetrain::compute {
namespace {

// ---- Embedding: x = wte[tokens] + wpe[t] ----------------------------------------------

template <typename Real>
class Gpt2EmbeddingLayer : public EmbeddingLayer<Real> {
  using E = model::Gpt2Embedding;

 public:
  Gpt2EmbeddingLayer(const model::TransformerConfig& c, int index, BackendT<Real>* b)
      : EmbeddingLayer<Real>(c, index, b) {}

  absl::Status Forward(int B, const void* input, const int32_t* /*targets*/, Real* output,
                       Stash<Real>& stash) override {
    stash.Reset(B, input);  // the tokens (B, T) are the only thing kept
    return Embed(B, this->config_.seq_len, 0, static_cast<const int32_t*>(input), output);
  }

  absl::Status EmbedPosition(const int32_t* token, int position, Real* x) override {
    return Embed(1, 1, position, token, x);
  }

  absl::Status BackwardInput(Stash<Real>& stash, const Real* grad_output, Real,
                             Real*) override {
    // Token ids have no gradient; keep dout (B, T, C) for the weight half.
    const int64_t n = int64_t{stash.rows()} * this->config_.seq_len * this->config_.d_model;
    ASSIGN_OR_RETURN(Real * dout, stash.New(this->backend_, kDout, n));
    return this->backend_->Copy(dout, grad_output, BytesOf<Real>(n));
  }

  absl::Status BackwardWeight(Stash<Real>& stash) override {
    const model::TransformerConfig& c = this->config_;
    RETURN_IF_ERROR(this->backend_->EmbeddingBackward(
        stash.rows(), c.seq_len, c.d_model, c.vocab_size,
        static_cast<const int32_t*>(stash.input()), stash.get(kDout), this->grad(E::kWte),
        this->grad(E::kWpe)));
    stash.Clear();
    return absl::OkStatus();
  }

 private:
  enum Slot { kDout };

  // x (B, T, C) of tokens (B, T) at positions first .. first + T - 1.
  absl::Status Embed(int B, int T, int first, const int32_t* tokens, Real* x) {
    const model::TransformerConfig& c = this->config_;
    return this->backend_->EmbeddingForward(B, T, c.d_model, c.vocab_size, tokens,
                                            this->param(E::kWte),
                                            this->param(E::kWpe) + int64_t{first} * c.d_model, x);
  }
};

// ---- Block: x2 = x + attn(ln_1(x)); y = x2 + mlp(ln_2(x2)) ------------------------------

template <typename Real>
class Gpt2BlockLayer : public BlockLayer<Real> {
  using P = model::Gpt2Block;

 public:
  Gpt2BlockLayer(const model::TransformerConfig& c, int index, BackendT<Real>* b)
      : BlockLayer<Real>(c, index, b) {}

  absl::Status Forward(int B, const void* input, const int32_t*, Real* output,
                       Stash<Real>& s) override {
    BackendT<Real>* be = this->backend_;
    const int T = this->config_.seq_len, C = this->config_.d_model;
    const int NH = this->config_.n_heads, F = this->config_.mlp_dim();
    const int64_t N = int64_t{B} * T;
    s.Reset(B, input);
    Activations a;
    ASSIGN_OR_RETURN(a.mean1, s.New(be, kMean1, N));                          // (N)
    ASSIGN_OR_RETURN(a.rstd1, s.New(be, kRstd1, N));                          // (N)
    ASSIGN_OR_RETURN(a.qkv, s.New(be, kQkv, N * 3 * C));                      // (N, 3C)
    ASSIGN_OR_RETURN(Real * probs, s.New(be, kProbs, int64_t{B} * NH * T * T));  // (B, NH, T, T)
    ASSIGN_OR_RETURN(a.x2, s.New(be, kX2, N * C));                            // (N, C)
    ASSIGN_OR_RETURN(a.mean2, s.New(be, kMean2, N));                          // (N)
    ASSIGN_OR_RETURN(a.rstd2, s.New(be, kRstd2, N));                          // (N)
    ASSIGN_OR_RETURN(a.fc, s.New(be, kFc, N * F));                            // (N, 4C)
    // ln_1, attention out, ln_2 (N, C) and post-GELU (N, 4C) are read again only by the
    // weight gradients' products: with product copies the stash keeps their copies, and
    // their values live in two buffers for this forward only (used one after the other).
    BackendBuffer<Real> rows_c, rows_f;
    if (this->product_copies()) {
      ASSIGN_OR_RETURN(rows_c, BackendBuffer<Real>::Elements(be, N * C));
      ASSIGN_OR_RETURN(rows_f, BackendBuffer<Real>::Elements(be, N * F));
      a.ln1 = a.att = a.ln2 = rows_c.data();
      a.gelu = rows_f.data();
      ASSIGN_OR_RETURN(a.ln1_copy, s.NewCopy(be, kLn1, N * C));
      ASSIGN_OR_RETURN(a.att_copy, s.NewCopy(be, kAtt, N * C));
      ASSIGN_OR_RETURN(a.ln2_copy, s.NewCopy(be, kLn2, N * C));
      ASSIGN_OR_RETURN(a.gelu_copy, s.NewCopy(be, kGelu, N * F));
    } else {
      ASSIGN_OR_RETURN(a.ln1, s.New(be, kLn1, N * C));
      ASSIGN_OR_RETURN(a.att, s.New(be, kAtt, N * C));
      ASSIGN_OR_RETURN(a.ln2, s.New(be, kLn2, N * C));
      ASSIGN_OR_RETURN(a.gelu, s.New(be, kGelu, N * F));
    }
    return ForwardRows(static_cast<int>(N), static_cast<const Real*>(input), a, output,
                       [&](const Real* qkv, Real* att) {
                         return be->AttentionForward(B, T, C, NH, qkv, att, probs);
                       });
  }

  absl::Status BackwardInput(Stash<Real>& s, const Real* grad_output, Real,
                             Real* grad_input) override;
  absl::Status BackwardWeight(Stash<Real>& s) override;

  absl::StatusOr<std::unique_ptr<typename BlockLayer<Real>::Cache>> NewCache() override;

  absl::Status DecodePosition(typename BlockLayer<Real>::Cache& cache, int position,
                              Real* x) override {
    auto& c = static_cast<Cache&>(cache);
    Real* mean = c.stats.data();
    Real* rstd = c.stats.data() + 1;
    // One position's activations: the LayerNorms share their buffers, GELU runs in place.
    const Activations a{c.ln.data(), mean, rstd, c.qkv.data(), c.att.data(), c.x2.data(),
                        c.ln.data(), mean, rstd, c.fc.data(), c.fc.data()};
    return ForwardRows(1, x, a, x, [&](const Real* qkv, Real* att) {
      return AttendToCache(c, position, qkv, att);
    });
  }

 private:
  // Where the forward writes: the stash slots in training, one position's buffers (some
  // shared) in generation. The four copies are the product copies the stash keeps for
  // the backward (training with product copies only; nullptr otherwise).
  struct Activations {
    Real *ln1, *mean1, *rstd1, *qkv, *att, *x2, *ln2, *mean2, *rstd2, *fc, *gelu;
    void *ln1_copy = nullptr, *att_copy = nullptr, *ln2_copy = nullptr, *gelu_copy = nullptr;
  };

  // Generation's state of the block.
  struct Cache : BlockLayer<Real>::Cache {
    // (2 NH, T, hs): rows 0..NH-1 the keys of each head, NH..2NH-1 the values, position t
    // of a head at row offset t * hs, so that one head's keys are one matrix.
    BackendBuffer<Real> kv;
    BackendBuffer<Real> ln;      // (C)
    BackendBuffer<Real> stats;   // (2) LayerNorm mean and rstd (not needed, but written)
    BackendBuffer<Real> qkv;     // (3C)
    BackendBuffer<Real> scores;  // (NH, <= T) attention scores, then probabilities
    BackendBuffer<Real> att;     // (C)
    BackendBuffer<Real> x2;      // (C) residual after attention
    BackendBuffer<Real> fc;      // (4C)
  };

  // The block's forward over `rows` positions x (rows, C) into out (rows, C; it may be
  // x), written once for training and generation: `attention` turns qkv (rows, 3C) into
  // att (rows, C), the one part that differs.
  absl::Status ForwardRows(int rows, const Real* x, const Activations& a, Real* out,
                           absl::FunctionRef<absl::Status(const Real*, Real*)> attention) {
    BackendT<Real>* be = this->backend_;
    const int C = this->config_.d_model, F = this->config_.mlp_dim();
    const int64_t RC = int64_t{rows} * C;
    const int64_t RF = int64_t{rows} * F;
    RETURN_IF_ERROR(be->LayerNormForward(rows, C, x, W(P::kLn1Weight), W(P::kLn1Bias), a.ln1,
                                         a.mean1, a.rstd1));
    RETURN_IF_ERROR(KeepCopy(RC, a.ln1, a.ln1_copy));
    RETURN_IF_ERROR(
        this->MatmulByParam(rows, 3 * C, C, a.ln1, P::kAttnWeight, false, a.qkv, a.ln1_copy));
    RETURN_IF_ERROR(be->AddBias(rows, 3 * C, W(P::kAttnBias), a.qkv));
    RETURN_IF_ERROR(attention(a.qkv, a.att));
    RETURN_IF_ERROR(KeepCopy(RC, a.att, a.att_copy));
    RETURN_IF_ERROR(
        this->MatmulByParam(rows, C, C, a.att, P::kAttnProjWeight, false, a.x2, a.att_copy));
    RETURN_IF_ERROR(be->AddBias(rows, C, W(P::kAttnProjBias), a.x2));
    RETURN_IF_ERROR(be->Add(RC, a.x2, x, a.x2));
    RETURN_IF_ERROR(be->LayerNormForward(rows, C, a.x2, W(P::kLn2Weight), W(P::kLn2Bias), a.ln2,
                                         a.mean2, a.rstd2));
    RETURN_IF_ERROR(KeepCopy(RC, a.ln2, a.ln2_copy));
    RETURN_IF_ERROR(
        this->MatmulByParam(rows, F, C, a.ln2, P::kFcWeight, false, a.fc, a.ln2_copy));
    RETURN_IF_ERROR(be->AddBias(rows, F, W(P::kFcBias), a.fc));
    RETURN_IF_ERROR(be->GeluForward(RF, a.fc, a.gelu));
    RETURN_IF_ERROR(KeepCopy(RF, a.gelu, a.gelu_copy));
    RETURN_IF_ERROR(
        this->MatmulByParam(rows, C, F, a.gelu, P::kMlpProjWeight, false, out, a.gelu_copy));
    RETURN_IF_ERROR(be->AddBias(rows, C, W(P::kMlpProjBias), out));
    return be->Add(RC, out, a.x2, out);
  }

  // Attention of position t's query over the cached positions 0..t, its own key and value
  // added to the cache first.
  absl::Status AttendToCache(Cache& c, int t, const Real* qkv, Real* att) {
    BackendT<Real>* be = this->backend_;
    const int C = this->config_.d_model, NH = this->config_.n_heads;
    const int hs = this->config_.head_dim(), T = this->config_.seq_len, n = t + 1;
    // The 2 NH head rows of k|v (each hs wide, contiguous in qkv after q) go to row t of
    // their head's (T, hs) matrix in the cache.
    Real* keys = c.kv.data();                    // (NH, T, hs)
    Real* values = keys + int64_t{NH} * T * hs;  // (NH, T, hs)
    RETURN_IF_ERROR(be->Copy2D(2 * NH, hs, qkv + C, hs, keys + int64_t{t} * hs, int64_t{T} * hs));
    // Per head: scores (1, n) = q k^T / sqrt(hs) over positions 0..t; softmax; out = p v.
    const Real scale = static_cast<Real>(1.0 / std::sqrt(static_cast<double>(hs)));
    Real* scores = c.scores.data();  // (NH, n)
    for (int h = 0; h < NH; ++h) {
      RETURN_IF_ERROR(be->Matmul(false, true, 1, n, hs, scale, qkv + h * hs,
                                 keys + int64_t{h} * T * hs, 0, scores + int64_t{h} * n));
    }
    RETURN_IF_ERROR(be->Softmax(NH, n, scores, scores));
    for (int h = 0; h < NH; ++h) {
      RETURN_IF_ERROR(be->Matmul(false, false, 1, hs, n, 1, scores + int64_t{h} * n,
                                 values + int64_t{h} * T * hs, 0, att + h * hs));
    }
    return absl::OkStatus();
  }

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
  Real* W(P::Param p) const { return this->param(p); }
  Real* G(P::Param p) const { return this->grad(p); }
  // copy = x's product copy, when a copy is wanted.
  absl::Status KeepCopy(int64_t n, const Real* x, void* copy) {
    return copy == nullptr ? absl::OkStatus() : this->backend_->MakeProductCopy(n, x, copy);
  }
  // G(p) (m, n) += stash slot (N, m)^T @ dout (N, n): a weight gradient, reading the slot's
  // product copy when the forward kept one.
  absl::Status WeightGradient(const Stash<Real>& s, Slot slot, int m, int n, int N,
                              const Real* dout, P::Param p) {
    BackendT<Real>* be = this->backend_;
    if (!this->product_copies()) {
      return be->Matmul(true, false, m, n, N, 1, s.get(slot), dout, 1, G(p));
    }
    return be->MatmulByCopy(true, false, m, n, N, 1, CopyOf<Real>(s.raw(slot)), Values(dout), 1,
                            G(p));
  }
};

template <typename Real>
absl::Status Gpt2BlockLayer<Real>::BackwardInput(Stash<Real>& s, const Real* grad_output, Real,
                                                 Real* grad_input) {
  BackendT<Real>* be = this->backend_;
  const int T = this->config_.seq_len, C = this->config_.d_model;
  const int NH = this->config_.n_heads, F = this->config_.mlp_dim();
  const int B = s.rows(), N = B * T;
  const int64_t NC = int64_t{N} * C;
  const Real* x = static_cast<const Real*>(s.input());
  // MLP: y = x2 + gelu(ln2 Wfc + bfc) Wp + bp.
  ASSIGN_OR_RETURN(Real * dy, s.New(be, kDy, NC));  // (N, C)
  RETURN_IF_ERROR(be->Copy(dy, grad_output, BytesOf<Real>(NC)));
  ASSIGN_OR_RETURN(Real * df, s.New(be, kDf, int64_t{N} * F));  // (N, 4C)
  RETURN_IF_ERROR(this->MatmulByParam(N, F, C, dy, P::kMlpProjWeight, true, df));
  RETURN_IF_ERROR(be->GeluBackward(int64_t{N} * F, s.get(kFc), df, df));
  s.Release(kFc);  // pre-GELU values are not needed by the weight half
  ASSIGN_OR_RETURN(Real * dh, s.New(be, kDh, NC));  // (N, C)
  RETURN_IF_ERROR(this->MatmulByParam(N, C, F, df, P::kFcWeight, true, dh));
  ASSIGN_OR_RETURN(Real * dx2, s.New(be, kDx2, NC));  // (N, C)
  RETURN_IF_ERROR(be->Copy(dx2, dy, BytesOf<Real>(NC)));
  RETURN_IF_ERROR(be->LayerNormBackward(N, C, dh, s.get(kX2), W(P::kLn2Weight), s.get(kMean2),
                                        s.get(kRstd2), dx2, nullptr, nullptr));
  // Attention: x2 = x + att Wo + bo, att = attn(ln1 Wqkv + bqkv).
  ASSIGN_OR_RETURN(auto datt, BackendBuffer<Real>::Elements(be, NC));
  RETURN_IF_ERROR(this->MatmulByParam(N, C, C, dx2, P::kAttnProjWeight, true, datt.data()));
  ASSIGN_OR_RETURN(Real * dqkv, s.New(be, kDqkv, int64_t{N} * 3 * C));  // (N, 3C)
  RETURN_IF_ERROR(
      be->AttentionBackward(B, T, C, NH, datt.data(), s.get(kQkv), s.get(kProbs), dqkv));
  s.Release(kQkv);
  s.Release(kProbs);
  ASSIGN_OR_RETURN(Real * dln1, s.New(be, kDln1, NC));  // (N, C)
  RETURN_IF_ERROR(this->MatmulByParam(N, C, 3 * C, dqkv, P::kAttnWeight, true, dln1));
  RETURN_IF_ERROR(be->Copy(grad_input, dx2, BytesOf<Real>(NC)));
  return be->LayerNormBackward(N, C, dln1, x, W(P::kLn1Weight), s.get(kMean1), s.get(kRstd1),
                               grad_input, nullptr, nullptr);
}

template <typename Real>
absl::Status Gpt2BlockLayer<Real>::BackwardWeight(Stash<Real>& s) {
  BackendT<Real>* be = this->backend_;
  const int T = this->config_.seq_len, C = this->config_.d_model;
  const int F = this->config_.mlp_dim();
  const int N = s.rows() * T;
  const Real* x = static_cast<const Real*>(s.input());
  // dW = input^T dout for each linear layer, accumulated (beta = 1).
  RETURN_IF_ERROR(WeightGradient(s, kGelu, F, C, N, s.get(kDy), P::kMlpProjWeight));
  RETURN_IF_ERROR(be->BiasGrad(N, C, s.get(kDy), G(P::kMlpProjBias)));
  RETURN_IF_ERROR(WeightGradient(s, kLn2, C, F, N, s.get(kDf), P::kFcWeight));
  RETURN_IF_ERROR(be->BiasGrad(N, F, s.get(kDf), G(P::kFcBias)));
  RETURN_IF_ERROR(be->LayerNormBackward(N, C, s.get(kDh), s.get(kX2), W(P::kLn2Weight),
                                        s.get(kMean2), s.get(kRstd2), nullptr,
                                        G(P::kLn2Weight), G(P::kLn2Bias)));
  RETURN_IF_ERROR(WeightGradient(s, kAtt, C, C, N, s.get(kDx2), P::kAttnProjWeight));
  RETURN_IF_ERROR(be->BiasGrad(N, C, s.get(kDx2), G(P::kAttnProjBias)));
  RETURN_IF_ERROR(WeightGradient(s, kLn1, C, 3 * C, N, s.get(kDqkv), P::kAttnWeight));
  RETURN_IF_ERROR(be->BiasGrad(N, 3 * C, s.get(kDqkv), G(P::kAttnBias)));
  RETURN_IF_ERROR(be->LayerNormBackward(N, C, s.get(kDln1), x, W(P::kLn1Weight), s.get(kMean1),
                                        s.get(kRstd1), nullptr, G(P::kLn1Weight),
                                        G(P::kLn1Bias)));
  s.Clear();
  return absl::OkStatus();
}

template <typename Real>
absl::StatusOr<std::unique_ptr<typename BlockLayer<Real>::Cache>> Gpt2BlockLayer<Real>::NewCache() {
  BackendT<Real>* be = this->backend_;
  const model::TransformerConfig& c = this->config_;
  const int64_t C = c.d_model;
  auto cache = std::make_unique<Cache>();
  ASSIGN_OR_RETURN(cache->kv, BackendBuffer<Real>::Elements(be, 2 * int64_t{c.seq_len} * C));
  ASSIGN_OR_RETURN(cache->ln, BackendBuffer<Real>::Elements(be, C));
  ASSIGN_OR_RETURN(cache->stats, BackendBuffer<Real>::Elements(be, 2));
  ASSIGN_OR_RETURN(cache->qkv, BackendBuffer<Real>::Elements(be, 3 * C));
  ASSIGN_OR_RETURN(cache->scores,
                   BackendBuffer<Real>::Elements(be, int64_t{c.n_heads} * c.seq_len));
  ASSIGN_OR_RETURN(cache->att, BackendBuffer<Real>::Elements(be, C));
  ASSIGN_OR_RETURN(cache->x2, BackendBuffer<Real>::Elements(be, C));
  ASSIGN_OR_RETURN(cache->fc, BackendBuffer<Real>::Elements(be, c.mlp_dim()));
  return std::unique_ptr<typename BlockLayer<Real>::Cache>(std::move(cache));
}

// ---- Head: loss = mean cross-entropy(ln_f(x) lm_head^T, targets) -----------------------
// The skeleton is NormedHeadLayer's; ln_f is a LayerNorm, whose statistics are each
// row's mean, then each row's rstd.

template <typename Real>
class Gpt2HeadLayer : public NormedHeadLayer<Real> {
  using P = model::Gpt2Head;

 public:
  Gpt2HeadLayer(const model::TransformerConfig& c, int index, BackendT<Real>* b)
      : NormedHeadLayer<Real>(c, index, b, P::kLmHead, /*stats_per_row=*/2) {}

 private:
  absl::Status NormForward(int rows, const Real* x, Real* h, Real* stats) override {
    return this->backend_->LayerNormForward(rows, this->config_.d_model, x, W(P::kLnFWeight),
                                            W(P::kLnFBias), h, stats, stats + rows);
  }
  absl::Status NormBackwardInput(int rows, const Real* dh, const Real* x, const Real* stats,
                                 Real* dx) override {
    return this->backend_->LayerNormBackward(rows, this->config_.d_model, dh, x,
                                             W(P::kLnFWeight), stats, stats + rows, dx, nullptr,
                                             nullptr);
  }
  absl::Status NormBackwardWeight(int rows, const Real* dh, const Real* x,
                                  const Real* stats) override {
    return this->backend_->LayerNormBackward(rows, this->config_.d_model, dh, x,
                                             W(P::kLnFWeight), stats, stats + rows, nullptr,
                                             G(P::kLnFWeight), G(P::kLnFBias));
  }
  Real* W(P::Param p) const { return this->param(p); }
  Real* G(P::Param p) const { return this->grad(p); }
};

}  // namespace

template <typename Real>
std::unique_ptr<PipelineLayer<Real>> MakeGpt2Layer(const model::TransformerConfig& config,
                                                   int index, BackendT<Real>* backend) {
  switch (model::KindOfLayer(config, index)) {
    case model::LayerKind::kEmbedding:
      return std::make_unique<Gpt2EmbeddingLayer<Real>>(config, index, backend);
    case model::LayerKind::kBlock:
      return std::make_unique<Gpt2BlockLayer<Real>>(config, index, backend);
    case model::LayerKind::kHead:
      return std::make_unique<Gpt2HeadLayer<Real>>(config, index, backend);
  }
  return nullptr;
}

template std::unique_ptr<PipelineLayer<float>> MakeGpt2Layer(const model::TransformerConfig&, int,
                                                             BackendT<float>*);
template std::unique_ptr<PipelineLayer<double>> MakeGpt2Layer(const model::TransformerConfig&, int,
                                                              BackendT<double>*);

}  // namespace pipetrain::compute
