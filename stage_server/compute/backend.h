// The compute backend interface: explicit-shape operations on memory the backend owns.
// Pointers handed to an op may be device pointers, so callers (the GPT layers) never
// dereference them; data crosses to the host only through CopyToHost/CopyFromHost.
//
// Conventions shared by every op:
//  - All tensors are dense and row-major; shapes are given in comments, e.g. (B, T, C).
//  - B = batch rows, T = sequence length, C = d_model, NH = heads, hs = C / NH,
//    V = vocab, N = an element count.
//  - "+=" in a comment means the op accumulates into its output (callers zero it first);
//    otherwise the output is overwritten. Gradients of parameters always accumulate so
//    that micro-batches add up without extra copies.
//  - A nullptr output of a backward op means "do not compute it" (lets a layer split its
//    backward into backward-input and backward-weight halves).
//  - Ops may run asynchronously on a device; CopyToHost and Synchronize wait.
//  - Every op returns absl::Status; an implementation reports bad arguments (negative
//    sizes, a token id outside the vocabulary) instead of crashing.
//
// BackendT<Real> is templated on the scalar type so that the same GPT layer code runs in
// double precision on the reference backend (for finite-difference gradient checks);
// every production backend implements Backend = BackendT<float>.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/tensor.h"

namespace pipetrain::compute {

// An operand of MatmulByCopy: its values in backend memory, or its product copy
// (Backend::MakeProductCopy); exactly one is set.
template <typename Real>
struct ProductOperand {
  const Real* values = nullptr;
  const void* copy = nullptr;
  const void* data() const { return copy != nullptr ? copy : values; }
};
template <typename Real>
ProductOperand<Real> Values(const Real* values) {
  return {.values = values};
}
template <typename Real>
ProductOperand<Real> CopyOf(const void* copy) {
  return {.copy = copy};
}

template <typename Real>
class BackendT {
 public:
  using Scalar = Real;
  virtual ~BackendT() = default;

  // "cpu", "cuda", "reference-double", ...: used in logs and error messages.
  virtual std::string Name() const = 0;

  // ---- Precision of the matrix products ---------------------------------------------
  // The operands of every matrix product, attention's included: kF32 (the default), or
  // kBF16 (training.precision "bf16"): each operand is rounded to bf16, nearest even as
  // common/bf16.h rounds, and the products are summed in fp32 or wider. Outputs,
  // accumulators (beta = 1) and every other op stay in Real. A backend without bf16
  // products refuses it with Unimplemented; this default is such a backend.
  virtual absl::Status SetProductOperands(common::DType operands) {
    if (operands != common::DType::kF32) {
      return absl::UnimplementedError(absl::StrCat(Name(), " backend: no ",
                                                   common::DTypeName(operands), " products"));
    }
    product_operands_ = operands;
    return absl::OkStatus();
  }
  common::DType product_operands() const { return product_operands_; }

  // ---- Memory -----------------------------------------------------------------------
  // Allocates `bytes` bytes (uninitialised), suitably aligned for Real and int32_t.
  // Allocate(0) returns nullptr and Free(nullptr) does nothing.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual absl::Status Free(void* ptr) = 0;
  virtual absl::Status Zero(void* ptr, size_t bytes) = 0;
  virtual absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) = 0;
  // Copies host pieces, in order, to consecutive bytes starting at dst (a tensor that
  // arrived from the network in several buffers). The pieces may be reused once this
  // returns. This default copies piece by piece; a device backend stages them through
  // pinned memory instead.
  virtual absl::Status CopyFromHostPieces(void* dst,
                                          std::span<const std::span<const std::byte>> pieces) {
    auto* out = static_cast<std::byte*>(dst);
    for (const auto& piece : pieces) {
      if (absl::Status s = CopyFromHost(out, piece.data(), piece.size()); !s.ok()) return s;
      out += piece.size();
    }
    return absl::OkStatus();
  }
  // Waits for pending work on the source, then copies.
  virtual absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) = 0;
  // Backend to backend (same backend instance).
  virtual absl::Status Copy(void* dst, const void* src, size_t bytes) = 0;
  // Waits for every op issued so far (a no-op on the CPU).
  virtual absl::Status Synchronize() = 0;
  // A strided copy of `rows` rows of `cols` elements (cudaMemcpy2D in elements): the
  // key-value cache of generation scatters each new position's heads into it.
  //   dst[r * dst_stride + c] = src[r * src_stride + c], both strides >= cols;
  //   the rows of src and dst must not overlap.
  virtual absl::Status Copy2D(int rows, int cols, const Real* src, int64_t src_stride, Real* dst,
                              int64_t dst_stride) = 0;

  // ---- Matrix product ---------------------------------------------------------------
  // c = alpha * op(a) @ op(b) + beta * c, row-major like cblas_sgemm(CblasRowMajor):
  //   op(a) is (m, k): a is (m, k), or (k, m) when trans_a;
  //   op(b) is (k, n): b is (k, n), or (n, k) when trans_b;
  //   c is (m, n). beta = 1 accumulates (weight gradients), beta = 0 overwrites (c may
  //   then hold garbage, including NaN).
  virtual absl::Status Matmul(bool trans_a, bool trans_b, int m, int n, int k, Real alpha,
                              const Real* a, const Real* b, Real beta, Real* c) = 0;

  // ---- Product copies -----------------------------------------------------------
  // Between two optimizer steps every micro-batch's products read the same weights, and
  // an activation kept for the backward is read again by its weight-gradient product.
  // With bf16 products the layers keep such a tensor as the products take it, made once
  // (PipelineLayer::ProductCopy for weights; the stash for activations), and
  // MatmulByCopy reads the copy instead of rounding the fp32 tensor again. Same numbers
  // as Matmul on the tensor: rounding a bf16 value gives it back.
  // Bytes of the copy of n elements: 0 while products take fp32 (they read the tensor).
  virtual int64_t ProductCopyBytes(int64_t n) const = 0;
  // copy = x as the products take it (bf16: rounded), in ProductCopyBytes(n) bytes; only
  // with bf16 products (FailedPrecondition otherwise).            x (N), copy (N)
  virtual absl::Status MakeProductCopy(int64_t n, const Real* x, void* copy) = 0;
  // Matmul whose operands are each given as values (rounded as Matmul rounds them) or as
  // a product copy of a tensor of the same shape and layout; only with bf16 products.
  virtual absl::Status MatmulByCopy(bool trans_a, bool trans_b, int m, int n, int k, Real alpha,
                                    ProductOperand<Real> a, ProductOperand<Real> b, Real beta,
                                    Real* c) = 0;

  // ---- Elementwise and bias ---------------------------------------------------------
  // out = a + b (residual connection); out may alias a or b.           all (N)
  virtual absl::Status Add(int64_t n, const Real* a, const Real* b, Real* out) = 0;
  // y += alpha * x (gradient accumulation, residual gradients).       all (N)
  virtual absl::Status Axpy(int64_t n, Real alpha, const Real* x, Real* y) = 0;
  // x *= alpha (gradient clipping, loss scaling).                      (N)
  virtual absl::Status Scale(int64_t n, Real alpha, Real* x) = 0;
  // x = x rounded to the nearest bf16 (common/bf16.h's rule; a double through float):
  // the residual stream between layers in bf16 (training.precision "bf16").  (N)
  virtual absl::Status RoundToBf16(int64_t n, Real* x) = 0;
  // x[r, :] += bias for every row.          x (rows, cols), bias (cols)
  virtual absl::Status AddBias(int rows, int cols, const Real* bias, Real* x) = 0;
  // dbias += sum over rows of dout.         dout (rows, cols), dbias (cols) +=
  virtual absl::Status BiasGrad(int rows, int cols, const Real* dout, Real* dbias) = 0;
  // Returns sum_i x[i]^2 on the host, accumulated in double (global-norm clipping).
  virtual absl::StatusOr<double> SumOfSquares(int64_t n, const Real* x) = 0;

  // ---- Embedding --------------------------------------------------------------------
  // out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :], or without the wpe term when wpe is
  // nullptr (a model without a position embedding: Llama's are rotary). Fails with InvalidArgument if a
  // token is outside [0, V) where the backend can check cheaply (the cpu backend does);
  // a device backend may instead clamp or skip, so whoever brings tokens in from outside
  // (the executor, the trainer) validates them on the host before copying them over.
  //   tokens (B, T) int32, wte (V, C), wpe (>= T, C), out (B, T, C)
  virtual absl::Status EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                                        const Real* wte, const Real* wpe, Real* out) = 0;
  // dwte[tokens[b, t], :] += dout[b, t, :];  dwpe[t, :] += sum_b dout[b, t, :].
  // Either gradient may be nullptr.
  //   tokens (B, T), dout (B, T, C), dwte (V, C) +=, dwpe (>= T, C) +=
  virtual absl::Status EmbeddingBackward(int B, int T, int C, int V,
                                         const int32_t* tokens, const Real* dout,
                                         Real* dwte, Real* dwpe) = 0;

  // ---- LayerNorm (biased variance, eps = 1e-5) --------------------------------------
  // out = (x - mean) * rstd * weight + bias, keeping mean and rstd for backward.
  //   x (rows, C), weight (C), bias (C), out (rows, C), mean (rows), rstd (rows)
  virtual absl::Status LayerNormForward(int rows, int C, const Real* x,
                                        const Real* weight, const Real* bias, Real* out,
                                        Real* mean, Real* rstd) = 0;
  // dx += dL/dx; dweight += dL/dweight; dbias += dL/dbias. Any of the three may be
  // nullptr (backward-input passes only dx, backward-weight only dweight and dbias).
  //   dout (rows, C), x (rows, C), weight (C), mean (rows), rstd (rows),
  //   dx (rows, C) +=, dweight (C) +=, dbias (C) +=
  virtual absl::Status LayerNormBackward(int rows, int C, const Real* dout, const Real* x,
                                         const Real* weight, const Real* mean,
                                         const Real* rstd, Real* dx, Real* dweight,
                                         Real* dbias) = 0;

  // ---- GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) -------------
  // out may alias x.                                     x (N), out (N)
  virtual absl::Status GeluForward(int64_t n, const Real* x, Real* out) = 0;
  // dx = dout * gelu'(x) (overwrites; dx may alias dout).  x, dout, dx (N)
  virtual absl::Status GeluBackward(int64_t n, const Real* x, const Real* dout,
                                    Real* dx) = 0;

  // ---- Causal multi-head self-attention ---------------------------------------------
  // qkv holds q|k|v along the last dimension, each C wide with heads contiguous
  // (head h of q is qkv[b, t, h*hs : (h+1)*hs]). For every head:
  //   probs = softmax_causal(q k^T / sqrt(hs)) (entries above the diagonal are 0),
  //   out[b, t, h*hs : (h+1)*hs] = probs @ v.
  //   qkv (B, T, 3C), out (B, T, C), probs (B, NH, T, T) kept for backward
  virtual absl::Status AttentionForward(int B, int T, int C, int NH, const Real* qkv,
                                        Real* out, Real* probs) = 0;
  // dqkv = gradient of the attention output w.r.t. qkv (overwrites).
  //   dout (B, T, C), qkv (B, T, 3C), probs (B, NH, T, T), dqkv (B, T, 3C)
  virtual absl::Status AttentionBackward(int B, int T, int C, int NH, const Real* dout,
                                         const Real* qkv, const Real* probs,
                                         Real* dqkv) = 0;

  // ---- Llama: RMSNorm, rotary embeddings, SwiGLU, grouped-query heads ----------------
  // None of these reads the product precision: in bf16 they compute in Real as in f32.

  // ---- RMSNorm: out = x * rstd * weight, rstd = 1 / sqrt(mean over C of x^2 + eps) -----
  //   x (rows, C), weight (C), out (rows, C), rstd (rows) kept for backward
  // eps must be finite and positive.
  virtual absl::Status RmsNormForward(int rows, int C, float eps, const Real* x,
                                      const Real* weight, Real* out, Real* rstd) = 0;
  // dx += dL/dx; dweight += dL/dweight; either may be nullptr (weight is read for dx only).
  //   dout (rows, C), x (rows, C), weight (C), rstd (rows), dx (rows, C) +=, dweight (C) +=
  virtual absl::Status RmsNormBackward(int rows, int C, const Real* dout, const Real* x,
                                       const Real* weight, const Real* rstd, Real* dx,
                                       Real* dweight) = 0;
  // ---- Rotary position embedding, Hugging Face's convention (rotate_half: the first and
  // second halves of each head are the pair), in place. Row r is position t = r % T; in
  // each row the first `heads` heads of hs elements are rotated, the rest left alone.
  // With x1 = x[r*stride + h*hs + i], x2 = x[r*stride + h*hs + i + hs/2], i < hs/2:
  //   forward: x1' = x1 cos[t, i] - x2 sin[t, i];  x2' = x2 cos[t, i] + x1 sin[t, i]
  //   inverse (the backward, the transposed rotation): x1' = x1 cos + x2 sin;
  //            x2' = x2 cos - x1 sin
  //   x (rows, >= stride), cos (T, hs/2), sin (T, hs/2); hs even, heads * hs <= stride
  // (Hugging Face's q_proj and k_proj weights therefore load without a permutation.)
  virtual absl::Status Rotary(int rows, int T, int heads, int hs, int64_t stride,
                              const Real* cos, const Real* sin, bool inverse, Real* x) = 0;
  // ---- SwiGLU: out[r, j] = silu(gu[r, j]) * gu[r, F + j], silu(g) = g / (1 + exp(-g)) --
  //   gu (rows, 2F) gate|up, out (rows, F); out must not overlap gu.
  virtual absl::Status SwiGluForward(int rows, int F, const Real* gu, Real* out) = 0;
  // dgu[r, j] = dout[r, j] * up * silu'(gate); dgu[r, F + j] = dout[r, j] * silu(gate)
  // (overwrites; dgu must not alias gu or dout).
  //   gu (rows, 2F), dout (rows, F), dgu (rows, 2F)
  virtual absl::Status SwiGluBackward(int rows, int F, const Real* gu, const Real* dout,
                                      Real* dgu) = 0;
  // ---- Grouped-query attention's heads (NKV key/value heads shared by NH / NKV query
  // heads each; NKV divides NH): whole heads for AttentionForward, as Hugging Face's
  // repeat_kv. qkv (rows, (NH + 2 NKV) hs) q|k|v -> out (rows, 3 NH hs) q|k|v, query head
  // h reading key/value head h / (NH / NKV). out must not overlap qkv.
  virtual absl::Status RepeatKv(int rows, int NH, int NKV, int hs, const Real* qkv,
                                Real* out) = 0;
  // Its backward: dqkv (rows, (NH + 2 NKV) hs) = dfull's q part, and for each key/value
  // head the sum of the NH / NKV gradients of its copies (overwrites; in copy order).
  //   dfull (rows, 3 NH hs), dqkv (rows, (NH + 2 NKV) hs); dqkv must not overlap dfull.
  virtual absl::Status SumKvGroups(int rows, int NH, int NKV, int hs, const Real* dfull,
                                   Real* dqkv) = 0;

  // ---- Softmax ----------------------------------------------------------------------
  // out = softmax(x) per row, with the row maximum subtracted first (out may alias x).
  // Attention of one new query over a key-value cache (generation) uses it.
  //   x (rows, cols), out (rows, cols)
  virtual absl::Status Softmax(int rows, int cols, const Real* x, Real* out) = 0;

  // ---- Softmax cross-entropy --------------------------------------------------------
  // probs = softmax(logits) per row (probs may alias logits);
  // *loss = mean over rows of -log probs[r, targets[r]] (one scalar in backend memory).
  // Fails with InvalidArgument on a target outside [0, V).
  //   logits (rows, V), targets (rows) int32, probs (rows, V), loss (1)
  virtual absl::Status CrossEntropyForward(int rows, int V, const Real* logits,
                                           const int32_t* targets, Real* probs,
                                           Real* loss) = 0;
  // dlogits = (probs - onehot(targets)) * dloss_scale (overwrites; may alias probs).
  // For the mean loss with upstream gradient g, dloss_scale = g / rows.
  //   probs (rows, V), targets (rows), dlogits (rows, V)
  virtual absl::Status CrossEntropyBackward(int rows, int V, const Real* probs,
                                            const int32_t* targets, Real dloss_scale,
                                            Real* dlogits) = 0;

  // ---- Optimizer --------------------------------------------------------------------
  // One AdamW step (PyTorch's torch.optim.AdamW), step >= 1 counts from 1:
  //   param -= lr * weight_decay * param          (decoupled; pass 0 for no decay)
  //   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
  //   param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
  //   param, grad, m, v (N)
  virtual absl::Status AdamW(int64_t n, Real* param, const Real* grad, Real* m, Real* v,
                             float lr, float beta1, float beta2, float eps,
                             float weight_decay, int step) = 0;

 protected:
  // Sets the precision for a backend that has both (its own SetProductOperands).
  absl::Status SetF32OrBf16Products(common::DType operands) {
    if (operands != common::DType::kF32 && operands != common::DType::kBF16) {
      return absl::InvalidArgumentError(
          absl::StrCat(Name(), " backend: products in f32 or bf16, not ",
                       common::DTypeName(operands)));
    }
    product_operands_ = operands;
    return absl::OkStatus();
  }
  bool bf16_products() const { return product_operands_ == common::DType::kBF16; }

 private:
  common::DType product_operands_ = common::DType::kF32;
};

using Backend = BackendT<float>;

}  // namespace pipetrain::compute
