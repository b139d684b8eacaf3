// Thin C-style launchers for the CUDA backend's kernels (cuda_kernels_*.cu). Each one
// enqueues its kernel(s) on `stream` and returns the launch error (cudaGetLastError);
// cuda_backend.cc turns that into an absl::Status naming the op and shapes. Keeping
// Abseil out of the .cu files keeps nvcc's work small and its failure modes few.
// Shapes follow backend.h; every pointer is device memory.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace pipetrain::compute::cuda_kernels {

// ---- Elementwise (cuda_kernels_elementwise.cu) ----------------------------------------
cudaError_t Fill(int64_t n, float value, float* x, cudaStream_t stream);        // x (N)
cudaError_t Add(int64_t n, const float* a, const float* b, float* out,          // all (N)
                cudaStream_t stream);
cudaError_t Axpy(int64_t n, float alpha, const float* x, float* y,              // all (N)
                 cudaStream_t stream);
cudaError_t Scale(int64_t n, float alpha, float* x, cudaStream_t stream);
cudaError_t RoundToBf16(int64_t n, float* x, cudaStream_t stream);       // x (N)
// x (rows, cols) += bias (cols) broadcast over rows.
cudaError_t AddBias(int rows, int cols, const float* bias, float* x, cudaStream_t stream);
// out[c] += sum_r in[r * row_stride + c] (sums in double, deterministic order).
//   in (rows, row_stride) with cols <= row_stride used, out (cols) +=
cudaError_t ColumnSum(int rows, int64_t cols, int64_t row_stride, const float* in,
                      float* out, cudaStream_t stream);
// partials (kReducePartials) doubles; then total[0] = sum of x^2 (double).
inline constexpr int kReducePartials = 1024;
cudaError_t SumOfSquares(int64_t n, const float* x, double* partials, double* total,
                         cudaStream_t stream);
cudaError_t GeluForward(int64_t n, const float* x, float* out, cudaStream_t stream);
cudaError_t GeluBackward(int64_t n, const float* x, const float* dout, float* dx,
                         cudaStream_t stream);
// bias_correction1/2 = 1 - beta^step, computed by the caller in double.
cudaError_t AdamW(int64_t n, float* param, const float* grad, float* m, float* v,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  double bias_correction1, double bias_correction2, cudaStream_t stream);

// ---- Rows: embedding, layernorm, softmax, cross-entropy (cuda_kernels_rows.cu) --------
// *bad_index = INT32_MAX before a check; kernels that find an id outside [0, V) store
// the smallest such position there (atomicMin) and leave that row's output untouched.
cudaError_t ResetBadIndex(int32_t* bad_index, cudaStream_t stream);
// tokens (B, T), wte (V, C), wpe (>= T, C), out (B, T, C)
cudaError_t EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                             const float* wte, const float* wpe, float* out,
                             int32_t* bad_index, cudaStream_t stream);
// dwte (V, C) += scatter of dout rows (atomicAdd); skipped when dwte is null.
cudaError_t EmbeddingBackwardWte(int B, int T, int C, int V, const int32_t* tokens,
                                 const float* dout, float* dwte, int32_t* bad_index,
                                 cudaStream_t stream);
// x (rows, C), weight (C), bias (C), out (rows, C), mean (rows), rstd (rows);
// mean and rstd may be null.
cudaError_t LayerNormForward(int rows, int C, const float* x, const float* weight,
                             const float* bias, float* out, float* mean, float* rstd,
                             cudaStream_t stream);
// dx (rows, C) += input gradient.
cudaError_t LayerNormBackwardInput(int rows, int C, const float* dout, const float* x,
                                   const float* weight, const float* mean,
                                   const float* rstd, float* dx, cudaStream_t stream);
// dweight (C) += sum_r dout * xhat; dbias (C) += sum_r dout; either may be null.
cudaError_t LayerNormBackwardParams(int rows, int C, const float* dout, const float* x,
                                    const float* mean, const float* rstd, float* dweight,
                                    float* dbias, cudaStream_t stream);
// out (rows, cols) = softmax(x) per row (may alias x).
cudaError_t Softmax(int rows, int cols, const float* x, float* out, cudaStream_t stream);
// probs (rows, V) = softmax(logits) (may alias); row_loss (rows) doubles; then
// loss[0] = mean of row_loss. targets (rows).
cudaError_t CrossEntropyForward(int rows, int V, const float* logits,
                                const int32_t* targets, float* probs, double* row_loss,
                                float* loss, int32_t* bad_index, cudaStream_t stream);
// dlogits (rows, V) = (probs - onehot) * scale (may alias probs).
cudaError_t CrossEntropyBackward(int rows, int V, const float* probs,
                                 const int32_t* targets, float scale, float* dlogits,
                                 int32_t* bad_index, cudaStream_t stream);

// ---- Attention softmax (cuda_kernels_attention.cu) ------------------------------------
// In place on rows (rows = batch * NH * T) of length T, row r being query t = r % T:
// scores -> causal softmax (entries j > t set to 0).   scores (batch, NH, T, T)
cudaError_t CausalSoftmaxForward(int64_t rows, int T, float* scores, cudaStream_t stream);
// In place: dprobs -> dscores = probs * (dprobs - sum_j probs * dprobs) * scale, zero above
// the diagonal.   probs, dprobs (batch, NH, T, T)
cudaError_t CausalSoftmaxBackward(int64_t rows, int T, const float* probs, float* dprobs,
                                  float scale, cudaStream_t stream);

// ---- Llama: RMSNorm, rotary embeddings, SwiGLU, grouped-query heads (cuda_kernels_llama.cu)
// x (rows, C), weight (C), out (rows, C), rstd (rows); the row's sum of squares in double.
cudaError_t RmsNormForward(int rows, int C, float eps, const float* x, const float* weight,
                           float* out, float* rstd, cudaStream_t stream);
// dx (rows, C) += input gradient; dweight (C) += sum_r dout x rstd (column sums in
// double, fixed order). Each is skipped when null; weight is read for dx only.
cudaError_t RmsNormBackward(int rows, int C, const float* dout, const float* x,
                            const float* weight, const float* rstd, float* dx, float* dweight,
                            cudaStream_t stream);
// In place, Hugging Face's rotate_half pairs (backend.h).
//   x (rows, >= stride), cos (T, hs/2), sin (T, hs/2)
cudaError_t Rotary(int rows, int T, int heads, int hs, int64_t stride, const float* cos,
                   const float* sin, bool inverse, float* x, cudaStream_t stream);
// gu (rows, 2F) gate|up, out (rows, F).
cudaError_t SwiGluForward(int rows, int F, const float* gu, float* out, cudaStream_t stream);
// dgu (rows, 2F) = gradient w.r.t. gate|up of dout (rows, F).
cudaError_t SwiGluBackward(int rows, int F, const float* gu, const float* dout, float* dgu,
                           cudaStream_t stream);
// qkv (rows, (NH + 2 NKV) hs) -> out (rows, 3 NH hs).
cudaError_t RepeatKv(int rows, int NH, int NKV, int hs, const float* qkv, float* out,
                     cudaStream_t stream);
// dfull (rows, 3 NH hs) -> dqkv (rows, (NH + 2 NKV) hs), each group summed in copy order.
cudaError_t SumKvGroups(int rows, int NH, int NKV, int hs, const float* dfull, float* dqkv,
                        cudaStream_t stream);

// ---- bf16 operands of the products (cuda_kernels_bf16.cu) ----------------------------
// out (N) = the bits of x (N) rounded to bf16 as common/bf16.h's FloatToBf16Bits does.
cudaError_t ToBf16Bits(int64_t n, const float* x, uint16_t* out, cudaStream_t stream);

}  // namespace pipetrain::compute::cuda_kernels
