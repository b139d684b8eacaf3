// HostBackendT: a backend on host memory whose every op is the plain loop of
// reference_ops. In double it runs the GPT layers for finite-difference gradient checks;
// in float it is the baseline the optimised CPU backend (cpu_backend.h) overrides.
#pragma once

#include <cstdint>
#include <string>

#include "stage_server/compute/backend.h"

namespace pipetrain::compute {

template <typename Real>
class HostBackendT : public BackendT<Real> {
 public:
  std::string Name() const override;
  // f32 or bf16 products (reference_ops.h rounds the operands where the cpu backend does).
  absl::Status SetProductOperands(common::DType operands) override {
    return this->SetF32OrBf16Products(operands);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  absl::Status Free(void* ptr) override;
  absl::Status Zero(void* ptr, size_t bytes) override;
  absl::Status CopyFromHost(void* dst, const void* host_src, size_t bytes) override;
  absl::Status CopyToHost(void* host_dst, const void* src, size_t bytes) override;
  absl::Status Copy(void* dst, const void* src, size_t bytes) override;
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status Copy2D(int rows, int cols, const Real* src, int64_t src_stride, Real* dst,
                      int64_t dst_stride) override;

  absl::Status Matmul(bool trans_a, bool trans_b, int m, int n, int k, Real alpha,
                      const Real* a, const Real* b, Real beta, Real* c) override;
  // The copy is bf16 bits, as the cpu backend's (a double rounded through float, as
  // RoundToBf16 rounds it); MatmulByCopy widens a copy back to Real and runs Matmul
  // (rounding a bf16 value again gives it back).
  int64_t ProductCopyBytes(int64_t n) const override;
  absl::Status MakeProductCopy(int64_t n, const Real* x, void* copy) override;
  absl::Status MatmulByCopy(bool trans_a, bool trans_b, int m, int n, int k, Real alpha,
                            ProductOperand<Real> a, ProductOperand<Real> b, Real beta,
                            Real* c) override;
  absl::Status Add(int64_t n, const Real* a, const Real* b, Real* out) override;
  absl::Status Axpy(int64_t n, Real alpha, const Real* x, Real* y) override;
  absl::Status Scale(int64_t n, Real alpha, Real* x) override;
  absl::Status RoundToBf16(int64_t n, Real* x) override;
  absl::Status AddBias(int rows, int cols, const Real* bias, Real* x) override;
  absl::Status BiasGrad(int rows, int cols, const Real* dout, Real* dbias) override;
  absl::StatusOr<double> SumOfSquares(int64_t n, const Real* x) override;
  absl::Status EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                                const Real* wte, const Real* wpe, Real* out) override;
  absl::Status EmbeddingBackward(int B, int T, int C, int V, const int32_t* tokens,
                                 const Real* dout, Real* dwte, Real* dwpe) override;
  absl::Status LayerNormForward(int rows, int C, const Real* x, const Real* weight,
                                const Real* bias, Real* out, Real* mean,
                                Real* rstd) override;
  absl::Status LayerNormBackward(int rows, int C, const Real* dout, const Real* x,
                                 const Real* weight, const Real* mean, const Real* rstd,
                                 Real* dx, Real* dweight, Real* dbias) override;
  absl::Status GeluForward(int64_t n, const Real* x, Real* out) override;
  absl::Status GeluBackward(int64_t n, const Real* x, const Real* dout,
                            Real* dx) override;
  absl::Status AttentionForward(int B, int T, int C, int NH, const Real* qkv, Real* out,
                                Real* probs) override;
  absl::Status AttentionBackward(int B, int T, int C, int NH, const Real* dout,
                                 const Real* qkv, const Real* probs, Real* dqkv) override;
  absl::Status RmsNormForward(int rows, int C, float eps, const Real* x, const Real* weight,
                              Real* out, Real* rstd) override;
  absl::Status RmsNormBackward(int rows, int C, const Real* dout, const Real* x,
                               const Real* weight, const Real* rstd, Real* dx,
                               Real* dweight) override;
  absl::Status Rotary(int rows, int T, int heads, int hs, int64_t stride, const Real* cos,
                      const Real* sin, bool inverse, Real* x) override;
  absl::Status SwiGluForward(int rows, int F, const Real* gu, Real* out) override;
  absl::Status SwiGluBackward(int rows, int F, const Real* gu, const Real* dout,
                              Real* dgu) override;
  absl::Status RepeatKv(int rows, int NH, int NKV, int hs, const Real* qkv, Real* out) override;
  absl::Status SumKvGroups(int rows, int NH, int NKV, int hs, const Real* dfull,
                           Real* dqkv) override;
  absl::Status Softmax(int rows, int cols, const Real* x, Real* out) override;
  absl::Status CrossEntropyForward(int rows, int V, const Real* logits,
                                   const int32_t* targets, Real* probs,
                                   Real* loss) override;
  absl::Status CrossEntropyBackward(int rows, int V, const Real* probs,
                                    const int32_t* targets, Real dloss_scale,
                                    Real* dlogits) override;
  absl::Status AdamW(int64_t n, Real* param, const Real* grad, Real* m, Real* v, float lr,
                     float beta1, float beta2, float eps, float weight_decay,
                     int step) override;
};

using HostBackend = HostBackendT<float>;
using HostBackendDouble = HostBackendT<double>;

}  // namespace pipetrain::compute
