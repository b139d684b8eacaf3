#include "stage_server/compute/kv_cache_decoder.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "stage_server/compute/gpt_layers.h"

namespace pipetrain::compute {
namespace {

// The model's own words for a chunk that is not the whole model.
template <typename Real>
absl::Status RequireWholeModel(const ModelChunkT<Real>& model, const char* who) {
  if (model.has_embedding() && model.has_head()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(who, " needs the whole model; the chunk holds pipeline layers [", model.begin(),
                   ", ", model.end(), ") of ", model.config().num_pipeline_layers()));
}

absl::Status CheckToken(int32_t token, int V, int64_t position) {
  if (token >= 0 && token < V) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("token ", token, " at position ", position,
                                                 " is outside the vocabulary [0, ", V, ")"));
}

// Parameter `name` of `layer`, by its Hugging Face name: the layers' own order is theirs.
template <typename Real>
absl::StatusOr<const Real*> FindParam(const PipelineLayer<Real>& layer, const std::string& name) {
  for (size_t i = 0; i < layer.specs().size(); ++i) {
    if (layer.specs()[i].name == name) return layer.param(static_cast<int>(i));
  }
  return absl::InternalError(
      absl::StrCat(model::LayerName(layer.config(), layer.index()), " has no parameter ", name));
}

template <typename Real>
absl::StatusOr<BackendBuffer<Real>> Buffer(BackendT<Real>* be, int64_t elements) {
  return BackendBuffer<Real>::Allocate(be, elements * sizeof(Real));
}

// ln_f's weight and bias and lm_head (V, C): what next-token logits need of the head.
template <typename Real>
struct HeadParams {
  const Real *lnf_w, *lnf_b, *lm_head;
};

template <typename Real>
absl::StatusOr<HeadParams<Real>> HeadParamsOf(ModelChunkT<Real>& model) {
  const PipelineLayer<Real>& head = model.layer(model.config().num_pipeline_layers() - 1);
  HeadParams<Real> p;
  ASSIGN_OR_RETURN(p.lnf_w, FindParam(head, "transformer.ln_f.weight"));
  ASSIGN_OR_RETURN(p.lnf_b, FindParam(head, "transformer.ln_f.bias"));
  ASSIGN_OR_RETURN(p.lm_head, FindParam(head, model::kOutputHeadName));
  return p;
}

// The head without the loss: ln (rows, C) = ln_f(x), out (rows, V) = ln @ lm_head^T,
// copied to `logits` on the host. stats (2 rows) takes LayerNorm's mean and rstd.
template <typename Real>
absl::Status HeadForward(BackendT<Real>* be, const model::GptConfig& c, int rows, const Real* x,
                         const HeadParams<Real>& p, Real* ln, Real* stats, Real* out,
                         std::vector<Real>* logits) {
  const int C = c.d_model, V = c.vocab_size;
  RETURN_IF_ERROR(be->LayerNormForward(rows, C, x, p.lnf_w, p.lnf_b, ln, stats, stats + rows));
  RETURN_IF_ERROR(be->Matmul(false, true, rows, V, C, 1, ln, p.lm_head, 0, out));
  logits->resize(static_cast<size_t>(rows) * V);
  return be->CopyToHost(logits->data(), out, logits->size() * sizeof(Real));
}

}  // namespace

// ---- The reference: the training path's forwards ---------------------------------------

template <typename Real>
absl::StatusOr<std::vector<Real>> Logits(ModelChunkT<Real>& model,
                                         std::span<const int32_t> tokens) {
  RETURN_IF_ERROR(RequireWholeModel(model, "Logits"));
  const model::GptConfig& c = model.config();
  const int n = static_cast<int>(tokens.size());
  if (n < 1 || n > c.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("Logits takes 1 to seq_len = ", c.seq_len, " tokens, not ", n));
  }
  for (int t = 0; t < n; ++t) RETURN_IF_ERROR(CheckToken(tokens[t], c.vocab_size, t));
  BackendT<Real>* be = model.backend();
  // One row of seq_len positions, the tail padded with the last token.
  std::vector<int32_t> row(tokens.begin(), tokens.end());
  row.resize(c.seq_len, tokens.back());
  ASSIGN_OR_RETURN(auto ids, BackendBuffer<Real>::Allocate(be, row.size() * sizeof(int32_t)));
  RETURN_IF_ERROR(be->CopyFromHost(ids.raw(), row.data(), row.size() * sizeof(int32_t)));
  const int64_t elements = int64_t{c.seq_len} * c.d_model;  // (T, C)
  ASSIGN_OR_RETURN(auto a, Buffer(be, elements));
  ASSIGN_OR_RETURN(auto b, Buffer(be, elements));
  Stash<Real> stash;
  RETURN_IF_ERROR(model.layer(0).Forward(1, ids.raw(), nullptr, a.data(), stash));
  for (int l = 1; l <= c.n_layers; ++l) {
    RETURN_IF_ERROR(model.layer(l).Forward(1, a.data(), nullptr, b.data(), stash));
    std::swap(a, b);
  }
  ASSIGN_OR_RETURN(const HeadParams<Real> head, HeadParamsOf(model));
  ASSIGN_OR_RETURN(auto stats, Buffer(be, 2 * int64_t{n}));           // mean, rstd (n)
  ASSIGN_OR_RETURN(auto out, Buffer(be, int64_t{n} * c.vocab_size));  // (n, V)
  std::vector<Real> logits;
  RETURN_IF_ERROR(
      HeadForward(be, c, n, a.data(), head, b.data(), stats.data(), out.data(), &logits));
  return logits;
}

// ---- The decoder ------------------------------------------------------------------------

template <typename Real>
absl::StatusOr<std::unique_ptr<KvCacheDecoderT<Real>>> KvCacheDecoderT<Real>::Create(
    ModelChunkT<Real>* model) {
  RETURN_IF_ERROR(RequireWholeModel(*model, "the key-value cache decoder"));
  std::unique_ptr<KvCacheDecoderT> d(new KvCacheDecoderT(model));
  RETURN_IF_ERROR(d->Init());
  return d;
}

template <typename Real>
absl::Status KvCacheDecoderT<Real>::Init() {
  const model::GptConfig& c = config_;
  BackendT<Real>* be = model_->backend();
  const int C = c.d_model;
  const PipelineLayer<Real>& embedding = model_->layer(0);
  ASSIGN_OR_RETURN(wte_, FindParam(embedding, model::kTokenEmbeddingName));
  ASSIGN_OR_RETURN(wpe_, FindParam(embedding, "transformer.wpe.weight"));
  ASSIGN_OR_RETURN(const HeadParams<Real> head, HeadParamsOf(*model_));
  lnf_w_ = head.lnf_w;
  lnf_b_ = head.lnf_b;
  lm_head_ = head.lm_head;
  for (int l = 1; l <= c.n_layers; ++l) {
    const PipelineLayer<Real>& layer = model_->layer(l);
    const std::string p = absl::StrCat("transformer.h.", l - 1, ".");
    BlockParams bp;
    for (auto [field, name] : {std::pair{&bp.ln1_w, "ln_1.weight"},
                               {&bp.ln1_b, "ln_1.bias"},
                               {&bp.attn_w, "attn.c_attn.weight"},
                               {&bp.attn_b, "attn.c_attn.bias"},
                               {&bp.proj_w, "attn.c_proj.weight"},
                               {&bp.proj_b, "attn.c_proj.bias"},
                               {&bp.ln2_w, "ln_2.weight"},
                               {&bp.ln2_b, "ln_2.bias"},
                               {&bp.fc_w, "mlp.c_fc.weight"},
                               {&bp.fc_b, "mlp.c_fc.bias"},
                               {&bp.mlp_w, "mlp.c_proj.weight"},
                               {&bp.mlp_b, "mlp.c_proj.bias"}}) {
      ASSIGN_OR_RETURN(*field, FindParam(layer, p + name));
    }
    blocks_.push_back(bp);
    ASSIGN_OR_RETURN(kv_.emplace_back(), Buffer(be, 2 * int64_t{c.seq_len} * C));
  }
  ASSIGN_OR_RETURN(token_, BackendBuffer<Real>::Allocate(be, sizeof(int32_t)));
  ASSIGN_OR_RETURN(x_, Buffer(be, C));
  ASSIGN_OR_RETURN(ln_, Buffer(be, C));
  ASSIGN_OR_RETURN(stats_, Buffer(be, 2));
  ASSIGN_OR_RETURN(qkv_, Buffer(be, 3 * C));
  ASSIGN_OR_RETURN(scores_, Buffer(be, int64_t{c.n_heads} * c.seq_len));
  ASSIGN_OR_RETURN(att_, Buffer(be, C));
  ASSIGN_OR_RETURN(x2_, Buffer(be, C));
  ASSIGN_OR_RETURN(fc_, Buffer(be, c.mlp_dim()));
  ASSIGN_OR_RETURN(logits_, Buffer(be, c.vocab_size));
  return absl::OkStatus();
}

template <typename Real>
absl::Status KvCacheDecoderT<Real>::Feed(int32_t token, std::vector<Real>* logits) {
  const model::GptConfig& c = config_;
  if (position_ >= c.seq_len) {
    return absl::OutOfRangeError(
        absl::StrCat("the key-value cache is full: it holds seq_len = ", c.seq_len,
                     " positions (the model has no position embedding past them); Reset and feed a "
                     "shorter context"));
  }
  RETURN_IF_ERROR(CheckToken(token, c.vocab_size, position_));
  BackendT<Real>* be = model_->backend();
  RETURN_IF_ERROR(be->CopyFromHost(token_.raw(), &token, sizeof(token)));
  // x = wte[token] + wpe[t]: a one-position embedding whose position table starts at t.
  RETURN_IF_ERROR(be->EmbeddingForward(1, 1, c.d_model, c.vocab_size, token_.ints(), wte_,
                                       wpe_ + int64_t{position_} * c.d_model, x_.data()));
  for (int b = 0; b < c.n_layers; ++b) RETURN_IF_ERROR(RunBlock(b));
  ++position_;
  return logits == nullptr ? absl::OkStatus() : RunHead(logits);
}

// x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)), for the one position t, the attention
// reading the keys and values of positions 0..t from the cache.
template <typename Real>
absl::Status KvCacheDecoderT<Real>::RunBlock(int block) {
  BackendT<Real>* be = model_->backend();
  const BlockParams& p = blocks_[block];
  const int C = config_.d_model, NH = config_.n_heads, hs = config_.head_dim();
  const int T = config_.seq_len, F = config_.mlp_dim(), t = position_, n = t + 1;
  Real* x = x_.data();
  Real* ln = ln_.data();
  Real* qkv = qkv_.data();
  Real* mean = stats_.data();
  Real* rstd = stats_.data() + 1;
  RETURN_IF_ERROR(be->LayerNormForward(1, C, x, p.ln1_w, p.ln1_b, ln, mean, rstd));
  RETURN_IF_ERROR(be->Matmul(false, false, 1, 3 * C, C, 1, ln, p.attn_w, 0, qkv));
  RETURN_IF_ERROR(be->AddBias(1, 3 * C, p.attn_b, qkv));
  // The 2 NH head rows of k|v (each hs wide, contiguous in qkv after q) go to row t of
  // their head's (T, hs) matrix in the cache.
  Real* keys = kv_[block].data();              // (NH, T, hs)
  Real* values = keys + int64_t{NH} * T * hs;  // (NH, T, hs)
  RETURN_IF_ERROR(be->Copy2D(2 * NH, hs, qkv + C, hs, keys + int64_t{t} * hs, int64_t{T} * hs));
  // Per head: scores (1, n) = q k^T / sqrt(hs) over positions 0..t; softmax; out = p v.
  const Real scale = static_cast<Real>(1.0 / std::sqrt(static_cast<double>(hs)));
  Real* scores = scores_.data();  // (NH, n)
  for (int h = 0; h < NH; ++h) {
    RETURN_IF_ERROR(be->Matmul(false, true, 1, n, hs, scale, qkv + h * hs,
                               keys + int64_t{h} * T * hs, 0, scores + int64_t{h} * n));
  }
  RETURN_IF_ERROR(be->Softmax(NH, n, scores, scores));
  Real* att = att_.data();
  for (int h = 0; h < NH; ++h) {
    RETURN_IF_ERROR(be->Matmul(false, false, 1, hs, n, 1, scores + int64_t{h} * n,
                               values + int64_t{h} * T * hs, 0, att + h * hs));
  }
  Real* x2 = x2_.data();
  RETURN_IF_ERROR(be->Matmul(false, false, 1, C, C, 1, att, p.proj_w, 0, x2));
  RETURN_IF_ERROR(be->AddBias(1, C, p.proj_b, x2));
  RETURN_IF_ERROR(be->Add(C, x2, x, x2));
  RETURN_IF_ERROR(be->LayerNormForward(1, C, x2, p.ln2_w, p.ln2_b, ln, mean, rstd));
  Real* fc = fc_.data();
  RETURN_IF_ERROR(be->Matmul(false, false, 1, F, C, 1, ln, p.fc_w, 0, fc));
  RETURN_IF_ERROR(be->AddBias(1, F, p.fc_b, fc));
  RETURN_IF_ERROR(be->GeluForward(F, fc, fc));
  RETURN_IF_ERROR(be->Matmul(false, false, 1, C, F, 1, fc, p.mlp_w, 0, x));
  RETURN_IF_ERROR(be->AddBias(1, C, p.mlp_b, x));
  return be->Add(C, x, x2, x);
}

template <typename Real>
absl::Status KvCacheDecoderT<Real>::RunHead(std::vector<Real>* logits) {
  return HeadForward(model_->backend(), config_, 1, x_.data(), {lnf_w_, lnf_b_, lm_head_},
                     ln_.data(), stats_.data(), logits_.data(), logits);
}

template absl::StatusOr<std::vector<float>> Logits(ModelChunkT<float>&, std::span<const int32_t>);
template absl::StatusOr<std::vector<double>> Logits(ModelChunkT<double>&, std::span<const int32_t>);
template class KvCacheDecoderT<float>;
template class KvCacheDecoderT<double>;

}  // namespace pipetrain::compute
