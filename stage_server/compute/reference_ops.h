// Plain-loop versions of every backend op, on host memory, for float and double.
// They are the definition of each op's semantics (see backend.h for shapes): tests hold
// the optimised backends to them, and in double they make finite-difference gradient
// checks meaningful. Written for clarity, not speed; sums accumulate in double.
#pragma once

#include <cstdint>

namespace pipetrain::compute::reference {

inline constexpr double kLayerNormEps = 1e-5;

// `bf16_operands` (Backend::SetProductOperands(kBF16)): every operand of a product is
// rounded to bf16 (common/bf16.h) as it is read; the sums stay in double.
template <typename Real>
void Matmul(bool trans_a, bool trans_b, int m, int n, int k, Real alpha, const Real* a,
            const Real* b, Real beta, Real* c, bool bf16_operands = false);

template <typename Real>
void Add(int64_t n, const Real* a, const Real* b, Real* out);
template <typename Real>
void Axpy(int64_t n, Real alpha, const Real* x, Real* y);
template <typename Real>
void Scale(int64_t n, Real alpha, Real* x);
template <typename Real>
void RoundToBf16(int64_t n, Real* x);
template <typename Real>
void AddBias(int rows, int cols, const Real* bias, Real* x);
template <typename Real>
void BiasGrad(int rows, int cols, const Real* dout, Real* dbias);
template <typename Real>
double SumOfSquares(int64_t n, const Real* x);

// The id-reading ops below expect ids in [0, V): a backend checks them first
// (CheckHostIds in op_checks.h), as it checks every op's sizes.
template <typename Real>
void EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens, const Real* wte,
                      const Real* wpe, Real* out);
template <typename Real>
void EmbeddingBackward(int B, int T, int C, int V, const int32_t* tokens, const Real* dout,
                       Real* dwte, Real* dwpe);

template <typename Real>
void LayerNormForward(int rows, int C, const Real* x, const Real* weight,
                      const Real* bias, Real* out, Real* mean, Real* rstd);
template <typename Real>
void LayerNormBackward(int rows, int C, const Real* dout, const Real* x,
                       const Real* weight, const Real* mean, const Real* rstd, Real* dx,
                       Real* dweight, Real* dbias);

template <typename Real>
void GeluForward(int64_t n, const Real* x, Real* out);
template <typename Real>
void GeluBackward(int64_t n, const Real* x, const Real* dout, Real* dx);

// With `bf16_operands` the operands of attention's products are rounded where the cpu
// backend's products round them: q and k (scores), probs and v (output); dout and v
// (d probs), probs and dout (dv), the scaled d scores and k (dq), d scores and q (dk).
template <typename Real>
void AttentionForward(int B, int T, int C, int NH, const Real* qkv, Real* out,
                      Real* probs, bool bf16_operands = false);
template <typename Real>
void AttentionBackward(int B, int T, int C, int NH, const Real* dout, const Real* qkv,
                       const Real* probs, Real* dqkv, bool bf16_operands = false);

// Llama's ops (reference_llama_ops.cc). Sums in double, as LayerNorm's.
template <typename Real>
void RmsNormForward(int rows, int C, float eps, const Real* x, const Real* weight, Real* out,
                    Real* rstd);
template <typename Real>
void RmsNormBackward(int rows, int C, const Real* dout, const Real* x, const Real* weight,
                     const Real* rstd, Real* dx, Real* dweight);
template <typename Real>
void Rotary(int rows, int T, int heads, int hs, int64_t stride, const Real* cos, const Real* sin,
            bool inverse, Real* x);
template <typename Real>
void SwiGluForward(int rows, int F, const Real* gu, Real* out);
template <typename Real>
void SwiGluBackward(int rows, int F, const Real* gu, const Real* dout, Real* dgu);
template <typename Real>
void RepeatKv(int rows, int NH, int NKV, int hs, const Real* qkv, Real* out);
template <typename Real>
void SumKvGroups(int rows, int NH, int NKV, int hs, const Real* dfull, Real* dqkv);

template <typename Real>
void Copy2D(int rows, int cols, const Real* src, int64_t src_stride, Real* dst, int64_t dst_stride);
template <typename Real>
void Softmax(int rows, int cols, const Real* x, Real* out);

template <typename Real>
void CrossEntropyForward(int rows, int V, const Real* logits, const int32_t* targets, Real* probs,
                         Real* loss);
template <typename Real>
void CrossEntropyBackward(int rows, int V, const Real* probs, const int32_t* targets,
                          Real dloss_scale, Real* dlogits);

template <typename Real>
void AdamW(int64_t n, Real* param, const Real* grad, Real* m, Real* v, float lr,
           float beta1, float beta2, float eps, float weight_decay, int step);

}  // namespace pipetrain::compute::reference
