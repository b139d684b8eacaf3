// The bf16 kernel of the CUDA backend's products: fp32 operands rounded to bf16 bits in
// a scratch buffer, which cuBLAS then reads as CUDA_R_16BF (cuda_backend_bf16.cc).
#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_kernels_util.cuh"

namespace pipetrain::compute::cuda_kernels {
namespace {

__global__ void ToBf16BitsKernel(int64_t n, const float* x, uint16_t* out) {
  PT_GRID_STRIDE(i, n) out[i] = FloatToBf16Bits(x[i]);
}

}  // namespace

cudaError_t ToBf16Bits(int64_t n, const float* x, uint16_t* out, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  ToBf16BitsKernel<<<GridFor(n), kThreads, 0, stream>>>(n, x, out);
  return cudaGetLastError();
}

}  // namespace pipetrain::compute::cuda_kernels
