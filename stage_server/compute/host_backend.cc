#include "stage_server/compute/host_backend.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status_macros.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/op_checks.h"
#include "stage_server/compute/reference_ops.h"

namespace pipetrain::compute {

template <typename Real>
std::string HostBackendT<Real>::Name() const {
  return sizeof(Real) == 8 ? "host-double" : "host";
}

template <typename Real>
absl::StatusOr<void*> HostBackendT<Real>::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  // 64-byte alignment suits AVX-512 loads and OpenBLAS; aligned_alloc wants a multiple.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Name(), " backend: cannot allocate ", bytes, " bytes"));
  }
  return p;
}

template <typename Real>
absl::Status HostBackendT<Real>::Free(void* ptr) {
  std::free(ptr);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Zero(void* ptr, size_t bytes) {
  if (bytes > 0) std::memset(ptr, 0, bytes);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::CopyFromHost(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memmove(dst, src, bytes);
  return absl::OkStatus();
}

// Every op: the shared argument check (op_checks.h), nothing more for an empty call,
// then the plain loop.

template <typename Real>
absl::Status HostBackendT<Real>::Copy2D(int rows, int cols, const Real* src, int64_t src_stride,
                                        Real* dst, int64_t dst_stride) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCopy2D(Name(), rows, cols, src, src_stride, dst, dst_stride));
  if (!call.empty()) reference::Copy2D(rows, cols, src, src_stride, dst, dst_stride);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Matmul(bool trans_a, bool trans_b, int m, int n, int k,
                                        Real alpha, const Real* a, const Real* b,
                                        Real beta, Real* c) {
  ASSIGN_OR_RETURN(const OpCall call, CheckMatmul(Name(), m, n, k, a, b, c));
  if (!call.empty()) {
    reference::Matmul(trans_a, trans_b, m, n, k, alpha, a, b, beta, c, this->bf16_products());
  }
  return absl::OkStatus();
}

template <typename Real>
int64_t HostBackendT<Real>::ProductCopyBytes(int64_t n) const {
  return this->bf16_products() ? n * static_cast<int64_t>(common::DTypeSize(common::DType::kBF16))
                               : 0;
}

template <typename Real>
absl::Status HostBackendT<Real>::MakeProductCopy(int64_t n, const Real* x, void* copy) {
  ASSIGN_OR_RETURN(const OpCall call, CheckMakeProductCopy(Name(), n, x, copy));
  if (!this->bf16_products()) return ProductCopyWithoutBf16(Name(), call);
  if (call.empty()) return absl::OkStatus();
  auto* out = static_cast<uint16_t*>(copy);
  for (int64_t i = 0; i < n; ++i) out[i] = common::FloatToBf16Bits(static_cast<float>(x[i]));
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::MatmulByCopy(bool trans_a, bool trans_b, int m, int n, int k,
                                              Real alpha, ProductOperand<Real> a,
                                              ProductOperand<Real> b, Real beta, Real* c) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckMatmulByCopy(Name(), m, n, k, a.data(), b.data(), c));
  if (!this->bf16_products()) return ProductCopyWithoutBf16(Name(), call);
  if (call.empty()) return absl::OkStatus();
  // An operand's values, its copy widened when it comes as one (a (m, k), b (k, n), dense).
  std::vector<Real> wide_a, wide_b;
  const auto values = [](const ProductOperand<Real>& o, int64_t elements,
                         std::vector<Real>& wide) -> const Real* {
    if (o.copy == nullptr || elements == 0) return o.values;
    const auto* bits = static_cast<const uint16_t*>(o.copy);
    wide.resize(static_cast<size_t>(elements));
    for (int64_t i = 0; i < elements; ++i) wide[i] = common::Bf16BitsToFloat(bits[i]);
    return wide.data();
  };
  reference::Matmul(trans_a, trans_b, m, n, k, alpha, values(a, int64_t{m} * k, wide_a),
                    values(b, int64_t{k} * n, wide_b), beta, c, /*bf16_operands=*/true);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Add(int64_t n, const Real* a, const Real* b, Real* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAdd(Name(), n, a, b, out));
  if (!call.empty()) reference::Add(n, a, b, out);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Axpy(int64_t n, Real alpha, const Real* x, Real* y) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAxpy(Name(), n, x, y));
  if (!call.empty()) reference::Axpy(n, alpha, x, y);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Scale(int64_t n, Real alpha, Real* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckScale(Name(), n, x));
  if (!call.empty()) reference::Scale(n, alpha, x);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::RoundToBf16(int64_t n, Real* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckRoundToBf16(Name(), n, x));
  if (!call.empty()) reference::RoundToBf16(n, x);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::AddBias(int rows, int cols, const Real* bias, Real* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAddBias(Name(), rows, cols, bias, x));
  if (!call.empty()) reference::AddBias(rows, cols, bias, x);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::BiasGrad(int rows, int cols, const Real* dout,
                                          Real* dbias) {
  ASSIGN_OR_RETURN(const OpCall call, CheckBiasGrad(Name(), rows, cols, dout, dbias));
  if (!call.empty()) reference::BiasGrad(rows, cols, dout, dbias);
  return absl::OkStatus();
}

template <typename Real>
absl::StatusOr<double> HostBackendT<Real>::SumOfSquares(int64_t n, const Real* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSumOfSquares(Name(), n, x));
  if (call.empty()) return 0.0;
  return reference::SumOfSquares(n, x);
}

template <typename Real>
absl::Status HostBackendT<Real>::EmbeddingForward(int B, int T, int C, int V,
                                                  const int32_t* tokens, const Real* wte,
                                                  const Real* wpe, Real* out) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckEmbeddingForward(Name(), B, T, C, V, tokens, wte, wpe, out));
  if (call.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckHostIds(Name(), call, "tokens", tokens, int64_t{B} * T, V));
  reference::EmbeddingForward(B, T, C, V, tokens, wte, wpe, out);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::EmbeddingBackward(int B, int T, int C, int V,
                                                   const int32_t* tokens,
                                                   const Real* dout, Real* dwte,
                                                   Real* dwpe) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckEmbeddingBackward(Name(), B, T, C, V, tokens, dout, dwte, dwpe));
  if (call.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckHostIds(Name(), call, "tokens", tokens, int64_t{B} * T, V));
  reference::EmbeddingBackward(B, T, C, V, tokens, dout, dwte, dwpe);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::LayerNormForward(int rows, int C, const Real* x,
                                                  const Real* weight, const Real* bias,
                                                  Real* out, Real* mean, Real* rstd) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckLayerNormForward(Name(), rows, C, x, weight, bias, out, mean, rstd));
  if (!call.empty()) reference::LayerNormForward(rows, C, x, weight, bias, out, mean, rstd);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::LayerNormBackward(int rows, int C, const Real* dout,
                                                   const Real* x, const Real* weight,
                                                   const Real* mean, const Real* rstd,
                                                   Real* dx, Real* dweight, Real* dbias) {
  ASSIGN_OR_RETURN(const OpCall call, CheckLayerNormBackward(Name(), rows, C, dout, x, weight, mean,
                                                             rstd, dx, dweight, dbias));
  if (!call.empty()) {
    reference::LayerNormBackward(rows, C, dout, x, weight, mean, rstd, dx, dweight, dbias);
  }
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::GeluForward(int64_t n, const Real* x, Real* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluForward(Name(), n, x, out));
  if (!call.empty()) reference::GeluForward(n, x, out);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::GeluBackward(int64_t n, const Real* x, const Real* dout,
                                              Real* dx) {
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluBackward(Name(), n, x, dout, dx));
  if (!call.empty()) reference::GeluBackward(n, x, dout, dx);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::AttentionForward(int B, int T, int C, int NH,
                                                  const Real* qkv, Real* out,
                                                  Real* probs) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAttentionForward(Name(), B, T, C, NH, qkv, out, probs));
  if (!call.empty()) {
    reference::AttentionForward(B, T, C, NH, qkv, out, probs, this->bf16_products());
  }
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::AttentionBackward(int B, int T, int C, int NH,
                                                   const Real* dout, const Real* qkv,
                                                   const Real* probs, Real* dqkv) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckAttentionBackward(Name(), B, T, C, NH, dout, qkv, probs, dqkv));
  if (!call.empty()) {
    reference::AttentionBackward(B, T, C, NH, dout, qkv, probs, dqkv, this->bf16_products());
  }
  return absl::OkStatus();
}

// ---- Llama --------------------------------------------------------------------------

template <typename Real>
absl::Status HostBackendT<Real>::RmsNormForward(int rows, int C, float eps, const Real* x,
                                                const Real* weight, Real* out, Real* rstd) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRmsNormForward(Name(), rows, C, eps, x, weight, out, rstd));
  if (!call.empty()) reference::RmsNormForward(rows, C, eps, x, weight, out, rstd);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::RmsNormBackward(int rows, int C, const Real* dout,
                                                 const Real* x, const Real* weight,
                                                 const Real* rstd, Real* dx, Real* dweight) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRmsNormBackward(Name(), rows, C, dout, x, weight, rstd, dx, dweight));
  if (!call.empty()) reference::RmsNormBackward(rows, C, dout, x, weight, rstd, dx, dweight);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Rotary(int rows, int T, int heads, int hs, int64_t stride,
                                        const Real* cos, const Real* sin, bool inverse,
                                        Real* x) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRotary(Name(), rows, T, heads, hs, stride, cos, sin, x));
  if (!call.empty()) reference::Rotary(rows, T, heads, hs, stride, cos, sin, inverse, x);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::SwiGluForward(int rows, int F, const Real* gu, Real* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSwiGluForward(Name(), rows, F, gu, out));
  if (!call.empty()) reference::SwiGluForward(rows, F, gu, out);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::SwiGluBackward(int rows, int F, const Real* gu,
                                                const Real* dout, Real* dgu) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSwiGluBackward(Name(), rows, F, gu, dout, dgu));
  if (!call.empty()) reference::SwiGluBackward(rows, F, gu, dout, dgu);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::RepeatKv(int rows, int NH, int NKV, int hs, const Real* qkv,
                                          Real* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckRepeatKv(Name(), rows, NH, NKV, hs, qkv, out));
  if (!call.empty()) reference::RepeatKv(rows, NH, NKV, hs, qkv, out);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::SumKvGroups(int rows, int NH, int NKV, int hs,
                                             const Real* dfull, Real* dqkv) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSumKvGroups(Name(), rows, NH, NKV, hs, dfull, dqkv));
  if (!call.empty()) reference::SumKvGroups(rows, NH, NKV, hs, dfull, dqkv);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Softmax(int rows, int cols, const Real* x, Real* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSoftmax(Name(), rows, cols, x, out));
  if (!call.empty()) reference::Softmax(rows, cols, x, out);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::CrossEntropyForward(int rows, int V, const Real* logits,
                                                     const int32_t* targets, Real* probs,
                                                     Real* loss) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCrossEntropyForward(Name(), rows, V, logits, targets, probs, loss));
  RETURN_IF_ERROR(CheckHostIds(Name(), call, "targets", targets, rows, V));
  reference::CrossEntropyForward(rows, V, logits, targets, probs, loss);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::CrossEntropyBackward(int rows, int V, const Real* probs,
                                                      const int32_t* targets,
                                                      Real dloss_scale, Real* dlogits) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCrossEntropyBackward(Name(), rows, V, probs, targets, dlogits));
  if (call.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckHostIds(Name(), call, "targets", targets, rows, V));
  reference::CrossEntropyBackward(rows, V, probs, targets, dloss_scale, dlogits);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::AdamW(int64_t n, Real* param, const Real* grad, Real* m,
                                       Real* v, float lr, float beta1, float beta2,
                                       float eps, float weight_decay, int step) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAdamW(Name(), n, param, grad, m, v, step));
  if (!call.empty()) {
    reference::AdamW(n, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step);
  }
  return absl::OkStatus();
}

template class HostBackendT<float>;
template class HostBackendT<double>;

}  // namespace pipetrain::compute
