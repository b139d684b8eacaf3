// CUDA build of the `cuda` backend's bf16 products (cuda_backend.h, SetProductOperands):
// each operand's span is rounded to bf16 in scratch by cuda_kernels_bf16.cu, exactly as
// common/bf16.h rounds on the host, and cuBLAS multiplies the bf16 copies with fp32
// sums into the fp32 output, as the reference (reference_ops.h) and the cpu backend do.
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_status.h"

namespace pipetrain::compute {
namespace {

namespace ck = cuda_kernels;

cudaStream_t S(CUstream_st* s) { return s; }

size_t Bf16Bytes(int64_t elements) {
  return static_cast<size_t>(elements) * common::DTypeSize(common::DType::kBF16);
}

}  // namespace

absl::Status CudaBackend::SetProductOperands(common::DType operands) {
  return SetF32OrBf16Products(operands);
}

absl::Status CudaBackend::GemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                                   const float* a, int lda, int64_t stride_a, const float* b,
                                   int ldb, int64_t stride_b, float beta, float* c, int ldc,
                                   int64_t stride_c, int batch,
                                   absl::FunctionRef<std::string()> where,
                                   const uint16_t* a_bf16, const uint16_t* b_bf16) {
  // a is stored (m, k), or (k, m) when transposed; b (k, n), or (n, k). Only what the
  // product reads is rounded: from the first element to the last of the last matrix,
  // which includes what lies between rows (attention's other heads): rounded, not read.
  const int64_t a_elements =
      RowMajorSpan(trans_a ? k : m, trans_a ? m : k, lda, stride_a, batch);
  const int64_t b_elements =
      RowMajorSpan(trans_b ? n : k, trans_b ? k : n, ldb, stride_b, batch);
  const cudaStream_t s = S(stream_);
  const uint16_t* a16 = a_bf16;
  if (a16 == nullptr) {
    RETURN_IF_ERROR(EnsureScratch(&bf16_a_, &bf16_a_bytes_, Bf16Bytes(a_elements),
                                  "bf16 operand a"));
    CUDA_CHECK(ck::ToBf16Bits(a_elements, a, static_cast<uint16_t*>(bf16_a_), s), where(),
               ": rounding operand a (", a_elements, " elements) to bf16");
    a16 = static_cast<const uint16_t*>(bf16_a_);
  }
  const uint16_t* b16 = b_bf16;
  if (b16 == nullptr) {
    RETURN_IF_ERROR(EnsureScratch(&bf16_b_, &bf16_b_bytes_, Bf16Bytes(b_elements),
                                  "bf16 operand b"));
    CUDA_CHECK(ck::ToBf16Bits(b_elements, b, static_cast<uint16_t*>(bf16_b_), s), where(),
               ": rounding operand b (", b_elements, " elements) to bf16");
    b16 = static_cast<const uint16_t*>(bf16_b_);
  }

  // The same column-major mapping as Gemm (c^T = op(b)^T op(a)^T), on the copies, which
  // keep the leading dimensions and strides of the originals.
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (batch == 1) {
    CUBLAS_CHECK(cublasGemmEx(cublas_, op_b, op_a, n, m, k, &alpha, b16, CUDA_R_16BF, ldb, a16,
                              CUDA_R_16BF, lda, &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 where(), ": cublasGemmEx(bf16 operands, m=", m, " n=", n, " k=", k,
                 " trans_a=", trans_a, " trans_b=", trans_b, " lda=", lda, " ldb=", ldb,
                 " ldc=", ldc, ")");
  } else {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(cublas_, op_b, op_a, n, m, k, &alpha, b16,
                                            CUDA_R_16BF, ldb, stride_b, a16, CUDA_R_16BF, lda,
                                            stride_a, &beta, c, CUDA_R_32F, ldc, stride_c,
                                            batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 where(), ": cublasGemmStridedBatchedEx(bf16 operands, m=", m, " n=", n,
                 " k=", k, " trans_a=", trans_a, " trans_b=", trans_b, " lda=", lda,
                 " ldb=", ldb, " ldc=", ldc, " batch=", batch, ")");
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
