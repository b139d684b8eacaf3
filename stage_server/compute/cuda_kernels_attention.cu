// The causal softmax of attention, forward and backward, in place on the (T, T) score
// matrices of every (batch, head); the matrix products around it go through cuBLAS
// (cuda_backend.cc). One block per row; sums in double, like the reference.
#include <cmath>

#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_kernels_util.cuh"

namespace pipetrain::compute::cuda_kernels {
namespace {

constexpr int kRowThreads = 128;

// grid = rows, block = kRowThreads. Row r is query t = r % T; keys j <= t take part.
__global__ void CausalSoftmaxForwardKernel(int T, float* scores) {
  __shared__ double scratch[kRowThreads];
  __shared__ float scratch_max[kRowThreads];
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(row % T);
  float* s = scores + row * T;
  float m = -INFINITY;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) m = fmaxf(m, s[j]);
  const double max_score = BlockMax(m, scratch_max);
  double sum = 0;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) sum += exp(s[j] - max_score);
  sum = BlockSum(sum, scratch);  // ends with a barrier: all reads above are done
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    s[j] = j <= t ? static_cast<float>(exp(s[j] - max_score) / sum) : 0.0f;
  }
}

// grid = rows, block = kRowThreads. d = probs * (dprobs - <probs, dprobs>) * scale.
__global__ void CausalSoftmaxBackwardKernel(int T, const float* probs, float* dprobs,
                                            float scale) {
  __shared__ double scratch[kRowThreads];
  const int64_t row = blockIdx.x;
  const int t = static_cast<int>(row % T);
  const float* p = probs + row * T;
  float* d = dprobs + row * T;
  double dot = 0;
  for (int j = threadIdx.x; j <= t; j += blockDim.x) dot += double{p[j]} * d[j];
  dot = BlockSum(dot, scratch);
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    d[j] = j <= t ? static_cast<float>(p[j] * (d[j] - dot) * scale) : 0.0f;
  }
}

}  // namespace

cudaError_t CausalSoftmaxForward(int64_t rows, int T, float* scores, cudaStream_t stream) {
  if (rows <= 0 || T <= 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  CausalSoftmaxForwardKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      T, scores);
  return cudaGetLastError();
}

cudaError_t CausalSoftmaxBackward(int64_t rows, int T, const float* probs, float* dprobs,
                                  float scale, cudaStream_t stream) {
  if (rows <= 0 || T <= 0) return cudaSuccess;
  if (rows > 0x7fffffff) return cudaErrorInvalidValue;
  CausalSoftmaxBackwardKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
      T, probs, dprobs, scale);
  return cudaGetLastError();
}

}  // namespace pipetrain::compute::cuda_kernels
