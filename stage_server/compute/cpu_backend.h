// The CPU backend: every matrix product through a Products engine (oneDNN's matmul by
// default, all heads of an attention product in one call; OpenBLAS as the measured
// baseline) and single-pass float loops for the rest. Ops it does not override are the
// plain loops of HostBackendT, which are already memory-bound.
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
  // `threads` is the matrix products' thread count (OpenBLAS's is process-wide, so with
  // it the last CpuBackend created decides); the other loops are single-threaded so the
  // total never exceeds `threads` (no oversubscription).
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(
      int threads, ProductEngine engine = ProductEngine::kOneDnn);

  ~CpuBackend() override;
  std::string Name() const override { return "cpu"; }

  // Freed blocks are kept for reuse by size: a training step allocates the same shapes
  // every time, so pages are first touched in the first step only. Not thread-safe
  // (neither is the backend as a whole: one executor thread drives it).
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  absl::Status Free(void* ptr) override;
  int threads() const { return threads_; }
  // "onednn" or "openblas".
  std::string product_engine() const { return products_->Name(); }

  absl::Status Matmul(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
                      const float* a, const float* b, float beta, float* c) override;
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

 private:
  CpuBackend(int threads, std::unique_ptr<Products> products);

  int threads_;
  std::unique_ptr<Products> products_;
  std::vector<float> scratch_;  // (B, NH, T, T): d probs in attention backward
  std::map<size_t, std::vector<void*>> free_blocks_;  // rounded size -> cached blocks
  std::unordered_map<void*, size_t> block_bytes_;     // live block -> rounded size
};

}  // namespace pipetrain::compute
