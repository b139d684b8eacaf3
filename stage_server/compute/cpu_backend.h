// The CPU backend: every matrix product through a Products engine (oneDNN's matmul by
// default, all heads of an attention product in one call; OpenBLAS as the measured
// baseline) and single-pass float loops for the rest, spread over the same threads
// (cpu_backend_loops.cc). Ops it does not override (the embedding's backward, the sum of
// squares: sums whose order a split would change) are the plain loops of HostBackendT.
#pragma once

#include <map>
#include <memory>
#include <unordered_map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stage_server/compute/host_backend.h"
#include "stage_server/compute/products.h"

namespace pipetrain::compute {

class CpuBackend : public HostBackendT<float> {
 public:
  enum class ProductEngine { kOneDnn, kOpenBlas };
  // `threads` is every op's thread count (OpenMP; with the OpenBLAS engine its products'
  // pthread count is process-wide, so there the last CpuBackend created decides).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(
      int threads, ProductEngine engine = ProductEngine::kOneDnn);
  // The engine alone, for a caller that measures products (the compute bench).
  static absl::StatusOr<std::unique_ptr<Products>> MakeProducts(ProductEngine engine,
                                                                int threads);

  ~CpuBackend() override;
  std::string Name() const override { return "cpu"; }

  // Freed blocks are kept for reuse by size: a training step allocates the same shapes
  // every time, so pages are first touched in the first step only. Not thread-safe
  // (neither is the backend as a whole: one executor thread drives it).
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  absl::Status Free(void* ptr) override;
  // f32 or bf16 products; the OpenBLAS engine has f32 only.
  absl::Status SetProductOperands(common::DType operands) override;
  int threads() const { return threads_; }

  absl::Status Matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                      const float* a, const float* b, float beta, float* c) override;
  // The copy is bf16 bits (2 bytes an element), which oneDNN's bf16 product reads as
  // they lie: only an operand given as values is rounded per call.
  int64_t ProductCopyBytes(int64_t n) const override;
  absl::Status MakeProductCopy(int64_t n, const float* x, void* copy) override;
  absl::Status MatmulByCopy(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                            ProductOperand<float> a, ProductOperand<float> b, float beta,
                            float* c) override;
  // cpu_backend_loops.cc: by rows, columns or elements over the backend's threads.
  absl::Status Add(int64_t n, const float* a, const float* b, float* out) override;
  absl::Status Axpy(int64_t n, float alpha, const float* x, float* y) override;
  absl::Status Scale(int64_t n, float alpha, float* x) override;
  absl::Status RoundToBf16(int64_t n, float* x) override;
  absl::Status AddBias(int rows, int cols, const float* bias, float* x) override;
  absl::Status EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                                const float* wte, const float* wpe, float* out) override;
  absl::Status Softmax(int rows, int cols, const float* x, float* out) override;
  absl::Status CrossEntropyBackward(int rows, int V, const float* probs,
                                    const int32_t* targets, float dloss_scale,
                                    float* dlogits) override;
  absl::Status AdamW(int64_t n, float* param, const float* grad, float* m, float* v,
                     float lr, float beta1, float beta2, float eps, float weight_decay,
                     int step) override;
  absl::Status BiasGrad(int rows, int cols, const float* dout, float* dbias) override;
  absl::Status LayerNormForward(int rows, int C, const float* x, const float* weight,
                                const float* bias, float* out, float* mean,
                                float* rstd) override;
  absl::Status LayerNormBackward(int rows, int C, const float* dout, const float* x,
                                 const float* weight, const float* mean,
                                 const float* rstd, float* dx, float* dweight,
                                 float* dbias) override;
  absl::Status GeluForward(int64_t n, const float* x, float* out) override;
  absl::Status GeluBackward(int64_t n, const float* x, const float* dout,
                            float* dx) override;
  absl::Status AttentionForward(int B, int T, int C, int NH, const float* qkv, float* out,
                                float* probs) override;
  absl::Status AttentionBackward(int B, int T, int C, int NH, const float* dout,
                                 const float* qkv, const float* probs,
                                 float* dqkv) override;
  absl::Status CrossEntropyForward(int rows, int V, const float* logits,
                                   const int32_t* targets, float* probs,
                                   float* loss) override;
  // cpu_backend_llama.cc: by rows (RMSNorm's weight gradient by columns).
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

 private:
  CpuBackend(int threads, ProductEngine engine, std::unique_ptr<Products> products);

  int threads_;
  int loop_threads_;  // the non-product loops' threads
  ProductEngine engine_;
  std::unique_ptr<Products> products_;
  std::vector<float> scratch_;  // (B, NH, T, T): d probs in attention backward
  std::map<size_t, std::vector<void*>> free_blocks_;  // rounded size -> cached blocks
  std::unordered_map<void*, size_t> block_bytes_;     // live block -> rounded size
};

}  // namespace pipetrain::compute
