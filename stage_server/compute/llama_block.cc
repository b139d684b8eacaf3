#include "stage_server/compute/llama_block.h"

#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "common/model/llama_family.h"
#include "common/model/rope.h"
#include "common/status_macros.h"

namespace pipetrain::compute {
namespace {

// ---- Block: x2 = x + o(attn(rope(qkv(norm1(x))))); y = x2 + down(swiglu(gu(norm2(x2)))) --

template <typename Real>
class LlamaBlockLayer : public BlockLayer<Real> {
  using P = model::LlamaBlock;

 public:
  LlamaBlockLayer(const model::TransformerConfig& c, int index, BackendT<Real>* b,
                  std::shared_ptr<const LlamaRotary<Real>> rotary)
      : BlockLayer<Real>(c, index, b), rotary_(std::move(rotary)) {}

  absl::Status Forward(int B, const void* input, const int32_t*, Real* output,
                       Stash<Real>& s) override;
  absl::Status BackwardInput(Stash<Real>& s, const Real* grad_output, Real,
                             Real* grad_input) override;
  absl::Status BackwardWeight(Stash<Real>& s) override;
  absl::StatusOr<std::unique_ptr<typename BlockLayer<Real>::Cache>> NewCache() override;
  absl::Status DecodePosition(typename BlockLayer<Real>::Cache& cache, int position,
                              Real* x) override;

 private:
  // Where the forward writes (stash slots in training, one position's buffers in
  // generation) and the product copies the stash keeps (nullptr without them).
  struct Activations {
    Real *h1, *rstd1, *qkv, *att, *x2, *h2, *rstd2, *gu, *m;
    void *h1_copy = nullptr, *att_copy = nullptr, *h2_copy = nullptr, *m_copy = nullptr;
  };
  struct Cache : BlockLayer<Real>::Cache {
    // (2 NKV, T, hs): the keys of each key/value head, then the values; position t of a
    // head at row offset t * hs.
    BackendBuffer<Real> kv;
    BackendBuffer<Real> h, rstd, qkv, scores, att, x2, gu, m;
  };
  enum Slot { kH1, kRstd1, kQkv, kProbs, kAtt, kX2, kH2, kRstd2, kGu, kM,
              kDy, kDgu, kDh2, kDx2, kDqkv, kDh1 };
  using Attention = absl::FunctionRef<absl::Status(const Real*, Real*)>;

  int C() const { return this->config_.d_model; }
  int T() const { return this->config_.seq_len; }
  int F() const { return this->config_.ffn_dim; }
  int NH() const { return this->config_.n_heads; }
  int NKV() const { return this->config_.kv_heads(); }
  int hs() const { return this->config_.head_dim(); }
  int Wqkv() const { return C() + 2 * NKV() * hs(); }  // q|k|v's width
  float eps() const { return static_cast<float>(this->config_.norm_eps); }
  Real* W(P::Param p) const { return this->param(p); }
  Real* G(P::Param p) const { return this->grad(p); }

  absl::Status ForwardRows(int rows, int T_rows, int first, const Real* x, const Activations& a,
                           Real* out, Attention attention);
  absl::Status Attend(int B, const Real* qkv, Real* att, Real* probs);
  absl::Status AttendBackward(int B, const Real* datt, const Real* qkv, const Real* probs,
                              Real* dqkv);
  absl::Status AttendToCache(Cache& c, int t, const Real* qkv, Real* att);
  absl::Status KeepCopy(int64_t n, const Real* x, void* copy) {
    return copy == nullptr ? absl::OkStatus() : this->backend_->MakeProductCopy(n, x, copy);
  }
  // G(p) (out, in) += dout (N, out)^T @ stash slot (N, in), reading the slot's product
  // copy when the forward kept one.
  absl::Status WeightGradient(const Stash<Real>& s, Slot slot, int out, int in, int N,
                              const Real* dout, P::Param p) {
    BackendT<Real>* be = this->backend_;
    if (!this->product_copies()) {
      return be->Matmul(true, false, out, in, N, 1, dout, s.get(slot), 1, G(p));
    }
    return be->MatmulByCopy(true, false, out, in, N, 1, Values(dout), CopyOf<Real>(s.raw(slot)),
                            1, G(p));
  }

  const Real* cos_table() const { return rotary_->cos.data(); }
  const Real* sin_table() const { return rotary_->sin.data(); }

  std::shared_ptr<const LlamaRotary<Real>> rotary_;  // its chunk's, shared by its blocks
};

template <typename Real>
absl::Status LlamaBlockLayer<Real>::Forward(int B, const void* input, const int32_t*,
                                            Real* output, Stash<Real>& s) {
  BackendT<Real>* be = this->backend_;
  const int64_t N = int64_t{B} * T();
  s.Reset(B, input);
  Activations a;
  ASSIGN_OR_RETURN(a.rstd1, s.New(be, kRstd1, N));                                // (N)
  ASSIGN_OR_RETURN(a.qkv, s.New(be, kQkv, N * Wqkv()));                            // (N, W)
  ASSIGN_OR_RETURN(Real * probs, s.New(be, kProbs, int64_t{B} * NH() * T() * T()));
  ASSIGN_OR_RETURN(a.x2, s.New(be, kX2, N * C()));                                 // (N, C)
  ASSIGN_OR_RETURN(a.rstd2, s.New(be, kRstd2, N));                                // (N)
  ASSIGN_OR_RETURN(a.gu, s.New(be, kGu, N * 2 * F()));                             // (N, 2F)
  // The norms' outputs, the attention output and the SwiGLU output are read again only
  // by the weight gradients' products: with product copies the stash keeps their copies.
  BackendBuffer<Real> rows_c, rows_f;
  if (this->product_copies()) {
    ASSIGN_OR_RETURN(rows_c, BackendBuffer<Real>::Elements(be, N * C()));
    ASSIGN_OR_RETURN(rows_f, BackendBuffer<Real>::Elements(be, N * F()));
    a.h1 = a.att = a.h2 = rows_c.data();
    a.m = rows_f.data();
    ASSIGN_OR_RETURN(a.h1_copy, s.NewCopy(be, kH1, N * C()));
    ASSIGN_OR_RETURN(a.att_copy, s.NewCopy(be, kAtt, N * C()));
    ASSIGN_OR_RETURN(a.h2_copy, s.NewCopy(be, kH2, N * C()));
    ASSIGN_OR_RETURN(a.m_copy, s.NewCopy(be, kM, N * F()));
  } else {
    ASSIGN_OR_RETURN(a.h1, s.New(be, kH1, N * C()));
    ASSIGN_OR_RETURN(a.att, s.New(be, kAtt, N * C()));
    ASSIGN_OR_RETURN(a.h2, s.New(be, kH2, N * C()));
    ASSIGN_OR_RETURN(a.m, s.New(be, kM, N * F()));
  }
  return ForwardRows(static_cast<int>(N), T(), 0, static_cast<const Real*>(input), a, output,
                     [&](const Real* qkv, Real* att) { return Attend(B, qkv, att, probs); });
}

// The block over `rows` positions x (rows, C) into out (rows, C; it may be x), row r at
// position first + r % T_rows; `attention` turns the rotated q|k|v into att (rows, C).
template <typename Real>
absl::Status LlamaBlockLayer<Real>::ForwardRows(int rows, int T_rows, int first, const Real* x,
                                                const Activations& a, Real* out,
                                                Attention attention) {
  BackendT<Real>* be = this->backend_;
  const int64_t RC = int64_t{rows} * C();
  const int64_t half = hs() / 2;
  RETURN_IF_ERROR(be->RmsNormForward(rows, C(), eps(), x, W(P::kInputNorm), a.h1, a.rstd1));
  RETURN_IF_ERROR(KeepCopy(RC, a.h1, a.h1_copy));
  RETURN_IF_ERROR(this->MatmulByParam(rows, Wqkv(), C(), a.h1, P::kQProj, true, a.qkv, a.h1_copy));
  RETURN_IF_ERROR(be->Rotary(rows, T_rows, NH() + NKV(), hs(), Wqkv(),
                             cos_table() + first * half, sin_table() + first * half, false,
                             a.qkv));
  RETURN_IF_ERROR(attention(a.qkv, a.att));
  RETURN_IF_ERROR(KeepCopy(RC, a.att, a.att_copy));
  RETURN_IF_ERROR(this->MatmulByParam(rows, C(), C(), a.att, P::kOProj, true, a.x2, a.att_copy));
  RETURN_IF_ERROR(be->Add(RC, a.x2, x, a.x2));
  RETURN_IF_ERROR(be->RmsNormForward(rows, C(), eps(), a.x2, W(P::kPostNorm), a.h2, a.rstd2));
  RETURN_IF_ERROR(KeepCopy(RC, a.h2, a.h2_copy));
  RETURN_IF_ERROR(
      this->MatmulByParam(rows, 2 * F(), C(), a.h2, P::kGateProj, true, a.gu, a.h2_copy));
  RETURN_IF_ERROR(be->SwiGluForward(rows, F(), a.gu, a.m));
  RETURN_IF_ERROR(KeepCopy(int64_t{rows} * F(), a.m, a.m_copy));
  RETURN_IF_ERROR(this->MatmulByParam(rows, C(), F(), a.m, P::kDownProj, true, out, a.m_copy));
  return be->Add(RC, out, a.x2, out);
}

// Causal attention of B sequences; with grouped heads, on the key/value heads repeated
// to the query heads' count.
template <typename Real>
absl::Status LlamaBlockLayer<Real>::Attend(int B, const Real* qkv, Real* att, Real* probs) {
  BackendT<Real>* be = this->backend_;
  if (NKV() == NH()) return be->AttentionForward(B, T(), C(), NH(), qkv, att, probs);
  const int rows = B * T();
  ASSIGN_OR_RETURN(auto full, BackendBuffer<Real>::Elements(be, int64_t{rows} * 3 * C()));
  RETURN_IF_ERROR(be->RepeatKv(rows, NH(), NKV(), hs(), qkv, full.data()));
  return be->AttentionForward(B, T(), C(), NH(), full.data(), att, probs);
}

template <typename Real>
absl::Status LlamaBlockLayer<Real>::AttendBackward(int B, const Real* datt, const Real* qkv,
                                                   const Real* probs, Real* dqkv) {
  BackendT<Real>* be = this->backend_;
  if (NKV() == NH()) return be->AttentionBackward(B, T(), C(), NH(), datt, qkv, probs, dqkv);
  const int rows = B * T();
  const int64_t n = int64_t{rows} * 3 * C();
  ASSIGN_OR_RETURN(auto full, BackendBuffer<Real>::Elements(be, n));
  ASSIGN_OR_RETURN(auto dfull, BackendBuffer<Real>::Elements(be, n));
  RETURN_IF_ERROR(be->RepeatKv(rows, NH(), NKV(), hs(), qkv, full.data()));
  RETURN_IF_ERROR(be->AttentionBackward(B, T(), C(), NH(), datt, full.data(), probs, dfull.data()));
  return be->SumKvGroups(rows, NH(), NKV(), hs(), dfull.data(), dqkv);
}

template <typename Real>
absl::Status LlamaBlockLayer<Real>::BackwardInput(Stash<Real>& s, const Real* grad_output, Real,
                                                  Real* grad_input) {
  BackendT<Real>* be = this->backend_;
  const int B = s.rows(), N = B * T();
  const int64_t NC = int64_t{N} * C();
  const Real* x = static_cast<const Real*>(s.input());
  // MLP: y = x2 + down(swiglu(h2 Wgu^T)).
  ASSIGN_OR_RETURN(Real * dy, s.New(be, kDy, NC));
  RETURN_IF_ERROR(be->Copy(dy, grad_output, BytesOf<Real>(NC)));
  ASSIGN_OR_RETURN(auto dm, BackendBuffer<Real>::Elements(be, int64_t{N} * F()));
  RETURN_IF_ERROR(this->MatmulByParam(N, F(), C(), dy, P::kDownProj, false, dm.data()));
  ASSIGN_OR_RETURN(Real * dgu, s.New(be, kDgu, int64_t{N} * 2 * F()));
  RETURN_IF_ERROR(be->SwiGluBackward(N, F(), s.get(kGu), dm.data(), dgu));
  s.Release(kGu);
  ASSIGN_OR_RETURN(Real * dh2, s.New(be, kDh2, NC));
  RETURN_IF_ERROR(this->MatmulByParam(N, C(), 2 * F(), dgu, P::kGateProj, false, dh2));
  ASSIGN_OR_RETURN(Real * dx2, s.New(be, kDx2, NC));
  RETURN_IF_ERROR(be->Copy(dx2, dy, BytesOf<Real>(NC)));
  RETURN_IF_ERROR(be->RmsNormBackward(N, C(), dh2, s.get(kX2), W(P::kPostNorm), s.get(kRstd2),
                                      dx2, nullptr));
  // Attention: x2 = x + o(attn(rope(h1 Wqkv^T))).
  ASSIGN_OR_RETURN(auto datt, BackendBuffer<Real>::Elements(be, NC));
  RETURN_IF_ERROR(this->MatmulByParam(N, C(), C(), dx2, P::kOProj, false, datt.data()));
  ASSIGN_OR_RETURN(Real * dqkv, s.New(be, kDqkv, int64_t{N} * Wqkv()));
  RETURN_IF_ERROR(AttendBackward(B, datt.data(), s.get(kQkv), s.get(kProbs), dqkv));
  s.Release(kQkv);
  s.Release(kProbs);
  RETURN_IF_ERROR(be->Rotary(N, T(), NH() + NKV(), hs(), Wqkv(), cos_table(), sin_table(),
                             true, dqkv));
  ASSIGN_OR_RETURN(Real * dh1, s.New(be, kDh1, NC));
  RETURN_IF_ERROR(this->MatmulByParam(N, C(), Wqkv(), dqkv, P::kQProj, false, dh1));
  RETURN_IF_ERROR(be->Copy(grad_input, dx2, BytesOf<Real>(NC)));
  return be->RmsNormBackward(N, C(), dh1, x, W(P::kInputNorm), s.get(kRstd1), grad_input,
                             nullptr);
}

template <typename Real>
absl::Status LlamaBlockLayer<Real>::BackwardWeight(Stash<Real>& s) {
  BackendT<Real>* be = this->backend_;
  const int N = s.rows() * T();
  const Real* x = static_cast<const Real*>(s.input());
  RETURN_IF_ERROR(WeightGradient(s, kM, C(), F(), N, s.get(kDy), P::kDownProj));
  RETURN_IF_ERROR(WeightGradient(s, kH2, 2 * F(), C(), N, s.get(kDgu), P::kGateProj));
  RETURN_IF_ERROR(be->RmsNormBackward(N, C(), s.get(kDh2), s.get(kX2), W(P::kPostNorm),
                                      s.get(kRstd2), nullptr, G(P::kPostNorm)));
  RETURN_IF_ERROR(WeightGradient(s, kAtt, C(), C(), N, s.get(kDx2), P::kOProj));
  RETURN_IF_ERROR(WeightGradient(s, kH1, Wqkv(), C(), N, s.get(kDqkv), P::kQProj));
  RETURN_IF_ERROR(be->RmsNormBackward(N, C(), s.get(kDh1), x, W(P::kInputNorm), s.get(kRstd1),
                                      nullptr, G(P::kInputNorm)));
  s.Clear();
  return absl::OkStatus();
}

// ---- Generation -------------------------------------------------------------------------

template <typename Real>
absl::StatusOr<std::unique_ptr<typename BlockLayer<Real>::Cache>> LlamaBlockLayer<Real>::NewCache() {
  BackendT<Real>* be = this->backend_;
  auto c = std::make_unique<Cache>();
  auto make = [&](BackendBuffer<Real>& b, int64_t n) -> absl::Status {
    ASSIGN_OR_RETURN(b, BackendBuffer<Real>::Elements(be, n));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(make(c->kv, 2 * int64_t{NKV()} * T() * hs()));
  RETURN_IF_ERROR(make(c->h, C()));
  RETURN_IF_ERROR(make(c->rstd, 1));
  RETURN_IF_ERROR(make(c->qkv, Wqkv()));
  RETURN_IF_ERROR(make(c->scores, int64_t{NH()} * T()));
  RETURN_IF_ERROR(make(c->att, C()));
  RETURN_IF_ERROR(make(c->x2, C()));
  RETURN_IF_ERROR(make(c->gu, 2 * int64_t{F()}));
  RETURN_IF_ERROR(make(c->m, F()));
  return std::unique_ptr<typename BlockLayer<Real>::Cache>(std::move(c));
}

template <typename Real>
absl::Status LlamaBlockLayer<Real>::DecodePosition(typename BlockLayer<Real>::Cache& cache,
                                                   int position, Real* x) {
  auto& c = static_cast<Cache&>(cache);
  // One position: the two norms share their buffers.
  const Activations a{c.h.data(), c.rstd.data(), c.qkv.data(), c.att.data(), c.x2.data(),
                      c.h.data(), c.rstd.data(), c.gu.data(),  c.m.data()};
  return ForwardRows(1, 1, position, x, a, x, [&](const Real* qkv, Real* att) {
    return AttendToCache(c, position, qkv, att);
  });
}

// Position t's queries over the cached positions 0..t, its own keys and values added to
// the cache first; query head h reads key/value head h / (NH / NKV).
template <typename Real>
absl::Status LlamaBlockLayer<Real>::AttendToCache(Cache& c, int t, const Real* qkv, Real* att) {
  BackendT<Real>* be = this->backend_;
  const int n = t + 1, group = NH() / NKV();
  const int64_t head_rows = int64_t{T()} * hs();
  Real* keys = c.kv.data();                       // (NKV, T, hs)
  Real* values = keys + int64_t{NKV()} * head_rows;  // (NKV, T, hs)
  RETURN_IF_ERROR(be->Copy2D(2 * NKV(), hs(), qkv + C(), hs(), keys + int64_t{t} * hs(), head_rows));
  const Real scale = static_cast<Real>(1.0 / std::sqrt(static_cast<double>(hs())));
  Real* scores = c.scores.data();  // (NH, n)
  for (int h = 0; h < NH(); ++h) {
    RETURN_IF_ERROR(be->Matmul(false, true, 1, n, hs(), scale, qkv + h * hs(),
                               keys + (h / group) * head_rows, 0, scores + int64_t{h} * n));
  }
  RETURN_IF_ERROR(be->Softmax(NH(), n, scores, scores));
  for (int h = 0; h < NH(); ++h) {
    RETURN_IF_ERROR(be->Matmul(false, false, 1, hs(), n, 1, scores + int64_t{h} * n,
                               values + (h / group) * head_rows, 0, att + h * hs()));
  }
  return absl::OkStatus();
}

}  // namespace

template <typename Real>
absl::StatusOr<std::shared_ptr<const LlamaRotary<Real>>> LlamaRotary<Real>::Make(
    const model::TransformerConfig& config, BackendT<Real>* backend) {
  const model::RotaryTables t = model::MakeRotaryTables(config);
  auto r = std::make_shared<LlamaRotary>();
  for (auto [values, table] : {std::pair{&t.cos, &r->cos}, std::pair{&t.sin, &r->sin}}) {
    const std::vector<Real> rounded(values->begin(), values->end());
    ASSIGN_OR_RETURN(*table, BackendBuffer<Real>::Elements(backend, rounded.size()));
    RETURN_IF_ERROR(
        backend->CopyFromHost(table->data(), rounded.data(), BytesOf<Real>(rounded.size())));
  }
  return std::shared_ptr<const LlamaRotary>(std::move(r));
}

template <typename Real>
std::unique_ptr<PipelineLayer<Real>> MakeLlamaBlock(
    const model::TransformerConfig& config, int index, BackendT<Real>* backend,
    std::shared_ptr<const LlamaRotary<Real>> rotary) {
  return std::make_unique<LlamaBlockLayer<Real>>(config, index, backend, std::move(rotary));
}

template struct LlamaRotary<float>;
template struct LlamaRotary<double>;
template std::unique_ptr<PipelineLayer<float>> MakeLlamaBlock(
    const model::TransformerConfig&, int, BackendT<float>*,
    std::shared_ptr<const LlamaRotary<float>>);
template std::unique_ptr<PipelineLayer<double>> MakeLlamaBlock(
    const model::TransformerConfig&, int, BackendT<double>*,
    std::shared_ptr<const LlamaRotary<double>>);

}  // namespace pipetrain::compute
