// CUDA build of the `cuda` backend's ops (cuda_backend.h): each one runs the shared
// argument check (op_checks.h), then cuBLAS or a launcher of cuda_kernels.h through
// CudaBackend::Run (cuda_backend_run.h), every result turned into an absl::Status naming
// the op and its shapes. Llama's ops are in cuda_backend_llama.cc.
#include <climits>
#include <cmath>
#include <type_traits>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/cuda_backend_run.h"
#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_status.h"
#include "stage_server/compute/op_checks.h"

namespace pipetrain::compute {
namespace {

namespace ck = cuda_kernels;

}  // namespace

// ---- Matrix products --------------------------------------------------------------------

absl::Status CudaBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                               const float* a, int lda, int64_t stride_a, const float* b,
                               int ldb, int64_t stride_b, float beta, float* c, int ldc,
                               int64_t stride_c, int batch, const OpCall& call,
                               absl::string_view part, int row) {
  // cuBLAS is column-major. A row-major (m, n) matrix is the column-major (n, m) matrix
  // with the same leading dimension, so c^T = op(b)^T op(a)^T is computed with the
  // operands swapped and the transposes kept.
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Built only on failure: "AttentionForward(B=2 T=7 C=12 NH=3) scores b=1".
  auto where = [&] {
    return absl::StrCat(call.ToString(), part.empty() ? "" : " ", part,
                        row < 0 ? "" : absl::StrCat(" b=", row));
  };
  if (bf16_products()) {
    return GemmBf16(trans_a, trans_b, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta,
                    c, ldc, stride_c, batch, where);
  }
  if (batch == 1) {
    CUBLAS_CHECK(cublasSgemm(cublas_, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c,
                             ldc),
                 where(), ": cublasSgemm(m=", m, " n=", n, " k=", k, " trans_a=", trans_a,
                 " trans_b=", trans_b, " lda=", lda, " ldb=", ldb, " ldc=", ldc, ")");
  } else {
    CUBLAS_CHECK(cublasSgemmStridedBatched(cublas_, op_b, op_a, n, m, k, &alpha, b, ldb,
                                           stride_b, a, lda, stride_a, &beta, c, ldc,
                                           stride_c, batch),
                 where(), ": cublasSgemmStridedBatched(m=", m, " n=", n, " k=", k,
                 " trans_a=", trans_a, " trans_b=", trans_b, " lda=", lda, " ldb=", ldb,
                 " ldc=", ldc, " batch=", batch, ")");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Matmul(bool trans_a, bool trans_b, int m, int n, int k,
                                 float alpha, const float* a, const float* b, float beta,
                                 float* c) {
  ASSIGN_OR_RETURN(const OpCall call, CheckMatmul(Name(), m, n, k, a, b, c));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    if (k == 0) {  // c = beta * c; beta = 0 must overwrite garbage (NaN * 0 is NaN)
      const int64_t count = int64_t{m} * n;
      if (beta == 0.0f) {
        CUDA_CHECK(ck::Fill(count, 0.0f, c, s), call.ToString(), ": fill");
      } else {
        CUDA_CHECK(ck::Scale(count, beta, c, s), call.ToString(), ": scale");
      }
      return absl::OkStatus();
    }
    // Row-major leading dimensions: the row length of each stored matrix.
    const int lda = trans_a ? m : k;  // a is (k, m) or (m, k)
    const int ldb = trans_b ? k : n;  // b is (n, k) or (k, n)
    return Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, n, 0, 1,
                call);
  });
}

// ---- A weight's product copy ------------------------------------------------------------

int64_t CudaBackend::ProductCopyBytes(int64_t n) const {
  return bf16_products() ? n * static_cast<int64_t>(common::DTypeSize(common::DType::kBF16)) : 0;
}

absl::Status CudaBackend::MakeProductCopy(int64_t n, const float* x, void* copy) {
  ASSIGN_OR_RETURN(const OpCall call, CheckMakeProductCopy(Name(), n, x, copy));
  if (!bf16_products()) return ProductCopyWithoutBf16(Name(), call);
  return Run(call, [&](cudaStream_t s) {
    return ck::ToBf16Bits(n, x, static_cast<uint16_t*>(copy), s);
  });
}

absl::Status CudaBackend::MatmulByCopy(bool trans_a, bool trans_b, int m, int n, int k,
                                       float alpha, ProductOperand<float> a,
                                       ProductOperand<float> b, float beta, float* c) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckMatmulByCopy(Name(), m, n, k, a.data(), b.data(), c));
  if (!bf16_products()) return ProductCopyWithoutBf16(Name(), call);
  if (k == 0) return Matmul(trans_a, trans_b, m, n, 0, alpha, nullptr, nullptr, beta, c);
  return Run(call, [&](cudaStream_t) -> absl::Status {
    const int lda = trans_a ? m : k;  // a is (k, m) or (m, k)
    const int ldb = trans_b ? k : n;  // b is (n, k) or (k, n)
    return GemmBf16(trans_a, trans_b, m, n, k, alpha, a.values, lda, 0, b.values, ldb, 0, beta,
                    c, n, 0, 1, [&] { return call.ToString(); },
                    static_cast<const uint16_t*>(a.copy), static_cast<const uint16_t*>(b.copy));
  });
}

// ---- Elementwise ------------------------------------------------------------------------

absl::Status CudaBackend::Add(int64_t n, const float* a, const float* b, float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAdd(Name(), n, a, b, out));
  return Run(call, [&](cudaStream_t s) { return ck::Add(n, a, b, out, s); });
}

absl::Status CudaBackend::Axpy(int64_t n, float alpha, const float* x, float* y) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAxpy(Name(), n, x, y));
  return Run(call, [&](cudaStream_t s) { return ck::Axpy(n, alpha, x, y, s); });
}

absl::Status CudaBackend::Scale(int64_t n, float alpha, float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckScale(Name(), n, x));
  return Run(call, [&](cudaStream_t s) { return ck::Scale(n, alpha, x, s); });
}

absl::Status CudaBackend::RoundToBf16(int64_t n, float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckRoundToBf16(Name(), n, x));
  return Run(call, [&](cudaStream_t s) { return ck::RoundToBf16(n, x, s); });
}

absl::Status CudaBackend::AddBias(int rows, int cols, const float* bias, float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAddBias(Name(), rows, cols, bias, x));
  return Run(call, [&](cudaStream_t s) { return ck::AddBias(rows, cols, bias, x, s); });
}

absl::Status CudaBackend::BiasGrad(int rows, int cols, const float* dout, float* dbias) {
  ASSIGN_OR_RETURN(const OpCall call, CheckBiasGrad(Name(), rows, cols, dout, dbias));
  return Run(call,
             [&](cudaStream_t s) { return ck::ColumnSum(rows, cols, cols, dout, dbias, s); });
}

absl::StatusOr<double> CudaBackend::SumOfSquares(int64_t n, const float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSumOfSquares(Name(), n, x));
  double result = 0;
  RETURN_IF_ERROR(Run(call, [&](cudaStream_t s) -> absl::Status {
    double* total = reduce_ + ck::kReducePartials;
    CUDA_CHECK(ck::SumOfSquares(n, x, reduce_, total, s), call.ToString());
    CUDA_CHECK(cudaMemcpyAsync(&result, total, sizeof(result), cudaMemcpyDeviceToHost, s),
               call.ToString(), ": reading the result");
    CUDA_CHECK(cudaStreamSynchronize(s), call.ToString());
    return absl::OkStatus();
  }));
  return result;
}

// ---- Embedding --------------------------------------------------------------------------

absl::Status CudaBackend::EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                                           const float* wte, const float* wpe, float* out) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckEmbeddingForward(Name(), B, T, C, V, tokens, wte, wpe, out));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    CUDA_CHECK(ck::ResetBadIndex(bad_index_, s), call.ToString(), ": reset id check");
    CUDA_CHECK(ck::EmbeddingForward(B, T, C, V, tokens, wte, wpe, out, bad_index_, s),
               call.ToString());
    // Synchronizes: a bad token must fail this call, as the interface promises.
    return CheckBadIndex(call, tokens, V, "tokens");
  });
}

absl::Status CudaBackend::EmbeddingBackward(int B, int T, int C, int V,
                                            const int32_t* tokens, const float* dout,
                                            float* dwte, float* dwpe) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckEmbeddingBackward(Name(), B, T, C, V, tokens, dout, dwte, dwpe));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    if (dwpe != nullptr) {
      // dwpe[t, c] += sum_b dout[b, t, c]: a column sum over B rows of length T*C.
      const int64_t cols = int64_t{T} * C;
      CUDA_CHECK(ck::ColumnSum(B, cols, cols, dout, dwpe, s), call.ToString(), ": dwpe");
    }
    if (dwte == nullptr) return absl::OkStatus();
    CUDA_CHECK(ck::ResetBadIndex(bad_index_, s), call.ToString(), ": reset id check");
    CUDA_CHECK(ck::EmbeddingBackwardWte(B, T, C, V, tokens, dout, dwte, bad_index_, s),
               call.ToString(), ": dwte");
    return CheckBadIndex(call, tokens, V, "tokens");
  });
}

// ---- LayerNorm --------------------------------------------------------------------------

absl::Status CudaBackend::LayerNormForward(int rows, int C, const float* x,
                                           const float* weight, const float* bias,
                                           float* out, float* mean, float* rstd) {
  ASSIGN_OR_RETURN(const OpCall call, CheckLayerNormForward(Name(), rows, C, x, weight,
                                                            bias, out, mean, rstd));
  return Run(call, [&](cudaStream_t s) {
    return ck::LayerNormForward(rows, C, x, weight, bias, out, mean, rstd, s);
  });
}

absl::Status CudaBackend::LayerNormBackward(int rows, int C, const float* dout,
                                            const float* x, const float* weight,
                                            const float* mean, const float* rstd, float* dx,
                                            float* dweight, float* dbias) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckLayerNormBackward(Name(), rows, C, dout, x, weight, mean, rstd, dx,
                                          dweight, dbias));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    CUDA_CHECK(ck::LayerNormBackwardInput(rows, C, dout, x, weight, mean, rstd, dx, s),
               call.ToString(), ": dx");
    CUDA_CHECK(
        ck::LayerNormBackwardParams(rows, C, dout, x, mean, rstd, dweight, dbias, s),
        call.ToString(), ": dweight/dbias");
    return absl::OkStatus();
  });
}

// ---- GELU -------------------------------------------------------------------------------

absl::Status CudaBackend::GeluForward(int64_t n, const float* x, float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluForward(Name(), n, x, out));
  return Run(call, [&](cudaStream_t s) { return ck::GeluForward(n, x, out, s); });
}

absl::Status CudaBackend::GeluBackward(int64_t n, const float* x, const float* dout,
                                       float* dx) {
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluBackward(Name(), n, x, dout, dx));
  return Run(call, [&](cudaStream_t s) { return ck::GeluBackward(n, x, dout, dx, s); });
}

// ---- Attention --------------------------------------------------------------------------
// Per batch row b, with q, k, v the (T, hs) slices of head h (row stride 3C) and the
// heads as the batch of a strided-batched product (head h starts h*hs further along):
//   forward:  probs = causal_softmax(q k^T / sqrt(hs));  out = probs v
//   backward: dP = dout v^T;  dS = probs * (dP - rowsum(probs * dP)) / sqrt(hs);
//             dq = dS k;  dk = dS^T q;  dv = probs^T dout
// The products run over the full (T, T) matrices; probs is zero above the diagonal, so
// the result is exact, at twice the arithmetic of a causal-aware kernel.

absl::Status CudaBackend::AttentionForward(int B, int T, int C, int NH, const float* qkv,
                                           float* out, float* probs) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckAttentionForward(Name(), B, T, C, NH, qkv, out, probs));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    const int hs = C / NH;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
    const int64_t tt = int64_t{T} * T;
    for (int b = 0; b < B; ++b) {
      const float* q = qkv + int64_t{b} * T * 3 * C;  // (T, 3C) rows of batch row b
      const float* k = q + C;
      float* p = probs + int64_t{b} * NH * tt;  // (NH, T, T)
      RETURN_IF_ERROR(Gemm(false, true, T, T, hs, scale, q, 3 * C, hs, k, 3 * C, hs, 0.0f,
                           p, T, tt, NH, call, "scores", b));
    }
    CUDA_CHECK(ck::CausalSoftmaxForward(int64_t{B} * NH * T, T, probs, s), call.ToString(),
               ": causal softmax");
    for (int b = 0; b < B; ++b) {
      const float* v = qkv + int64_t{b} * T * 3 * C + 2 * C;
      const float* p = probs + int64_t{b} * NH * tt;
      float* o = out + int64_t{b} * T * C;  // (T, C) rows of batch row b
      RETURN_IF_ERROR(Gemm(false, false, T, hs, T, 1.0f, p, T, tt, v, 3 * C, hs, 0.0f, o, C,
                           hs, NH, call, "probs@v", b));
    }
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::AttentionBackward(int B, int T, int C, int NH, const float* dout,
                                            const float* qkv, const float* probs,
                                            float* dqkv) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckAttentionBackward(Name(), B, T, C, NH, dout, qkv, probs, dqkv));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    const int hs = C / NH;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
    const int64_t tt = int64_t{T} * T;
    RETURN_IF_ERROR(EnsureScratch(&attn_scratch_, &attn_scratch_bytes_,
                                  BytesOf<float>(NH * tt), "attention scratch"));
    float* dp = static_cast<float*>(attn_scratch_);  // (NH, T, T), reused for every b
    for (int b = 0; b < B; ++b) {
      const float* q = qkv + int64_t{b} * T * 3 * C;
      const float* k = q + C;
      const float* v = q + 2 * C;
      const float* p = probs + int64_t{b} * NH * tt;
      const float* d_o = dout + int64_t{b} * T * C;
      float* dq = dqkv + int64_t{b} * T * 3 * C;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      RETURN_IF_ERROR(Gemm(false, true, T, T, hs, 1.0f, d_o, C, hs, v, 3 * C, hs, 0.0f, dp,
                           T, tt, NH, call, "dout@v^T", b));
      CUDA_CHECK(ck::CausalSoftmaxBackward(int64_t{NH} * T, T, p, dp, scale, s),
                 call.ToString(), " b=", b, ": causal softmax backward");
      RETURN_IF_ERROR(Gemm(false, false, T, hs, T, 1.0f, dp, T, tt, k, 3 * C, hs, 0.0f, dq,
                           3 * C, hs, NH, call, "dq", b));
      RETURN_IF_ERROR(Gemm(true, false, T, hs, T, 1.0f, dp, T, tt, q, 3 * C, hs, 0.0f, dk,
                           3 * C, hs, NH, call, "dk", b));
      RETURN_IF_ERROR(Gemm(true, false, T, hs, T, 1.0f, p, T, tt, d_o, C, hs, 0.0f, dv,
                           3 * C, hs, NH, call, "dv", b));
    }
    return absl::OkStatus();
  });
}

// ---- Strided copy and softmax -----------------------------------------------------------

absl::Status CudaBackend::Copy2D(int rows, int cols, const float* src, int64_t src_stride,
                                 float* dst, int64_t dst_stride) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCopy2D(Name(), rows, cols, src, src_stride, dst, dst_stride));
  return Run(call, [&](cudaStream_t s) {
    return cudaMemcpy2DAsync(dst, BytesOf<float>(dst_stride), src, BytesOf<float>(src_stride),
                             BytesOf<float>(cols), rows,
                             cudaMemcpyDeviceToDevice, s);
  });
}

absl::Status CudaBackend::Softmax(int rows, int cols, const float* x, float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSoftmax(Name(), rows, cols, x, out));
  return Run(call, [&](cudaStream_t s) { return ck::Softmax(rows, cols, x, out, s); });
}

// ---- Cross-entropy ----------------------------------------------------------------------

absl::Status CudaBackend::CrossEntropyForward(int rows, int V, const float* logits,
                                              const int32_t* targets, float* probs,
                                              float* loss) {
  ASSIGN_OR_RETURN(const OpCall call, CheckCrossEntropyForward(Name(), rows, V, logits,
                                                               targets, probs, loss));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    RETURN_IF_ERROR(EnsureScratch(&row_loss_, &row_loss_bytes_, rows * sizeof(double),
                                  "cross-entropy row losses"));
    CUDA_CHECK(ck::ResetBadIndex(bad_index_, s), call.ToString(), ": reset id check");
    CUDA_CHECK(ck::CrossEntropyForward(rows, V, logits, targets, probs,
                                       static_cast<double*>(row_loss_), loss, bad_index_, s),
               call.ToString());
    return CheckBadIndex(call, targets, V, "targets");
  });
}

absl::Status CudaBackend::CrossEntropyBackward(int rows, int V, const float* probs,
                                               const int32_t* targets, float dloss_scale,
                                               float* dlogits) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCrossEntropyBackward(Name(), rows, V, probs, targets, dlogits));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    CUDA_CHECK(ck::ResetBadIndex(bad_index_, s), call.ToString(), ": reset id check");
    CUDA_CHECK(ck::CrossEntropyBackward(rows, V, probs, targets, dloss_scale, dlogits,
                                        bad_index_, s),
               call.ToString());
    return CheckBadIndex(call, targets, V, "targets");
  });
}

// ---- Optimizer --------------------------------------------------------------------------

absl::Status CudaBackend::AdamW(int64_t n, float* param, const float* grad, float* m,
                                float* v, float lr, float beta1, float beta2, float eps,
                                float weight_decay, int step) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAdamW(Name(), n, param, grad, m, v, step));
  return Run(call, [&](cudaStream_t s) {
    const double bc1 = 1 - std::pow(double{beta1}, step);
    const double bc2 = 1 - std::pow(double{beta2}, step);
    return ck::AdamW(n, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, bc1, bc2, s);
  });
}

}  // namespace pipetrain::compute
