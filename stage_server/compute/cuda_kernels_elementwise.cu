// Elementwise and reduction kernels of the CUDA backend: fill, add, axpy, scale, bias,
// column sums (bias gradients), sum of squares, GELU and AdamW. Simple grid-stride
// loops, one element per iteration; reductions accumulate in double.
#include <cmath>

#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_kernels_util.cuh"

namespace pipetrain::compute::cuda_kernels {
namespace {

__global__ void FillKernel(int64_t n, float value, float* x) {
  PT_GRID_STRIDE(i, n) x[i] = value;
}

__global__ void AddKernel(int64_t n, const float* a, const float* b, float* out) {
  PT_GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void AxpyKernel(int64_t n, float alpha, const float* x, float* y) {
  PT_GRID_STRIDE(i, n) y[i] += alpha * x[i];
}

__global__ void ScaleKernel(int64_t n, float alpha, float* x) {
  PT_GRID_STRIDE(i, n) x[i] *= alpha;
}

// x rounded to bf16 in place, by the one device rounding rule (cuda_kernels_util.cuh).
__global__ void RoundToBf16Kernel(int64_t n, float* x) {
  PT_GRID_STRIDE(i, n) x[i] = __uint_as_float(uint32_t{FloatToBf16Bits(x[i])} << 16);
}

__global__ void AddBiasKernel(int64_t n, int cols, const float* bias, float* x) {
  PT_GRID_STRIDE(i, n) x[i] += bias[i % cols];
}

// Block (32, kColumnRows): threadIdx.x picks a column of the block's 32, threadIdx.y a
// residue class of rows; the kColumnRows partial sums are then added in a fixed order,
// so the result does not depend on scheduling.
constexpr int kColumnRows = 32;
__global__ void ColumnSumKernel(int rows, int64_t cols, int64_t row_stride,
                                const float* in, float* out) {
  __shared__ double partial[kColumnRows][32];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  double sum = 0;
  if (c < cols) {
    for (int r = threadIdx.y; r < rows; r += kColumnRows) sum += in[r * row_stride + c];
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    double total = 0;
    for (int k = 0; k < kColumnRows; ++k) total += partial[k][threadIdx.x];
    out[c] = static_cast<float>(double{out[c]} + total);
  }
}

__global__ void SquaresPartialKernel(int64_t n, const float* x, double* partials) {
  __shared__ double scratch[kThreads];
  double sum = 0;
  PT_GRID_STRIDE(i, n) {
    const double v = x[i];
    sum += v * v;
  }
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One block of kThreads sums `count` partials.
__global__ void SumPartialsKernel(int count, const double* partials, double* total) {
  __shared__ double scratch[kThreads];
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += partials[i];
  sum = BlockSum(sum, scratch);
  if (threadIdx.x == 0) *total = sum;
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__global__ void GeluForwardKernel(int64_t n, const float* x, float* out) {
  PT_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    out[i] = 0.5f * v * (1.0f + tanhf(u));
  }
}

__global__ void GeluBackwardKernel(int64_t n, const float* x, const float* dout,
                                   float* dx) {
  PT_GRID_STRIDE(i, n) {
    const float v = x[i];
    const float u = kGeluScale * (v + kGeluCubic * v * v * v);
    const float th = tanhf(u);
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    const float grad = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * du;
    dx[i] = dout[i] * grad;  // dout read before dx written: aliasing is fine
  }
}

// Same arithmetic as reference::AdamW (double per element).
__global__ void AdamWKernel(int64_t n, float* param, const float* grad, float* m,
                            float* v, float lr, float beta1, float beta2, float eps,
                            float weight_decay, double bc1, double bc2) {
  PT_GRID_STRIDE(i, n) {
    const double g = grad[i];
    double p = param[i];
    p -= double{lr} * weight_decay * p;
    const double mi = beta1 * double{m[i]} + (1 - double{beta1}) * g;
    const double vi = beta2 * double{v[i]} + (1 - double{beta2}) * g * g;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    p -= lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
    param[i] = static_cast<float>(p);
  }
}

}  // namespace

cudaError_t Fill(int64_t n, float value, float* x, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  FillKernel<<<GridFor(n), kThreads, 0, stream>>>(n, value, x);
  return cudaGetLastError();
}

cudaError_t Add(int64_t n, const float* a, const float* b, float* out,
                cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AddKernel<<<GridFor(n), kThreads, 0, stream>>>(n, a, b, out);
  return cudaGetLastError();
}

cudaError_t Axpy(int64_t n, float alpha, const float* x, float* y, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AxpyKernel<<<GridFor(n), kThreads, 0, stream>>>(n, alpha, x, y);
  return cudaGetLastError();
}

cudaError_t Scale(int64_t n, float alpha, float* x, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ScaleKernel<<<GridFor(n), kThreads, 0, stream>>>(n, alpha, x);
  return cudaGetLastError();
}

cudaError_t RoundToBf16(int64_t n, float* x, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  RoundToBf16Kernel<<<GridFor(n), kThreads, 0, stream>>>(n, x);
  return cudaGetLastError();
}

cudaError_t AddBias(int rows, int cols, const float* bias, float* x, cudaStream_t stream) {
  const int64_t n = int64_t{rows} * cols;
  if (n <= 0) return cudaSuccess;
  AddBiasKernel<<<GridFor(n), kThreads, 0, stream>>>(n, cols, bias, x);
  return cudaGetLastError();
}

cudaError_t ColumnSum(int rows, int64_t cols, int64_t row_stride, const float* in,
                      float* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t blocks = (cols + 31) / 32;
  if (blocks > 0x7fffffff) return cudaErrorInvalidValue;
  ColumnSumKernel<<<static_cast<unsigned>(blocks), dim3(32, kColumnRows), 0, stream>>>(
      rows, cols, row_stride, in, out);
  return cudaGetLastError();
}

cudaError_t SumOfSquares(int64_t n, const float* x, double* partials, double* total,
                         cudaStream_t stream) {
  if (n <= 0) return cudaMemsetAsync(total, 0, sizeof(double), stream);
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kReducePartials) blocks = kReducePartials;
  SquaresPartialKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(n, x,
                                                                               partials);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  SumPartialsKernel<<<1, kThreads, 0, stream>>>(static_cast<int>(blocks), partials, total);
  return cudaGetLastError();
}

cudaError_t GeluForward(int64_t n, const float* x, float* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  GeluForwardKernel<<<GridFor(n), kThreads, 0, stream>>>(n, x, out);
  return cudaGetLastError();
}

cudaError_t GeluBackward(int64_t n, const float* x, const float* dout, float* dx,
                         cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  GeluBackwardKernel<<<GridFor(n), kThreads, 0, stream>>>(n, x, dout, dx);
  return cudaGetLastError();
}

cudaError_t AdamW(int64_t n, float* param, const float* grad, float* m, float* v,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  double bias_correction1, double bias_correction2, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  AdamWKernel<<<GridFor(n), kThreads, 0, stream>>>(n, param, grad, m, v, lr, beta1, beta2,
                                                   eps, weight_decay, bias_correction1,
                                                   bias_correction2);
  return cudaGetLastError();
}

}  // namespace pipetrain::compute::cuda_kernels
