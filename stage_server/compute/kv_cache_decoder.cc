#include "stage_server/compute/kv_cache_decoder.h"

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

// The head's logits (rows, V) of x (rows, C), copied to `logits` on the host; `out` holds
// them in backend memory.
template <typename Real>
absl::Status HostLogits(ModelChunkT<Real>& model, int rows, const Real* x, Real* out,
                        std::vector<Real>* logits) {
  RETURN_IF_ERROR(model.head().Logits(rows, x, out));
  logits->resize(static_cast<size_t>(rows) * model.config().vocab_size);
  return model.backend()->CopyToHost(logits->data(), out, BytesOf<Real>(logits->size()));
}

}  // namespace

// ---- The reference: the training path's forwards ---------------------------------------

template <typename Real>
absl::StatusOr<std::vector<Real>> Logits(ModelChunkT<Real>& model,
                                         std::span<const int32_t> tokens) {
  RETURN_IF_ERROR(RequireWholeModel(model, "Logits"));
  const model::TransformerConfig& c = model.config();
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
  ASSIGN_OR_RETURN(auto ids, BackendBuffer<Real>::template Elements<int32_t>(be, row.size()));
  RETURN_IF_ERROR(be->CopyFromHost(ids.raw(), row.data(), BytesOf<int32_t>(row.size())));
  const int64_t elements = int64_t{c.seq_len} * c.d_model;  // (T, C)
  ASSIGN_OR_RETURN(auto a, BackendBuffer<Real>::Elements(be, elements));
  ASSIGN_OR_RETURN(auto b, BackendBuffer<Real>::Elements(be, elements));
  Stash<Real> stash;
  RETURN_IF_ERROR(model.layer(0).Forward(1, ids.raw(), nullptr, a.data(), stash));
  for (int l = 1; l <= c.n_layers; ++l) {
    RETURN_IF_ERROR(model.layer(l).Forward(1, a.data(), nullptr, b.data(), stash));
    std::swap(a, b);
  }
  ASSIGN_OR_RETURN(auto out, BackendBuffer<Real>::Elements(be, int64_t{n} * c.vocab_size));
  std::vector<Real> logits;
  RETURN_IF_ERROR(HostLogits(model, n, a.data(), out.data(), &logits));
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
  BackendT<Real>* be = model_->backend();
  for (int b = 0; b < config_.n_layers; ++b) {
    ASSIGN_OR_RETURN(caches_.emplace_back(), model_->block(b).NewCache());
  }
  ASSIGN_OR_RETURN(token_, BackendBuffer<Real>::template Elements<int32_t>(be, 1));
  ASSIGN_OR_RETURN(x_, BackendBuffer<Real>::Elements(be, config_.d_model));
  ASSIGN_OR_RETURN(logits_, BackendBuffer<Real>::Elements(be, config_.vocab_size));
  return absl::OkStatus();
}

template <typename Real>
absl::Status KvCacheDecoderT<Real>::Feed(int32_t token, std::vector<Real>* logits) {
  const model::TransformerConfig& c = config_;
  if (position_ >= c.seq_len) {
    return absl::OutOfRangeError(
        absl::StrCat("the key-value cache is full: it holds seq_len = ", c.seq_len,
                     " positions (the model has no position embedding past them); Reset and feed a "
                     "shorter context"));
  }
  RETURN_IF_ERROR(CheckToken(token, c.vocab_size, position_));
  RETURN_IF_ERROR(model_->backend()->CopyFromHost(token_.raw(), &token, BytesOf<int32_t>(1)));
  RETURN_IF_ERROR(model_->embedding().EmbedPosition(token_.ints(), position_, x_.data()));
  for (int b = 0; b < c.n_layers; ++b) {
    RETURN_IF_ERROR(model_->block(b).DecodePosition(*caches_[b], position_, x_.data()));
  }
  ++position_;
  if (logits == nullptr) return absl::OkStatus();
  return HostLogits(*model_, 1, x_.data(), logits_.data(), logits);
}

template absl::StatusOr<std::vector<float>> Logits(ModelChunkT<float>&, std::span<const int32_t>);
template absl::StatusOr<std::vector<double>> Logits(ModelChunkT<double>&, std::span<const int32_t>);
template class KvCacheDecoderT<float>;
template class KvCacheDecoderT<double>;

}  // namespace pipetrain::compute
