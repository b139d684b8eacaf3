#include "stage_server/compute/host_backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "stage_server/compute/reference_ops.h"

namespace pipetrain::compute {

namespace {
// Shape checks shared by the ops: a negative size is a caller bug that would otherwise
// turn into a wild write.
absl::Status CheckSizes(const char* op, std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes) {
    if (s < 0) return absl::InvalidArgumentError(absl::StrCat(op, ": negative size ", s));
  }
  return absl::OkStatus();
}
}  // namespace

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

template <typename Real>
absl::Status HostBackendT<Real>::Matmul(bool trans_a, bool trans_b, int m, int n, int k,
                                        Real alpha, const Real* a, const Real* b,
                                        Real beta, Real* c) {
  if (absl::Status s = CheckSizes("Matmul", {m, n, k}); !s.ok()) return s;
  reference::Matmul(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Add(int64_t n, const Real* a, const Real* b, Real* out) {
  if (absl::Status s = CheckSizes("Add", {n}); !s.ok()) return s;
  reference::Add(n, a, b, out);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Axpy(int64_t n, Real alpha, const Real* x, Real* y) {
  if (absl::Status s = CheckSizes("Axpy", {n}); !s.ok()) return s;
  reference::Axpy(n, alpha, x, y);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::Scale(int64_t n, Real alpha, Real* x) {
  if (absl::Status s = CheckSizes("Scale", {n}); !s.ok()) return s;
  reference::Scale(n, alpha, x);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::AddBias(int rows, int cols, const Real* bias, Real* x) {
  if (absl::Status s = CheckSizes("AddBias", {rows, cols}); !s.ok()) return s;
  reference::AddBias(rows, cols, bias, x);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::BiasGrad(int rows, int cols, const Real* dout,
                                          Real* dbias) {
  if (absl::Status s = CheckSizes("BiasGrad", {rows, cols}); !s.ok()) return s;
  reference::BiasGrad(rows, cols, dout, dbias);
  return absl::OkStatus();
}

template <typename Real>
absl::StatusOr<double> HostBackendT<Real>::SumOfSquares(int64_t n, const Real* x) {
  if (absl::Status s = CheckSizes("SumOfSquares", {n}); !s.ok()) return s;
  return reference::SumOfSquares(n, x);
}

template <typename Real>
absl::Status HostBackendT<Real>::EmbeddingForward(int B, int T, int C, int V,
                                                  const int32_t* tokens, const Real* wte,
                                                  const Real* wpe, Real* out) {
  if (absl::Status s = CheckSizes("EmbeddingForward", {B, T, C, V}); !s.ok()) return s;
  return reference::EmbeddingForward(B, T, C, V, tokens, wte, wpe, out);
}

template <typename Real>
absl::Status HostBackendT<Real>::EmbeddingBackward(int B, int T, int C, int V,
                                                   const int32_t* tokens,
                                                   const Real* dout, Real* dwte,
                                                   Real* dwpe) {
  if (absl::Status s = CheckSizes("EmbeddingBackward", {B, T, C, V}); !s.ok()) return s;
  return reference::EmbeddingBackward(B, T, C, V, tokens, dout, dwte, dwpe);
}

template <typename Real>
absl::Status HostBackendT<Real>::LayerNormForward(int rows, int C, const Real* x,
                                                  const Real* weight, const Real* bias,
                                                  Real* out, Real* mean, Real* rstd) {
  if (absl::Status s = CheckSizes("LayerNormForward", {rows, C}); !s.ok()) return s;
  reference::LayerNormForward(rows, C, x, weight, bias, out, mean, rstd);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::LayerNormBackward(int rows, int C, const Real* dout,
                                                   const Real* x, const Real* weight,
                                                   const Real* mean, const Real* rstd,
                                                   Real* dx, Real* dweight, Real* dbias) {
  if (absl::Status s = CheckSizes("LayerNormBackward", {rows, C}); !s.ok()) return s;
  reference::LayerNormBackward(rows, C, dout, x, weight, mean, rstd, dx, dweight, dbias);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::GeluForward(int64_t n, const Real* x, Real* out) {
  if (absl::Status s = CheckSizes("GeluForward", {n}); !s.ok()) return s;
  reference::GeluForward(n, x, out);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::GeluBackward(int64_t n, const Real* x, const Real* dout,
                                              Real* dx) {
  if (absl::Status s = CheckSizes("GeluBackward", {n}); !s.ok()) return s;
  reference::GeluBackward(n, x, dout, dx);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::AttentionForward(int B, int T, int C, int NH,
                                                  const Real* qkv, Real* out,
                                                  Real* probs) {
  if (absl::Status s = CheckSizes("AttentionForward", {B, T, C, NH}); !s.ok()) return s;
  if (NH == 0 || C % NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttentionForward: heads ", NH, " must divide C ", C));
  }
  reference::AttentionForward(B, T, C, NH, qkv, out, probs);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::AttentionBackward(int B, int T, int C, int NH,
                                                   const Real* dout, const Real* qkv,
                                                   const Real* probs, Real* dqkv) {
  if (absl::Status s = CheckSizes("AttentionBackward", {B, T, C, NH}); !s.ok()) return s;
  if (NH == 0 || C % NH != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("AttentionBackward: heads ", NH, " must divide C ", C));
  }
  reference::AttentionBackward(B, T, C, NH, dout, qkv, probs, dqkv);
  return absl::OkStatus();
}

template <typename Real>
absl::Status HostBackendT<Real>::CrossEntropyForward(int rows, int V, const Real* logits,
                                                     const int32_t* targets, Real* probs,
                                                     Real* loss) {
  if (absl::Status s = CheckSizes("CrossEntropyForward", {rows, V}); !s.ok()) return s;
  return reference::CrossEntropyForward(rows, V, logits, targets, probs, loss);
}

template <typename Real>
absl::Status HostBackendT<Real>::CrossEntropyBackward(int rows, int V, const Real* probs,
                                                      const int32_t* targets,
                                                      Real dloss_scale, Real* dlogits) {
  if (absl::Status s = CheckSizes("CrossEntropyBackward", {rows, V}); !s.ok()) return s;
  return reference::CrossEntropyBackward(rows, V, probs, targets, dloss_scale, dlogits);
}

template <typename Real>
absl::Status HostBackendT<Real>::AdamW(int64_t n, Real* param, const Real* grad, Real* m,
                                       Real* v, float lr, float beta1, float beta2,
                                       float eps, float weight_decay, int step) {
  if (absl::Status s = CheckSizes("AdamW", {n}); !s.ok()) return s;
  if (step < 1)
    return absl::InvalidArgumentError(absl::StrCat("AdamW: step ", step, " < 1"));
  reference::AdamW(n, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, step);
  return absl::OkStatus();
}

template class HostBackendT<float>;
template class HostBackendT<double>;

}  // namespace pipetrain::compute
