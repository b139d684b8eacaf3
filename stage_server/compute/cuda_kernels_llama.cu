// Llama's kernels of the CUDA backend (semantics in backend.h): RMSNorm forward and
// backward (a block per row with a shared-memory sum in double, as the LayerNorm kernels;
// the weight gradient by column sums in a fixed order), rotary embeddings, SwiGLU and the
// grouped-query head copies (one thread per element).
#include <cmath>

#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_kernels_util.cuh"

namespace pipetrain::compute::cuda_kernels {
namespace {

constexpr int kRowThreads = 128;  // threads per block of the one-block-per-row kernels
constexpr int kColumnRows = 32;   // rows of the (32, kColumnRows) column-sum blocks

// grid = rows, block = kRowThreads.
__global__ void RmsNormForwardKernel(int C, float eps, const float* x, const float* weight,
                                     float* out, float* rstd_out) {
  __shared__ double scratch[kRowThreads];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * C;
  float* outr = out + row * C;
  double sq = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sq += double{xr[c]} * xr[c];
  const double rstd = 1.0 / sqrt(BlockSum(sq, scratch) / C + double{eps});
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    outr[c] = static_cast<float>(xr[c] * rstd * weight[c]);
  }
  if (threadIdx.x == 0) rstd_out[row] = static_cast<float>(rstd);
}

// grid = rows, block = kRowThreads. With xhat = x rstd and g = dout * weight:
// dx = rstd * (g - xhat * mean(g * xhat)) = rstd * (g - x * rstd^2 mean(g x)).
__global__ void RmsNormBackwardInputKernel(int C, const float* dout, const float* x,
                                           const float* weight, const float* rstd, float* dx) {
  __shared__ double scratch[kRowThreads];
  const int64_t row = blockIdx.x;
  const float* dr = dout + row * C;
  const float* xr = x + row * C;
  float* dxr = dx + row * C;
  const double rs = rstd[row];
  double sum_gx = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sum_gx += double{dr[c]} * weight[c] * xr[c];
  const double k = BlockSum(sum_gx, scratch) / C * rs * rs;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double g = double{dr[c]} * weight[c];
    dxr[c] = static_cast<float>(dxr[c] + rs * (g - xr[c] * k));
  }
}

// Block (32, kColumnRows): threadIdx.x picks a column of the block's 32, threadIdx.y a
// residue class of rows; the partial sums are added in a fixed order.
__global__ void RmsNormBackwardWeightKernel(int rows, int C, const float* dout, const float* x,
                                            const float* rstd, float* dweight) {
  __shared__ double part[kColumnRows][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  double sum = 0;
  if (c < C) {
    for (int r = threadIdx.y; r < rows; r += kColumnRows) {
      const int64_t i = int64_t{r} * C + c;
      sum += double{dout[i]} * x[i] * rstd[r];
    }
  }
  part[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double total = 0;
    for (int k = 0; k < kColumnRows; ++k) total += part[k][threadIdx.x];
    dweight[c] = static_cast<float>(dweight[c] + total);
  }
}

// One thread per pair (row, head, i < half); sign -1 rotates back (the inverse).
__global__ void RotaryKernel(int64_t n, int T, int heads, int half, int64_t stride,
                             const float* cos, const float* sin, float sign, float* x) {
  PT_GRID_STRIDE(p, n) {
    const int64_t per_row = int64_t{heads} * half;
    const int64_t r = p / per_row;
    const int h = static_cast<int>(p % per_row / half);
    const int i = static_cast<int>(p % half);
    const int64_t at = int64_t{r % T} * half + i;
    const float c = cos[at], s = sign * sin[at];
    float* x1 = x + r * stride + int64_t{h} * 2 * half + i;
    float* x2 = x1 + half;
    const float a = *x1, b = *x2;
    *x1 = a * c - b * s;
    *x2 = b * c + a * s;
  }
}

__device__ inline float Sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

__global__ void SwiGluForwardKernel(int64_t n, int F, const float* gu, float* out) {
  PT_GRID_STRIDE(i, n) {
    const int64_t r = i / F;
    const int64_t j = i % F;
    const float g = gu[r * 2 * F + j], up = gu[r * 2 * F + F + j];
    out[i] = g * Sigmoid(g) * up;
  }
}

__global__ void SwiGluBackwardKernel(int64_t n, int F, const float* gu, const float* dout,
                                     float* dgu) {
  PT_GRID_STRIDE(i, n) {
    const int64_t r = i / F;
    const int64_t j = i % F;
    const float g = gu[r * 2 * F + j], up = gu[r * 2 * F + F + j];
    const float s = Sigmoid(g);
    const float d = dout[i];
    dgu[r * 2 * F + j] = d * up * (s * (1.0f + g * (1.0f - s)));  // silu'(g)
    dgu[r * 2 * F + F + j] = d * (g * s);
  }
}

// One thread per element of out (rows, 3 NH hs).
__global__ void RepeatKvKernel(int64_t n, int NH, int NKV, int hs, const float* qkv,
                               float* out) {
  const int64_t q_cols = int64_t{NH} * hs, kv_cols = int64_t{NKV} * hs;
  const int64_t in_cols = q_cols + 2 * kv_cols, out_cols = 3 * q_cols;
  const int group = NH / NKV;
  PT_GRID_STRIDE(i, n) {
    const int64_t r = i / out_cols;
    const int64_t c = i % out_cols;
    const int64_t part = c / q_cols, within = c % q_cols;  // part 0 q, 1 k, 2 v
    const int64_t src = part == 0 ? within
                                  : q_cols + (part - 1) * kv_cols +
                                        within / hs / group * hs + within % hs;
    out[i] = qkv[r * in_cols + src];
  }
}

// One thread per element of dqkv (rows, (NH + 2 NKV) hs), summing its copies in order.
__global__ void SumKvGroupsKernel(int64_t n, int NH, int NKV, int hs, const float* dfull,
                                  float* dqkv) {
  const int64_t q_cols = int64_t{NH} * hs, kv_cols = int64_t{NKV} * hs;
  const int64_t cols = q_cols + 2 * kv_cols, full_cols = 3 * q_cols;
  const int group = NH / NKV;
  PT_GRID_STRIDE(i, n) {
    const int64_t r = i / cols;
    const int64_t c = i % cols;
    const float* d = dfull + r * full_cols;
    if (c < q_cols) {
      dqkv[i] = d[c];
      continue;
    }
    const int64_t part = (c - q_cols) / kv_cols, within = (c - q_cols) % kv_cols;
    const float* copies = d + (part + 1) * q_cols + within / hs * group * hs + within % hs;
    float sum = copies[0];
    for (int g = 1; g < group; ++g) sum += copies[int64_t{g} * hs];
    dqkv[i] = sum;
  }
}

}  // namespace

cudaError_t RmsNormForward(int rows, int C, float eps, const float* x, const float* weight,
                           float* out, float* rstd, cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return cudaSuccess;
  RmsNormForwardKernel<<<rows, kRowThreads, 0, stream>>>(C, eps, x, weight, out, rstd);
  return cudaGetLastError();
}

cudaError_t RmsNormBackward(int rows, int C, const float* dout, const float* x,
                            const float* weight, const float* rstd, float* dx, float* dweight,
                            cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return cudaSuccess;
  if (dx != nullptr) {
    RmsNormBackwardInputKernel<<<rows, kRowThreads, 0, stream>>>(C, dout, x, weight, rstd, dx);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  if (dweight == nullptr) return cudaSuccess;
  RmsNormBackwardWeightKernel<<<(C + 31) / 32, dim3(32, kColumnRows), 0, stream>>>(
      rows, C, dout, x, rstd, dweight);
  return cudaGetLastError();
}

cudaError_t Rotary(int rows, int T, int heads, int hs, int64_t stride, const float* cos,
                   const float* sin, bool inverse, float* x, cudaStream_t stream) {
  const int64_t n = int64_t{rows} * heads * (hs / 2);
  if (n <= 0 || T <= 0) return cudaSuccess;
  RotaryKernel<<<GridFor(n), kThreads, 0, stream>>>(n, T, heads, hs / 2, stride, cos, sin,
                                                    inverse ? -1.0f : 1.0f, x);
  return cudaGetLastError();
}

cudaError_t SwiGluForward(int rows, int F, const float* gu, float* out, cudaStream_t stream) {
  const int64_t n = int64_t{rows} * F;
  if (n <= 0) return cudaSuccess;
  SwiGluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(n, F, gu, out);
  return cudaGetLastError();
}

cudaError_t SwiGluBackward(int rows, int F, const float* gu, const float* dout, float* dgu,
                           cudaStream_t stream) {
  const int64_t n = int64_t{rows} * F;
  if (n <= 0) return cudaSuccess;
  SwiGluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(n, F, gu, dout, dgu);
  return cudaGetLastError();
}

cudaError_t RepeatKv(int rows, int NH, int NKV, int hs, const float* qkv, float* out,
                     cudaStream_t stream) {
  const int64_t n = int64_t{rows} * 3 * NH * hs;
  if (n <= 0 || NKV <= 0) return cudaSuccess;
  RepeatKvKernel<<<GridFor(n), kThreads, 0, stream>>>(n, NH, NKV, hs, qkv, out);
  return cudaGetLastError();
}

cudaError_t SumKvGroups(int rows, int NH, int NKV, int hs, const float* dfull, float* dqkv,
                        cudaStream_t stream) {
  const int64_t n = int64_t{rows} * (NH + 2 * int64_t{NKV}) * hs;
  if (n <= 0 || NKV <= 0) return cudaSuccess;
  SumKvGroupsKernel<<<GridFor(n), kThreads, 0, stream>>>(n, NH, NKV, hs, dfull, dqkv);
  return cudaGetLastError();
}

}  // namespace pipetrain::compute::cuda_kernels
