// CUDA build of the `cuda` backend (cuda_backend.h): the shared argument checks
// (op_checks.h), cuBLAS calls and the launchers of cuda_kernels.h, every CUDA and cuBLAS
// result turned into an absl::Status that names the op and its shapes.
#include "stage_server/compute/cuda_backend.h"

#include <climits>
#include <cmath>
#include <type_traits>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda_probe.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "stage_server/compute/cuda_kernels.h"
#include "stage_server/compute/cuda_staging.h"
#include "stage_server/compute/cuda_status.h"
#include "stage_server/compute/op_checks.h"

namespace pipetrain::compute {
namespace {

namespace ck = cuda_kernels;

absl::Status CublasStatus(cublasStatus_t s, const std::string& what) {
  std::string msg = absl::StrCat("cuda backend: ", what, ": ", cublasGetStatusName(s), " (",
                                 cublasGetStatusString(s), ")");
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

// CUBLAS_CHECK: CUDA_CHECK (cuda_status.h) for cuBLAS results.
#define CUBLAS_CHECK(expr, ...)                                          \
  do {                                                                   \
    if (cublasStatus_t _pt_s = (expr); _pt_s != CUBLAS_STATUS_SUCCESS) { \
      return CublasStatus(_pt_s, absl::StrCat(__VA_ARGS__));             \
    }                                                                    \
  } while (false)

cudaStream_t S(CUstream_st* s) { return s; }

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(int device,
                                                           CudaBackendOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaBackend> backend,
                   CudaBackend::Create(device, options));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device,
                                                                 CudaBackendOptions options) {
  const common::CudaProbe& probe = common::ProbeCuda();
  if (probe.devices.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable GPU: ", probe.reason, "; use --device cpu"));
  }
  if (device < 0 || device >= static_cast<int>(probe.devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat("cuda backend: device ", device,
                                                   " does not exist (", probe.devices.size(),
                                                   " GPU(s) found)"));
  }
  // The constructor is private, so no make_unique; the destructor frees whatever was
  // created if a later step fails.
  std::unique_ptr<CudaBackend> b(new CudaBackend(device, options));
  CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice(", device, ")");
  cudaStream_t stream = nullptr;
  // A blocking stream (not cudaStreamNonBlocking): work on the legacy default stream,
  // e.g. cudaMemcpy by other code, stays ordered with it.
  CUDA_CHECK(cudaStreamCreate(&stream), "cudaStreamCreate on device ", device);
  b->stream_ = stream;
  b->staging_ = std::make_unique<CudaStaging>(stream);
  cublasHandle_t handle = nullptr;
  CUBLAS_CHECK(cublasCreate(&handle), "cublasCreate on device ", device);
  b->cublas_ = handle;
  CUBLAS_CHECK(cublasSetStream(handle, stream), "cublasSetStream");
  CUBLAS_CHECK(cublasSetMathMode(handle, options.tf32 ? CUBLAS_TF32_TENSOR_OP_MATH
                                                      : CUBLAS_DEFAULT_MATH),
               "cublasSetMathMode(", options.tf32 ? "TF32" : "default", ")");
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, sizeof(int32_t)), "cudaMalloc(bad index)");
  b->bad_index_ = static_cast<int32_t*>(p);
  CUDA_CHECK(cudaMalloc(&p, (ck::kReducePartials + 1) * sizeof(double)),
             "cudaMalloc(reduction scratch)");
  b->reduce_ = static_cast<double*>(p);
  common::LogInfo("cuda", absl::StrCat("backend on device ", device, " (",
                                       probe.devices[device].name, "), matmul ",
                                       options.tf32 ? "tf32" : "fp32"));
  return b;
}

CudaBackend::CudaBackend(int device, CudaBackendOptions options)
    : device_(device), options_(options) {}

CudaBackend::~CudaBackend() {
  // Errors here have nowhere to go; a device that faulted reports them on every call.
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(S(stream_));
  staging_.reset();  // its events and pinned slots go before the stream they were used on
  {
    std::lock_guard<std::mutex> lock(alloc_mu_);
    (void)ReleaseCachedBlocks();
    // Blocks still live belong to owners that outlived the backend; free them too so
    // the device memory is not lost (their owners must not use them any more).
    for (auto& [p, size] : live_) cudaFree(p);
    live_.clear();
  }
  cudaFree(bad_index_);
  cudaFree(reduce_);
  cudaFree(row_loss_);
  cudaFree(attn_scratch_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  if (stream_ != nullptr) cudaStreamDestroy(S(stream_));
}

absl::Status CudaBackend::Activate(const char* op) {
  CUDA_CHECK(cudaSetDevice(device_), op, ": cudaSetDevice(", device_, ")");
  return absl::OkStatus();
}

absl::Status CudaBackend::Finish(const std::string& op) {
  if (!options_.check_every_op) return absl::OkStatus();
  CUDA_CHECK(cudaStreamSynchronize(S(stream_)), op, " (checked after the op)");
  CUDA_CHECK(cudaGetLastError(), op, " (checked after the op)");
  return absl::OkStatus();
}

absl::Status CudaBackend::EnsureScratch(void** ptr, size_t* capacity, size_t bytes,
                                        const char* what) {
  if (*capacity >= bytes) return absl::OkStatus();
  // cudaFree waits for the device, so work still using the old buffer completes first.
  CUDA_CHECK(cudaFree(*ptr), "cudaFree(", what, ")");
  *ptr = nullptr;
  *capacity = 0;
  CUDA_CHECK(cudaMalloc(ptr, bytes), "cudaMalloc(", what, ", ", bytes, " bytes)");
  *capacity = bytes;
  return absl::OkStatus();
}

absl::Status CudaBackend::CheckBadIndex(const OpCall& call, const int32_t* ids, int V,
                                        const char* what) {
  int32_t bad = 0;
  CUDA_CHECK(cudaMemcpyAsync(&bad, bad_index_, sizeof(bad), cudaMemcpyDeviceToHost,
                             S(stream_)),
             call.ToString(), ": reading the id check");
  CUDA_CHECK(cudaStreamSynchronize(S(stream_)), call.ToString());
  if (bad == INT_MAX) return absl::OkStatus();
  int32_t id = 0;
  CUDA_CHECK(cudaMemcpy(&id, ids + bad, sizeof(id), cudaMemcpyDeviceToHost),
             call.ToString(), ": reading the bad id");
  return IdOutOfRange(Name(), call, what, bad, id, V);
}

// The one preamble and epilogue of every op (see the header).
template <typename Launch>
absl::Status CudaBackend::Run(const OpCall& call, Launch&& launch) {
  if (call.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(Activate(call.op()));
  using Result = std::invoke_result_t<Launch, cudaStream_t>;
  if constexpr (std::is_same_v<Result, cudaError_t>) {
    CUDA_CHECK(launch(S(stream_)), call.ToString());
  } else {
    RETURN_IF_ERROR(launch(S(stream_)));
  }
  if (!options_.check_every_op) return absl::OkStatus();
  return Finish(call.ToString());
}

// ---- Memory -----------------------------------------------------------------------------

absl::StatusOr<void*> CudaBackend::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  RETURN_IF_ERROR(Activate("Allocate"));
  // Round up so that blocks of nearly the same size are shared; 256 bytes is
  // cudaMalloc's own alignment, so every block stays aligned for any element type.
  const size_t rounded = (bytes + 255) / 256 * 256;
  std::lock_guard<std::mutex> lock(alloc_mu_);
  // The smallest cached block that fits, if it wastes at most a quarter of itself.
  if (auto it = cached_.lower_bound(rounded);
      it != cached_.end() && it->first - rounded <= it->first / 4) {
    void* p = it->second;
    live_[p] = it->first;
    cached_bytes_ -= it->first;
    cached_.erase(it);
    return p;
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, rounded);
  if (e == cudaErrorMemoryAllocation && cached_bytes_ > 0) {
    cudaGetLastError();  // clear it, give the cache back, and try once more
    RETURN_IF_ERROR(ReleaseCachedBlocks());
    e = cudaMalloc(&p, rounded);
  }
  CUDA_CHECK(e, "Allocate(", bytes, " bytes)");
  live_[p] = rounded;
  return p;
}

absl::Status CudaBackend::Free(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(alloc_mu_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    return absl::InvalidArgumentError(
        "cuda backend: Free of a pointer this backend did not allocate (or freed twice)");
  }
  cached_.emplace(it->second, ptr);
  cached_bytes_ += it->second;
  live_.erase(it);
  return absl::OkStatus();
}

absl::Status CudaBackend::ReleaseCachedBlocks() {
  // Called with alloc_mu_ held. cudaFree waits for the device, so no op still uses them.
  absl::Status status;
  for (auto& [size, p] : cached_) {
    if (cudaError_t e = cudaFree(p); e != cudaSuccess && status.ok()) {
      status = CudaStatus(e, absl::StrCat("cudaFree of a cached block of ", size, " bytes"));
    }
  }
  cached_.clear();
  cached_bytes_ = 0;
  return status;
}

absl::Status CudaBackend::Zero(void* ptr, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("Zero"));
  CUDA_CHECK(cudaMemsetAsync(ptr, 0, bytes, S(stream_)), "Zero(", bytes, " bytes)");
  return Finish("Zero");
}

absl::Status CudaBackend::CopyFromHost(void* dst, const void* host_src, size_t bytes) {
  const std::span<const std::byte> piece(static_cast<const std::byte*>(host_src), bytes);
  return CopyFromHostPieces(dst, std::span<const std::span<const std::byte>>(&piece, 1));
}

absl::Status CudaBackend::CopyFromHostPieces(
    void* dst, std::span<const std::span<const std::byte>> pieces) {
  size_t bytes = 0;
  for (const auto& piece : pieces) bytes += piece.size();
  if (bytes == 0) return absl::OkStatus();
  const std::string op =
      pieces.size() == 1
          ? absl::StrCat("CopyFromHost(", bytes, " bytes)")
          : absl::StrCat("CopyFromHostPieces(", bytes, " bytes in ", pieces.size(), " pieces)");
  RETURN_IF_ERROR(Activate("CopyFromHost"));
  RETURN_IF_ERROR(staging_->ToDevice(dst, pieces, op));
  return Finish(op);
}

absl::Status CudaBackend::CopyToHost(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("CopyToHost"));
  return staging_->ToHost(host_dst, src, bytes, absl::StrCat("CopyToHost(", bytes, " bytes)"));
}

absl::Status CudaBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Activate("Copy"));
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, S(stream_)),
             "Copy(", bytes, " bytes)");
  return Finish("Copy");
}

absl::Status CudaBackend::Synchronize() {
  RETURN_IF_ERROR(Activate("Synchronize"));
  CUDA_CHECK(cudaStreamSynchronize(S(stream_)), "Synchronize (a fault in an earlier op)");
  return absl::OkStatus();
}

// ---- Matrix products --------------------------------------------------------------------

absl::Status CudaBackend::Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                               const float* a, int lda, int64_t stride_a, const float* b,
                               int ldb, int64_t stride_b, float beta, float* c, int ldc,
                               int64_t stride_c, int batch, const OpCall& call,
                               absl::string_view part, int row) {
  // cuBLAS is column-major. A row-major (m, n) matrix is the column-major (n, m) matrix
  // with the same leading dimension, so c^T = op(b)^T op(a)^T is computed with the
  // operands swapped and the transposes kept.
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Built only on failure: "AttentionForward(B=2 T=7 C=12 NH=3) scores b=1".
  auto where = [&] {
    return absl::StrCat(call.ToString(), part.empty() ? "" : " ", part,
                        row < 0 ? "" : absl::StrCat(" b=", row));
  };
  if (batch == 1) {
    CUBLAS_CHECK(cublasSgemm(cublas_, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c,
                             ldc),
                 where(), ": cublasSgemm(m=", m, " n=", n, " k=", k, " trans_a=", trans_a,
                 " trans_b=", trans_b, " lda=", lda, " ldb=", ldb, " ldc=", ldc, ")");
  } else {
    CUBLAS_CHECK(cublasSgemmStridedBatched(cublas_, op_b, op_a, n, m, k, &alpha, b, ldb,
                                           stride_b, a, lda, stride_a, &beta, c, ldc,
                                           stride_c, batch),
                 where(), ": cublasSgemmStridedBatched(m=", m, " n=", n, " k=", k,
                 " trans_a=", trans_a, " trans_b=", trans_b, " lda=", lda, " ldb=", ldb,
                 " ldc=", ldc, " batch=", batch, ")");
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Matmul(bool trans_a, bool trans_b, int m, int n, int k,
                                 float alpha, const float* a, const float* b, float beta,
                                 float* c) {
  ASSIGN_OR_RETURN(const OpCall call, CheckMatmul(Name(), m, n, k, a, b, c));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    if (k == 0) {  // c = beta * c; beta = 0 must overwrite garbage (NaN * 0 is NaN)
      const int64_t count = int64_t{m} * n;
      if (beta == 0.0f) {
        CUDA_CHECK(ck::Fill(count, 0.0f, c, s), call.ToString(), ": fill");
      } else {
        CUDA_CHECK(ck::Scale(count, beta, c, s), call.ToString(), ": scale");
      }
      return absl::OkStatus();
    }
    // Row-major leading dimensions: the row length of each stored matrix.
    const int lda = trans_a ? m : k;  // a is (k, m) or (m, k)
    const int ldb = trans_b ? k : n;  // b is (n, k) or (k, n)
    return Gemm(trans_a, trans_b, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c, n, 0, 1,
                call);
  });
}

// ---- Elementwise ------------------------------------------------------------------------

absl::Status CudaBackend::Add(int64_t n, const float* a, const float* b, float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAdd(Name(), n, a, b, out));
  return Run(call, [&](cudaStream_t s) { return ck::Add(n, a, b, out, s); });
}

absl::Status CudaBackend::Axpy(int64_t n, float alpha, const float* x, float* y) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAxpy(Name(), n, x, y));
  return Run(call, [&](cudaStream_t s) { return ck::Axpy(n, alpha, x, y, s); });
}

absl::Status CudaBackend::Scale(int64_t n, float alpha, float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckScale(Name(), n, x));
  return Run(call, [&](cudaStream_t s) { return ck::Scale(n, alpha, x, s); });
}

absl::Status CudaBackend::AddBias(int rows, int cols, const float* bias, float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAddBias(Name(), rows, cols, bias, x));
  return Run(call, [&](cudaStream_t s) { return ck::AddBias(rows, cols, bias, x, s); });
}

absl::Status CudaBackend::BiasGrad(int rows, int cols, const float* dout, float* dbias) {
  ASSIGN_OR_RETURN(const OpCall call, CheckBiasGrad(Name(), rows, cols, dout, dbias));
  return Run(call,
             [&](cudaStream_t s) { return ck::ColumnSum(rows, cols, cols, dout, dbias, s); });
}

absl::StatusOr<double> CudaBackend::SumOfSquares(int64_t n, const float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSumOfSquares(Name(), n, x));
  double result = 0;
  RETURN_IF_ERROR(Run(call, [&](cudaStream_t s) -> absl::Status {
    double* total = reduce_ + ck::kReducePartials;
    CUDA_CHECK(ck::SumOfSquares(n, x, reduce_, total, s), call.ToString());
    CUDA_CHECK(cudaMemcpyAsync(&result, total, sizeof(result), cudaMemcpyDeviceToHost, s),
               call.ToString(), ": reading the result");
    CUDA_CHECK(cudaStreamSynchronize(s), call.ToString());
    return absl::OkStatus();
  }));
  return result;
}

// ---- Embedding --------------------------------------------------------------------------

absl::Status CudaBackend::EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                                           const float* wte, const float* wpe, float* out) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckEmbeddingForward(Name(), B, T, C, V, tokens, wte, wpe, out));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    CUDA_CHECK(ck::ResetBadIndex(bad_index_, s), call.ToString(), ": reset id check");
    CUDA_CHECK(ck::EmbeddingForward(B, T, C, V, tokens, wte, wpe, out, bad_index_, s),
               call.ToString());
    // Synchronizes: a bad token must fail this call, as the interface promises.
    return CheckBadIndex(call, tokens, V, "tokens");
  });
}

absl::Status CudaBackend::EmbeddingBackward(int B, int T, int C, int V,
                                            const int32_t* tokens, const float* dout,
                                            float* dwte, float* dwpe) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckEmbeddingBackward(Name(), B, T, C, V, tokens, dout, dwte, dwpe));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    if (dwpe != nullptr) {
      // dwpe[t, c] += sum_b dout[b, t, c]: a column sum over B rows of length T*C.
      const int64_t cols = int64_t{T} * C;
      CUDA_CHECK(ck::ColumnSum(B, cols, cols, dout, dwpe, s), call.ToString(), ": dwpe");
    }
    if (dwte == nullptr) return absl::OkStatus();
    CUDA_CHECK(ck::ResetBadIndex(bad_index_, s), call.ToString(), ": reset id check");
    CUDA_CHECK(ck::EmbeddingBackwardWte(B, T, C, V, tokens, dout, dwte, bad_index_, s),
               call.ToString(), ": dwte");
    return CheckBadIndex(call, tokens, V, "tokens");
  });
}

// ---- LayerNorm --------------------------------------------------------------------------

absl::Status CudaBackend::LayerNormForward(int rows, int C, const float* x,
                                           const float* weight, const float* bias,
                                           float* out, float* mean, float* rstd) {
  ASSIGN_OR_RETURN(const OpCall call, CheckLayerNormForward(Name(), rows, C, x, weight,
                                                            bias, out, mean, rstd));
  return Run(call, [&](cudaStream_t s) {
    return ck::LayerNormForward(rows, C, x, weight, bias, out, mean, rstd, s);
  });
}

absl::Status CudaBackend::LayerNormBackward(int rows, int C, const float* dout,
                                            const float* x, const float* weight,
                                            const float* mean, const float* rstd, float* dx,
                                            float* dweight, float* dbias) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckLayerNormBackward(Name(), rows, C, dout, x, weight, mean, rstd, dx,
                                          dweight, dbias));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    CUDA_CHECK(ck::LayerNormBackwardInput(rows, C, dout, x, weight, mean, rstd, dx, s),
               call.ToString(), ": dx");
    CUDA_CHECK(
        ck::LayerNormBackwardParams(rows, C, dout, x, mean, rstd, dweight, dbias, s),
        call.ToString(), ": dweight/dbias");
    return absl::OkStatus();
  });
}

// ---- GELU -------------------------------------------------------------------------------

absl::Status CudaBackend::GeluForward(int64_t n, const float* x, float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluForward(Name(), n, x, out));
  return Run(call, [&](cudaStream_t s) { return ck::GeluForward(n, x, out, s); });
}

absl::Status CudaBackend::GeluBackward(int64_t n, const float* x, const float* dout,
                                       float* dx) {
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluBackward(Name(), n, x, dout, dx));
  return Run(call, [&](cudaStream_t s) { return ck::GeluBackward(n, x, dout, dx, s); });
}

// ---- Attention --------------------------------------------------------------------------
// Per batch row b, with q, k, v the (T, hs) slices of head h (row stride 3C) and the
// heads as the batch of a strided-batched product (head h starts h*hs further along):
//   forward:  probs = causal_softmax(q k^T / sqrt(hs));  out = probs v
//   backward: dP = dout v^T;  dS = probs * (dP - rowsum(probs * dP)) / sqrt(hs);
//             dq = dS k;  dk = dS^T q;  dv = probs^T dout
// The products run over the full (T, T) matrices; probs is zero above the diagonal, so
// the result is exact, at twice the arithmetic of a causal-aware kernel.

absl::Status CudaBackend::AttentionForward(int B, int T, int C, int NH, const float* qkv,
                                           float* out, float* probs) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckAttentionForward(Name(), B, T, C, NH, qkv, out, probs));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    const int hs = C / NH;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
    const int64_t tt = int64_t{T} * T;
    for (int b = 0; b < B; ++b) {
      const float* q = qkv + int64_t{b} * T * 3 * C;  // (T, 3C) rows of batch row b
      const float* k = q + C;
      float* p = probs + int64_t{b} * NH * tt;  // (NH, T, T)
      RETURN_IF_ERROR(Gemm(false, true, T, T, hs, scale, q, 3 * C, hs, k, 3 * C, hs, 0.0f,
                           p, T, tt, NH, call, "scores", b));
    }
    CUDA_CHECK(ck::CausalSoftmaxForward(int64_t{B} * NH * T, T, probs, s), call.ToString(),
               ": causal softmax");
    for (int b = 0; b < B; ++b) {
      const float* v = qkv + int64_t{b} * T * 3 * C + 2 * C;
      const float* p = probs + int64_t{b} * NH * tt;
      float* o = out + int64_t{b} * T * C;  // (T, C) rows of batch row b
      RETURN_IF_ERROR(Gemm(false, false, T, hs, T, 1.0f, p, T, tt, v, 3 * C, hs, 0.0f, o, C,
                           hs, NH, call, "probs@v", b));
    }
    return absl::OkStatus();
  });
}

absl::Status CudaBackend::AttentionBackward(int B, int T, int C, int NH, const float* dout,
                                            const float* qkv, const float* probs,
                                            float* dqkv) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckAttentionBackward(Name(), B, T, C, NH, dout, qkv, probs, dqkv));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    const int hs = C / NH;
    const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hs)));
    const int64_t tt = int64_t{T} * T;
    RETURN_IF_ERROR(EnsureScratch(&attn_scratch_, &attn_scratch_bytes_,
                                  NH * tt * sizeof(float), "attention scratch"));
    float* dp = static_cast<float*>(attn_scratch_);  // (NH, T, T), reused for every b
    for (int b = 0; b < B; ++b) {
      const float* q = qkv + int64_t{b} * T * 3 * C;
      const float* k = q + C;
      const float* v = q + 2 * C;
      const float* p = probs + int64_t{b} * NH * tt;
      const float* d_o = dout + int64_t{b} * T * C;
      float* dq = dqkv + int64_t{b} * T * 3 * C;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      RETURN_IF_ERROR(Gemm(false, true, T, T, hs, 1.0f, d_o, C, hs, v, 3 * C, hs, 0.0f, dp,
                           T, tt, NH, call, "dout@v^T", b));
      CUDA_CHECK(ck::CausalSoftmaxBackward(int64_t{NH} * T, T, p, dp, scale, s),
                 call.ToString(), " b=", b, ": causal softmax backward");
      RETURN_IF_ERROR(Gemm(false, false, T, hs, T, 1.0f, dp, T, tt, k, 3 * C, hs, 0.0f, dq,
                           3 * C, hs, NH, call, "dq", b));
      RETURN_IF_ERROR(Gemm(true, false, T, hs, T, 1.0f, dp, T, tt, q, 3 * C, hs, 0.0f, dk,
                           3 * C, hs, NH, call, "dk", b));
      RETURN_IF_ERROR(Gemm(true, false, T, hs, T, 1.0f, p, T, tt, d_o, C, hs, 0.0f, dv,
                           3 * C, hs, NH, call, "dv", b));
    }
    return absl::OkStatus();
  });
}

// ---- Cross-entropy ----------------------------------------------------------------------

absl::Status CudaBackend::CrossEntropyForward(int rows, int V, const float* logits,
                                              const int32_t* targets, float* probs,
                                              float* loss) {
  ASSIGN_OR_RETURN(const OpCall call, CheckCrossEntropyForward(Name(), rows, V, logits,
                                                               targets, probs, loss));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    RETURN_IF_ERROR(EnsureScratch(&row_loss_, &row_loss_bytes_, rows * sizeof(double),
                                  "cross-entropy row losses"));
    CUDA_CHECK(ck::ResetBadIndex(bad_index_, s), call.ToString(), ": reset id check");
    CUDA_CHECK(ck::CrossEntropyForward(rows, V, logits, targets, probs,
                                       static_cast<double*>(row_loss_), loss, bad_index_, s),
               call.ToString());
    return CheckBadIndex(call, targets, V, "targets");
  });
}

absl::Status CudaBackend::CrossEntropyBackward(int rows, int V, const float* probs,
                                               const int32_t* targets, float dloss_scale,
                                               float* dlogits) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCrossEntropyBackward(Name(), rows, V, probs, targets, dlogits));
  return Run(call, [&](cudaStream_t s) -> absl::Status {
    CUDA_CHECK(ck::ResetBadIndex(bad_index_, s), call.ToString(), ": reset id check");
    CUDA_CHECK(ck::CrossEntropyBackward(rows, V, probs, targets, dloss_scale, dlogits,
                                        bad_index_, s),
               call.ToString());
    return CheckBadIndex(call, targets, V, "targets");
  });
}

// ---- Optimizer --------------------------------------------------------------------------

absl::Status CudaBackend::AdamW(int64_t n, float* param, const float* grad, float* m,
                                float* v, float lr, float beta1, float beta2, float eps,
                                float weight_decay, int step) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAdamW(Name(), n, param, grad, m, v, step));
  return Run(call, [&](cudaStream_t s) {
    const double bc1 = 1 - std::pow(double{beta1}, step);
    const double bc2 = 1 - std::pow(double{beta2}, step);
    return ck::AdamW(n, param, grad, m, v, lr, beta1, beta2, eps, weight_decay, bc1, bc2, s);
  });
}

}  // namespace pipetrain::compute
