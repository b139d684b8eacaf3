#include "stage_server/compute/normed_head.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "stage_server/compute/backend_buffer.h"

namespace pipetrain::compute {

template <typename Real>
absl::Status NormedHeadLayer<Real>::Forward(int B, const void* input, const int32_t* targets,
                                            Real* output, Stash<Real>& s) {
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
  ASSIGN_OR_RETURN(Real * stats, s.New(be, kStats, int64_t{stats_per_row_} * N));
  ASSIGN_OR_RETURN(Real * probs, s.New(be, kProbs, int64_t{N} * V));  // (N, V)
  // The norm's output (N, C) is read again only by lm_head's weight-gradient product:
  // with product copies the stash keeps its copy and its values live for this forward only.
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
  // Logits are computed in place of the probabilities they turn into.
  RETURN_IF_ERROR(LogitsRows(N, static_cast<const Real*>(input), h, stats, probs, h_copy));
  return be->CrossEntropyForward(N, V, probs, tgt, probs, output);
}

template <typename Real>
absl::Status NormedHeadLayer<Real>::Logits(int rows, const Real* x, Real* logits) {
  BackendT<Real>* be = this->backend_;
  const int64_t C = this->config_.d_model;
  ASSIGN_OR_RETURN(auto h, BackendBuffer<Real>::Elements(be, rows * C));  // (rows, C)
  ASSIGN_OR_RETURN(auto stats, BackendBuffer<Real>::Elements(be, int64_t{stats_per_row_} * rows));
  return LogitsRows(rows, x, h.data(), stats.data(), logits);
}

template <typename Real>
absl::Status NormedHeadLayer<Real>::BackwardInput(Stash<Real>& s, const Real*, Real loss_grad,
                                                  Real* grad_input) {
  BackendT<Real>* be = this->backend_;
  const int C = this->config_.d_model, V = this->config_.vocab_size;
  const int N = s.rows() * this->config_.seq_len;
  Real* dlogits = s.get(kProbs);  // (N, V) replaces the probabilities
  RETURN_IF_ERROR(be->CrossEntropyBackward(N, V, dlogits, s.ints(kTargets),
                                           loss_grad / static_cast<Real>(N), dlogits));
  ASSIGN_OR_RETURN(Real * dh, s.New(be, kDh, int64_t{N} * C));  // (N, C)
  RETURN_IF_ERROR(this->MatmulByParam(N, C, V, dlogits, lm_head_, false, dh));
  RETURN_IF_ERROR(be->Zero(grad_input, BytesOf<Real>(int64_t{N} * C)));
  return NormBackwardInput(N, dh, static_cast<const Real*>(s.input()), s.get(kStats),
                           grad_input);
}

template <typename Real>
absl::Status NormedHeadLayer<Real>::BackwardWeight(Stash<Real>& s) {
  BackendT<Real>* be = this->backend_;
  const int C = this->config_.d_model, V = this->config_.vocab_size;
  const int N = s.rows() * this->config_.seq_len;
  Real* dlm_head = this->grad(lm_head_);
  if (this->product_copies()) {
    RETURN_IF_ERROR(be->MatmulByCopy(true, false, V, C, N, 1, Values<Real>(s.get(kProbs)),
                                     CopyOf<Real>(s.raw(kH)), 1, dlm_head));
  } else {
    RETURN_IF_ERROR(be->Matmul(true, false, V, C, N, 1, s.get(kProbs), s.get(kH), 1, dlm_head));
  }
  RETURN_IF_ERROR(NormBackwardWeight(N, s.get(kDh), static_cast<const Real*>(s.input()),
                                     s.get(kStats)));
  s.Clear();
  return absl::OkStatus();
}

template <typename Real>
absl::Status NormedHeadLayer<Real>::LogitsRows(int rows, const Real* x, Real* h, Real* stats,
                                               Real* out, void* h_copy) {
  const int C = this->config_.d_model, V = this->config_.vocab_size;
  RETURN_IF_ERROR(NormForward(rows, x, h, stats));
  if (h_copy != nullptr) {
    RETURN_IF_ERROR(this->backend_->MakeProductCopy(int64_t{rows} * C, h, h_copy));
  }
  return this->MatmulByParam(rows, V, C, h, lm_head_, true, out, h_copy);
}

template class NormedHeadLayer<float>;
template class NormedHeadLayer<double>;

}  // namespace pipetrain::compute
