// The `cuda` compute backend: tensors in device memory, cuBLAS for matrix products
// (full fp32 by default, TF32 tensor-op math on request) and plain kernels for the rest.
// CreateCudaBackend exists in every build; without CUDA (or without a GPU) it fails with
// a message that says so, so callers need no #ifdefs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "stage_server/compute/backend.h"

// The CUDA runtime's and cuBLAS's handle types, declared here so that this header needs
// no CUDA include (cudaStream_t is CUstream_st*, cublasHandle_t is cublasContext*).
struct CUstream_st;
struct cublasContext;

namespace pipetrain::compute {

class CudaStaging;
class OpCall;

struct CudaBackendOptions {
  // cuBLAS TF32 tensor-op math for every matrix product with fp32 operands (about 10 bits
  // of mantissa in the products: relative errors near 1e-4 instead of 1e-6). Off: full
  // fp32. bf16 products (SetProductOperands) are the same with it on or off.
  bool tf32 = false;
  // Synchronize after every op and check for errors, so that a fault in a kernel is
  // reported by the op that caused it rather than a later one. For tests and debugging;
  // it removes all overlap between the host and the device.
  bool check_every_op = false;
};

// The backend on GPU `device`. FailedPrecondition "no usable GPU: <reason>; use --device
// cpu" when there is none (or the build has no CUDA); InvalidArgument for a device index
// that does not exist.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device,
                                                           CudaBackendOptions options = {});

// Elements from the first to the last one a product reads of a row-major operand: `batch`
// matrices of (rows, cols) with leading dimension ld, `stride` elements apart. The bf16
// path rounds this contiguous span of each operand into scratch (cuda_backend_bf16.cc).
constexpr int64_t RowMajorSpan(int rows, int cols, int ld, int64_t stride, int batch) {
  return (int64_t{batch} - 1) * stride + (int64_t{rows} - 1) * ld + cols;
}

// Defined only in builds with CUDA (cuda_backend.cc); everything outside CUDA-only code
// should go through CreateCudaBackend and the Backend interface.
class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device,
                                                             CudaBackendOptions options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string Name() const override { return "cuda"; }
  // F32 or BF16 (cuda_backend_bf16.cc): with BF16, every product (Matmul and attention's
  // six) rounds the span of each operand it reads to bf16 scratch, then runs
  // cublasGemmEx / cublasGemmStridedBatchedEx on CUDA_R_16BF operands with a CUDA_R_32F
  // output and CUBLAS_COMPUTE_32F. The TF32 option does not change those: a bf16 value is
  // exact in TF32, and the sums are fp32 either way.
  absl::Status SetProductOperands(common::DType operands) override;
  int device() const { return device_; }
  bool tf32() const { return options_.tf32; }
  // The stream every op is issued on (a cudaStream_t), for timing with CUDA events.
  CUstream_st* stream() const { return stream_; }

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  absl::Status Free(void* ptr) override;
  absl::Status Zero(void* ptr, size_t bytes) override;
  // Host copies of 64 KiB and more from/to pageable memory go through pinned slots
  // (cuda_staging.h), so the CPU gathers one chunk while the DMA moves the previous one.
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyFromHostPieces(void* dst,
                                  std::span<const std::span<const std::byte>> pieces) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status Copy(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override;
  absl::Status Copy2D(int rows, int cols, const float* src, int64_t src_stride, float* dst,
                      int64_t dst_stride) override;

  absl::Status Matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                      const float* a, const float* b, float beta, float* c) override;
  // The copy is bf16 bits, which cublasGemmEx reads as they lie: only an operand given
  // as values is rounded.
  int64_t ProductCopyBytes(int64_t n) const override;
  absl::Status MakeProductCopy(int64_t n, const float* x, void* copy) override;
  absl::Status MatmulByCopy(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            ProductOperand<float> a, ProductOperand<float> b, float beta,
                            float* c) override;
  absl::Status Add(int64_t n, const float* a, const float* b, float* out) override;
  absl::Status Axpy(int64_t n, float alpha, const float* x, float* y) override;
  absl::Status Scale(int64_t n, float alpha, float* x) override;
  absl::Status RoundToBf16(int64_t n, float* x) override;
  absl::Status AddBias(int rows, int cols, const float* bias, float* x) override;
  absl::Status BiasGrad(int rows, int cols, const float* dout, float* dbias) override;
  absl::StatusOr<double> SumOfSquares(int64_t n, const float* x) override;
  absl::Status EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                                const float* wte, const float* wpe, float* out) override;
  absl::Status EmbeddingBackward(int B, int T, int C, int V, const int32_t* tokens,
                                 const float* dout, float* dwte, float* dwpe) override;
  absl::Status LayerNormForward(int rows, int C, const float* x, const float* weight,
                                const float* bias, float* out, float* mean,
                                float* rstd) override;
  absl::Status LayerNormBackward(int rows, int C, const float* dout, const float* x,
                                 const float* weight, const float* mean, const float* rstd,
                                 float* dx, float* dweight, float* dbias) override;
  absl::Status GeluForward(int64_t n, const float* x, float* out) override;
  absl::Status GeluBackward(int64_t n, const float* x, const float* dout,
                            float* dx) override;
  absl::Status AttentionForward(int B, int T, int C, int NH, const float* qkv, float* out,
                                float* probs) override;
  absl::Status AttentionBackward(int B, int T, int C, int NH, const float* dout,
                                 const float* qkv, const float* probs,
                                 float* dqkv) override;
  // cuda_backend_llama.cc: kernels of cuda_kernels_llama.cu.
  absl::Status RmsNormForward(int rows, int C, float eps, const float* x, const float* weight,
                              float* out, float* rstd) override;
  absl::Status RmsNormBackward(int rows, int C, const float* dout, const float* x,
                               const float* weight, const float* rstd, float* dx,
                               float* dweight) override;
  absl::Status Rotary(int rows, int T, int heads, int hs, int64_t stride, const float* cos,
                      const float* sin, bool inverse, float* x) override;
  absl::Status SwiGluForward(int rows, int F, const float* gu, float* out) override;
  absl::Status SwiGluBackward(int rows, int F, const float* gu, const float* dout,
                              float* dgu) override;
  absl::Status RepeatKv(int rows, int NH, int NKV, int hs, const float* qkv,
                        float* out) override;
  absl::Status SumKvGroups(int rows, int NH, int NKV, int hs, const float* dfull,
                           float* dqkv) override;
  absl::Status Softmax(int rows, int cols, const float* x, float* out) override;
  absl::Status CrossEntropyForward(int rows, int V, const float* logits,
                                   const int32_t* targets, float* probs,
                                   float* loss) override;
  absl::Status CrossEntropyBackward(int rows, int V, const float* probs,
                                    const int32_t* targets, float dloss_scale,
                                    float* dlogits) override;
  absl::Status AdamW(int64_t n, float* param, const float* grad, float* m, float* v,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     int step) override;

 private:
  // Defined in the .cc, where CudaStaging (held by unique_ptr) is a complete type.
  CudaBackend(int device, CudaBackendOptions options);

  // Returns every cached free block to the driver (when cudaMalloc runs out).
  absl::Status ReleaseCachedBlocks();
  // Makes device_ current for the calling thread (ops may come from any thread).
  absl::Status Activate(const char* op);
  // After an op's launches: with check_every_op, waits and reports faults as `op`.
  absl::Status Finish(const std::string& op);
  // The one preamble and epilogue of every op, run after its argument check
  // (op_checks.h): nothing for an empty call; otherwise Activate, then `launch` issues
  // the op's work on the stream it is given and returns a cudaError_t (reported as this
  // call) or an absl::Status, then Finish. Defined in cuda_backend_run.h, for the files
  // of ops.
  template <typename Launch>
  absl::Status Run(const OpCall& call, Launch&& launch);
  // Grows a scratch allocation to at least `bytes` (contents are not kept).
  absl::Status EnsureScratch(void** ptr, size_t* capacity, size_t bytes, const char* what);
  // Reads bad_index_ (synchronizing); InvalidArgument naming the first id outside
  // [0, V) if a kernel recorded one. `ids` is the device array the kernel checked.
  absl::Status CheckBadIndex(const OpCall& call, const int32_t* ids, int V, const char* what);
  // Row-major strided-batched product, like Matmul with leading dimensions (the row
  // strides of a, b, c) and per-batch element strides; batch 1 is a plain sgemm. With
  // bf16 products it hands the call to GemmBf16. An error names the call, then `part`
  // and batch row `row` of it when given.
  absl::Status Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    int lda, int64_t stride_a, const float* b, int ldb, int64_t stride_b,
                    float beta, float* c, int ldc, int64_t stride_c, int batch, const OpCall& call,
                    absl::string_view part = {}, int row = -1);
  // Gemm with bf16 operands (cuda_backend_bf16.cc): the same arguments, each operand's
  // span (RowMajorSpan) rounded into bf16_a_ / bf16_b_ first, but for an operand given
  // already in bf16 as `a_bf16` or `b_bf16` (a product copy; its float pointer is then not
  // read). `where` names the call in errors.
  absl::Status GemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                        const float* a, int lda, int64_t stride_a, const float* b, int ldb,
                        int64_t stride_b, float beta, float* c, int ldc, int64_t stride_c,
                        int batch, absl::FunctionRef<std::string()> where,
                        const uint16_t* a_bf16 = nullptr, const uint16_t* b_bf16 = nullptr);

  int device_;
  CudaBackendOptions options_;
  CUstream_st* stream_ = nullptr;
  cublasContext* cublas_ = nullptr;
  int32_t* bad_index_ = nullptr;  // (1) first position of an id outside [0, V)
  double* reduce_ = nullptr;      // (kReducePartials + 1): partial sums, then the total
  void* row_loss_ = nullptr;      // (rows) double: cross-entropy per row
  size_t row_loss_bytes_ = 0;
  void* attn_scratch_ = nullptr;  // (NH, T, T) float: d probs of one batch row
  size_t attn_scratch_bytes_ = 0;
  void* bf16_a_ = nullptr;  // (RowMajorSpan of a) bf16: a product's operand a, rounded
  size_t bf16_a_bytes_ = 0;
  void* bf16_b_ = nullptr;  // (RowMajorSpan of b) bf16: its operand b, rounded
  size_t bf16_b_bytes_ = 0;
  // Host <-> device copies through pinned slots; it has its own lock, and its slots are
  // allocated on the first large copy.
  std::unique_ptr<CudaStaging> staging_;

  // A caching allocator: layers allocate and free their activations every micro-batch,
  // and cudaFree waits for the whole device. Freed blocks are kept by size and handed
  // out again; that is safe because every op runs in order on stream_, so work still
  // reading a freed block finishes before any later op can write it.
  std::mutex alloc_mu_;
  std::unordered_map<void*, size_t> live_;  // allocated block -> its size
  std::multimap<size_t, void*> cached_;     // free blocks by size
  size_t cached_bytes_ = 0;
};

}  // namespace pipetrain::compute
