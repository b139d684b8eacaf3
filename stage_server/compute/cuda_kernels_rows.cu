// Row-wise kernels of the CUDA backend: embedding lookup and scatter, LayerNorm forward
// and backward, softmax, softmax cross-entropy. One block per row where a row needs a reduction
// (statistics in double, like the reference), one thread per element otherwise.
#include <climits>
#include <cmath>

#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_kernels_util.cuh"

namespace pipetrain::compute::cuda_kernels {
namespace {

constexpr int kRowThreads = 128;  // threads per block of the one-block-per-row kernels
constexpr double kLayerNormEps = 1e-5;

__global__ void ResetBadIndexKernel(int32_t* bad_index) { *bad_index = INT_MAX; }

__global__ void EmbeddingForwardKernel(int64_t n, int T, int C, int V,
                                       const int32_t* tokens, const float* wte,
                                       const float* wpe, float* out, int32_t* bad_index) {
  PT_GRID_STRIDE(i, n) {
    const int64_t row = i / C;  // b * T + t
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(row % T);
    const int32_t token = tokens[row];
    if (token < 0 || token >= V) {
      atomicMin(bad_index, static_cast<int32_t>(row));
      continue;
    }
    const float position = wpe == nullptr ? 0.0f : wpe[int64_t{t} * C + c];
    out[i] = wte[int64_t{token} * C + c] + position;
  }
}

// Deterministic: thread (c, slice) adds, in row order, every row whose token falls in its
// slice of the vocabulary (token % slices), so each dwte element is summed in the same order
// on every run and with any grid, as the cpu backend sums it (no atomicAdd). grid =
// (ceil(C / kThreads), kWteSlices), block = kThreads.
constexpr int kWteSlices = 64;

__global__ void EmbeddingBackwardWteKernel(int64_t rows, int C, int V, const int32_t* tokens,
                                           const float* dout, float* dwte,
                                           int32_t* bad_index) {
  const int c = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  const int slice = static_cast<int>(blockIdx.y);
  if (c >= C) return;
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t token = tokens[row];
    if (token < 0 || token >= V) {
      if (c == 0 && slice == 0) atomicMin(bad_index, static_cast<int32_t>(row));
      continue;
    }
    if (token % kWteSlices != slice) continue;
    dwte[int64_t{token} * C + c] += dout[row * C + c];
  }
}

// grid = rows, block = kRowThreads.
__global__ void LayerNormForwardKernel(int C, const float* x, const float* weight,
                                       const float* bias, float* out, float* mean_out,
                                       float* rstd_out) {
  __shared__ double scratch[kRowThreads];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * C;
  float* outr = out + row * C;
  double sum = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) sum += xr[c];
  const double mean = BlockSum(sum, scratch) / C;
  double sq = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double d = xr[c] - mean;
    sq += d * d;
  }
  const double var = BlockSum(sq, scratch) / C;  // biased variance
  const double rstd = 1.0 / sqrt(var + kLayerNormEps);
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    outr[c] = static_cast<float>((xr[c] - mean) * rstd * weight[c] + bias[c]);
  }
  if (threadIdx.x == 0) {
    if (mean_out != nullptr) mean_out[row] = static_cast<float>(mean);
    if (rstd_out != nullptr) rstd_out[row] = static_cast<float>(rstd);
  }
}

// grid = rows, block = kRowThreads. With xhat = (x - mean) rstd and g = dout * weight:
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
__global__ void LayerNormBackwardInputKernel(int C, const float* dout, const float* x,
                                             const float* weight, const float* mean,
                                             const float* rstd, float* dx) {
  __shared__ double scratch[kRowThreads];
  const int64_t row = blockIdx.x;
  const float* dr = dout + row * C;
  const float* xr = x + row * C;
  float* dxr = dx + row * C;
  const double mu = mean[row];
  const double rs = rstd[row];
  double sum_g = 0, sum_gx = 0;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double g = double{dr[c]} * weight[c];
    const double xhat = (xr[c] - mu) * rs;
    sum_g += g;
    sum_gx += g * xhat;
  }
  const double mean_g = BlockSum(sum_g, scratch) / C;
  const double mean_gx = BlockSum(sum_gx, scratch) / C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    const double g = double{dr[c]} * weight[c];
    const double xhat = (xr[c] - mu) * rs;
    dxr[c] = static_cast<float>(dxr[c] + rs * (g - mean_g - xhat * mean_gx));
  }
}

// Column sums like ColumnSumKernel: block (32, kColumnRows), fixed summation order.
constexpr int kColumnRows = 32;
__global__ void LayerNormBackwardParamsKernel(int rows, int C, const float* dout,
                                              const float* x, const float* mean,
                                              const float* rstd, float* dweight,
                                              float* dbias) {
  __shared__ double part_w[kColumnRows][32];
  __shared__ double part_b[kColumnRows][32];
  const int c = blockIdx.x * 32 + threadIdx.x;
  double sw = 0, sb = 0;
  if (c < C) {
    for (int r = threadIdx.y; r < rows; r += kColumnRows) {
      const int64_t i = int64_t{r} * C + c;
      const double d = dout[i];
      sw += d * ((x[i] - double{mean[r]}) * rstd[r]);
      sb += d;
    }
  }
  part_w[threadIdx.y][threadIdx.x] = sw;
  part_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    double tw = 0, tb = 0;
    for (int k = 0; k < kColumnRows; ++k) {
      tw += part_w[k][threadIdx.x];
      tb += part_b[k][threadIdx.x];
    }
    if (dweight != nullptr) dweight[c] = static_cast<float>(dweight[c] + tw);
    if (dbias != nullptr) dbias[c] = static_cast<float>(dbias[c] + tb);
  }
}

// grid = rows, block = kRowThreads. out may alias x: BlockSum ends with a barrier, so
// every read of the row is done before the first write.
__global__ void SoftmaxKernel(int cols, const float* x, float* out) {
  __shared__ double scratch[kRowThreads];
  __shared__ float scratch_max[kRowThreads];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  float* outr = out + row * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, xr[c]);
  const double max_x = BlockMax(m, scratch_max);
  double sum = 0;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += exp(xr[c] - max_x);
  sum = BlockSum(sum, scratch);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    outr[c] = static_cast<float>(exp(xr[c] - max_x) / sum);
  }
}

// grid = rows, block = kRowThreads. probs may alias logits: every thread reads the
// target's logit before any write, and each element is read then written by one thread.
__global__ void CrossEntropyForwardKernel(int V, const float* logits, const int32_t* targets,
                                          float* probs, double* row_loss,
                                          int32_t* bad_index) {
  __shared__ double scratch[kRowThreads];
  __shared__ float scratch_max[kRowThreads];
  const int64_t row = blockIdx.x;
  const float* lr = logits + row * V;
  float* pr = probs + row * V;
  const int32_t target = targets[row];
  if (target < 0 || target >= V) {  // uniform over the block: no barrier is skipped
    if (threadIdx.x == 0) {
      atomicMin(bad_index, static_cast<int32_t>(row));
      row_loss[row] = 0;
    }
    return;
  }
  const double target_logit = lr[target];
  float m = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) m = fmaxf(m, lr[v]);
  const double max_logit = BlockMax(m, scratch_max);
  double sum = 0;
  for (int v = threadIdx.x; v < V; v += blockDim.x) sum += exp(lr[v] - max_logit);
  sum = BlockSum(sum, scratch);  // ends with a barrier: all reads above are done
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    pr[v] = static_cast<float>(exp(lr[v] - max_logit) / sum);
  }
  // log-sum-exp form, as the reference: exact even where the probability underflows.
  if (threadIdx.x == 0) row_loss[row] = log(sum) + max_logit - target_logit;
}

__global__ void MeanKernel(int count, const double* values, float* mean) {
  __shared__ double scratch[kThreads];
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += values[i];
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) *mean = static_cast<float>(sum / count);
}

__global__ void CrossEntropyBackwardKernel(int64_t n, int V, const float* probs,
                                           const int32_t* targets, float scale,
                                           float* dlogits, int32_t* bad_index) {
  PT_GRID_STRIDE(i, n) {
    const int64_t row = i / V;
    const int v = static_cast<int>(i % V);
    const int32_t target = targets[row];
    if (target < 0 || target >= V) {
      atomicMin(bad_index, static_cast<int32_t>(row));
      continue;
    }
    dlogits[i] = (probs[i] - (v == target ? 1.0f : 0.0f)) * scale;
  }
}

}  // namespace

cudaError_t ResetBadIndex(int32_t* bad_index, cudaStream_t stream) {
  ResetBadIndexKernel<<<1, 1, 0, stream>>>(bad_index);
  return cudaGetLastError();
}

cudaError_t EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                             const float* wte, const float* wpe, float* out,
                             int32_t* bad_index, cudaStream_t stream) {
  const int64_t n = int64_t{B} * T * C;
  if (n <= 0) return cudaSuccess;
  EmbeddingForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(n, T, C, V, tokens, wte,
                                                               wpe, out, bad_index);
  return cudaGetLastError();
}

cudaError_t EmbeddingBackwardWte(int B, int T, int C, int V, const int32_t* tokens,
                                 const float* dout, float* dwte, int32_t* bad_index,
                                 cudaStream_t stream) {
  const int64_t rows = int64_t{B} * T;
  if (rows <= 0 || C <= 0 || dwte == nullptr) return cudaSuccess;
  const dim3 grid((C + kThreads - 1) / kThreads, kWteSlices);
  EmbeddingBackwardWteKernel<<<grid, kThreads, 0, stream>>>(rows, C, V, tokens, dout, dwte,
                                                            bad_index);
  return cudaGetLastError();
}

cudaError_t LayerNormForward(int rows, int C, const float* x, const float* weight,
                             const float* bias, float* out, float* mean, float* rstd,
                             cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return cudaSuccess;
  LayerNormForwardKernel<<<rows, kRowThreads, 0, stream>>>(C, x, weight, bias, out, mean,
                                                           rstd);
  return cudaGetLastError();
}

cudaError_t LayerNormBackwardInput(int rows, int C, const float* dout, const float* x,
                                   const float* weight, const float* mean,
                                   const float* rstd, float* dx, cudaStream_t stream) {
  if (rows <= 0 || C <= 0 || dx == nullptr) return cudaSuccess;
  LayerNormBackwardInputKernel<<<rows, kRowThreads, 0, stream>>>(C, dout, x, weight, mean,
                                                                 rstd, dx);
  return cudaGetLastError();
}

cudaError_t LayerNormBackwardParams(int rows, int C, const float* dout, const float* x,
                                    const float* mean, const float* rstd, float* dweight,
                                    float* dbias, cudaStream_t stream) {
  if (rows <= 0 || C <= 0 || (dweight == nullptr && dbias == nullptr)) return cudaSuccess;
  LayerNormBackwardParamsKernel<<<(C + 31) / 32, dim3(32, kColumnRows), 0, stream>>>(
      rows, C, dout, x, mean, rstd, dweight, dbias);
  return cudaGetLastError();
}

cudaError_t Softmax(int rows, int cols, const float* x, float* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  SoftmaxKernel<<<rows, kRowThreads, 0, stream>>>(cols, x, out);
  return cudaGetLastError();
}

cudaError_t CrossEntropyForward(int rows, int V, const float* logits,
                                const int32_t* targets, float* probs, double* row_loss,
                                float* loss, int32_t* bad_index, cudaStream_t stream) {
  if (rows <= 0 || V <= 0) return cudaSuccess;
  CrossEntropyForwardKernel<<<rows, kRowThreads, 0, stream>>>(V, logits, targets, probs,
                                                              row_loss, bad_index);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  MeanKernel<<<1, kThreads, 0, stream>>>(rows, row_loss, loss);
  return cudaGetLastError();
}

cudaError_t CrossEntropyBackward(int rows, int V, const float* probs,
                                 const int32_t* targets, float scale, float* dlogits,
                                 int32_t* bad_index, cudaStream_t stream) {
  const int64_t n = int64_t{rows} * V;
  if (n <= 0) return cudaSuccess;
  CrossEntropyBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(n, V, probs, targets,
                                                                   scale, dlogits,
                                                                   bad_index);
  return cudaGetLastError();
}

}  // namespace pipetrain::compute::cuda_kernels
