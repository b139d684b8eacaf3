// CUDA build of the cuda backend's Llama ops (backend.h): the shared argument check
// (op_checks.h), then a launcher of cuda_kernels_llama.cu through CudaBackend::Run.
#include <cuda_runtime_api.h>

#include "common/status_macros.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/cuda_backend_run.h"
#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/op_checks.h"

namespace pipetrain::compute {

namespace ck = cuda_kernels;

absl::Status CudaBackend::RmsNormForward(int rows, int C, float eps, const float* x,
                                         const float* weight, float* out, float* rstd) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRmsNormForward(Name(), rows, C, eps, x, weight, out, rstd));
  return Run(call, [&](cudaStream_t s) {
    return ck::RmsNormForward(rows, C, eps, x, weight, out, rstd, s);
  });
}

absl::Status CudaBackend::RmsNormBackward(int rows, int C, const float* dout, const float* x,
                                          const float* weight, const float* rstd, float* dx,
                                          float* dweight) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRmsNormBackward(Name(), rows, C, dout, x, weight, rstd, dx, dweight));
  return Run(call, [&](cudaStream_t s) {
    return ck::RmsNormBackward(rows, C, dout, x, weight, rstd, dx, dweight, s);
  });
}

absl::Status CudaBackend::Rotary(int rows, int T, int heads, int hs, int64_t stride,
                                 const float* cos, const float* sin, bool inverse, float* x) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRotary(Name(), rows, T, heads, hs, stride, cos, sin, x));
  return Run(call, [&](cudaStream_t s) {
    return ck::Rotary(rows, T, heads, hs, stride, cos, sin, inverse, x, s);
  });
}

absl::Status CudaBackend::SwiGluForward(int rows, int F, const float* gu, float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSwiGluForward(Name(), rows, F, gu, out));
  return Run(call, [&](cudaStream_t s) { return ck::SwiGluForward(rows, F, gu, out, s); });
}

absl::Status CudaBackend::SwiGluBackward(int rows, int F, const float* gu, const float* dout,
                                         float* dgu) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSwiGluBackward(Name(), rows, F, gu, dout, dgu));
  return Run(call,
             [&](cudaStream_t s) { return ck::SwiGluBackward(rows, F, gu, dout, dgu, s); });
}

absl::Status CudaBackend::RepeatKv(int rows, int NH, int NKV, int hs, const float* qkv,
                                   float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckRepeatKv(Name(), rows, NH, NKV, hs, qkv, out));
  return Run(call, [&](cudaStream_t s) { return ck::RepeatKv(rows, NH, NKV, hs, qkv, out, s); });
}

absl::Status CudaBackend::SumKvGroups(int rows, int NH, int NKV, int hs, const float* dfull,
                                      float* dqkv) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSumKvGroups(Name(), rows, NH, NKV, hs, dfull, dqkv));
  return Run(call,
             [&](cudaStream_t s) { return ck::SumKvGroups(rows, NH, NKV, hs, dfull, dqkv, s); });
}

}  // namespace pipetrain::compute
