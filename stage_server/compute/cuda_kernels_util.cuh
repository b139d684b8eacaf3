// Device helpers shared by the cuda_kernels_*.cu files: launch geometry for grid-stride
// loops, the bf16 rounding rule, and a block-wide sum in double (the reductions
// accumulate in double so that results match the double-precision reference well inside
// the fp32 error budget).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace pipetrain::compute::cuda_kernels {

// for (int64_t i ...) over [0, n) across the whole grid.
#define PT_GRID_STRIDE(i, n)                                                    \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

inline constexpr int kThreads = 256;  // threads per block for 1-D kernels

// Blocks for a grid-stride loop over n elements (n > 0); capped so the grid stays valid
// and each thread does a few elements for large n.
inline unsigned GridFor(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65536) blocks = 65536;
  return static_cast<unsigned>(blocks);
}

// Sum of `v` over the block (blockDim.x threads, a power of two <= 1024). Every thread
// gets the result. `scratch` holds blockDim.x doubles in shared memory. Contains
// __syncthreads(), so every thread of the block must call it.
__device__ inline double BlockSum(double v, double* scratch) {
  const int tid = threadIdx.x;
  scratch[tid] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (tid < stride) scratch[tid] += scratch[tid + stride];
    __syncthreads();
  }
  const double total = scratch[0];
  __syncthreads();  // scratch may be reused right after
  return total;
}

// The bf16 nearest to x, as its 16 bits: common/bf16.h's FloatToBf16Bits, the one
// rounding rule of the tree (nearest, ties to even; a NaN keeps its sign and comes out
// quiet), written with the device's bit cast. Not __float2bfloat16_rn: its portable
// path (cuda_bf16.hpp) turns every NaN into 0x7fff, dropping the sign the host keeps,
// and what the sm_80+ cvt instruction it uses does with a NaN is not ours to rely on.
__device__ inline uint16_t FloatToBf16Bits(float x) {
  const uint32_t bits = __float_as_uint(x);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// Maximum over the block, same contract as BlockSum.
__device__ inline float BlockMax(float v, float* scratch) {
  const int tid = threadIdx.x;
  scratch[tid] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (tid < stride) scratch[tid] = fmaxf(scratch[tid], scratch[tid + stride]);
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();
  return total;
}

}  // namespace pipetrain::compute::cuda_kernels
