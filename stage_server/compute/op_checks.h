// The argument checks of every backend op, in one place: each backend calls the check of
// an op before doing anything, so that every backend accepts and rejects the same calls
// and says why in the same words ("<backend> backend: <Op>(<sizes>): <problem>").
// The checks read no tensor memory (it may be device memory); the contents of id tensors
// are checked by the backends (CheckHostIds, or a kernel) and reported by IdOutOfRange.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::compute {

// One call of a backend op as its checks and error messages see it: the op's name, its
// sizes (formatted only when a message needs them) and whether it has work to do. An
// empty call (some size 0, or no output asked for) is valid and touches no memory, so a
// backend returns at once; its pointers are not checked.
class OpCall {
 public:
  using Size = std::pair<const char*, int64_t>;  // (name, value); names are literals
  OpCall(const char* op, std::initializer_list<Size> sizes);

  const char* op() const { return op_; }
  bool empty() const { return empty_; }
  // "Matmul(m=7 n=5 k=9)"; the first five sizes.
  std::string ToString() const;

 private:
  friend class OpCheck;
  const char* op_;
  std::array<Size, 5> sizes_{};
  int num_sizes_ = 0;
  bool empty_ = false;
};

// Each returns the checked call, or InvalidArgument for a negative size, a null pointer
// the op would use, or a value outside the op's domain. Pointers are const void* so that
// one check serves every scalar type; shapes are those of backend.h.
// Both strides must be at least cols (rows may not overlap).
absl::StatusOr<OpCall> CheckCopy2D(absl::string_view backend, int rows, int cols, const void* src,
                                   int64_t src_stride, const void* dst, int64_t dst_stride);
absl::StatusOr<OpCall> CheckMatmul(absl::string_view backend, int m, int n, int k,
                                   const void* a, const void* b, const void* c);
// MatmulByCopy: Matmul's check on each operand's values or copy.
absl::StatusOr<OpCall> CheckMatmulByCopy(absl::string_view backend, int m, int n, int k,
                                         const void* a, const void* b, const void* c);
absl::StatusOr<OpCall> CheckMakeProductCopy(absl::string_view backend, int64_t n,
                                            const void* x, const void* copy);
absl::StatusOr<OpCall> CheckAdd(absl::string_view backend, int64_t n, const void* a,
                                const void* b, const void* out);
absl::StatusOr<OpCall> CheckAxpy(absl::string_view backend, int64_t n, const void* x,
                                 const void* y);
absl::StatusOr<OpCall> CheckScale(absl::string_view backend, int64_t n, const void* x);
absl::StatusOr<OpCall> CheckRoundToBf16(absl::string_view backend, int64_t n, const void* x);
absl::StatusOr<OpCall> CheckAddBias(absl::string_view backend, int rows, int cols,
                                    const void* bias, const void* x);
absl::StatusOr<OpCall> CheckBiasGrad(absl::string_view backend, int rows, int cols,
                                     const void* dout, const void* dbias);
absl::StatusOr<OpCall> CheckSumOfSquares(absl::string_view backend, int64_t n,
                                         const void* x);
absl::StatusOr<OpCall> CheckEmbeddingForward(absl::string_view backend, int B, int T, int C,
                                             int V, const void* tokens, const void* wte,
                                             const void* wpe, const void* out);
// Empty also when neither gradient is asked for.
absl::StatusOr<OpCall> CheckEmbeddingBackward(absl::string_view backend, int B, int T,
                                              int C, int V, const void* tokens,
                                              const void* dout, const void* dwte,
                                              const void* dwpe);
absl::StatusOr<OpCall> CheckLayerNormForward(absl::string_view backend, int rows, int C,
                                             const void* x, const void* weight,
                                             const void* bias, const void* out,
                                             const void* mean, const void* rstd);
// Empty also when none of dx, dweight, dbias is asked for; weight is needed for dx only.
absl::StatusOr<OpCall> CheckLayerNormBackward(absl::string_view backend, int rows, int C,
                                              const void* dout, const void* x,
                                              const void* weight, const void* mean,
                                              const void* rstd, const void* dx,
                                              const void* dweight, const void* dbias);
absl::StatusOr<OpCall> CheckGeluForward(absl::string_view backend, int64_t n, const void* x,
                                        const void* out);
absl::StatusOr<OpCall> CheckGeluBackward(absl::string_view backend, int64_t n,
                                         const void* x, const void* dout, const void* dx);
// NH must be positive and divide C.
absl::StatusOr<OpCall> CheckAttentionForward(absl::string_view backend, int B, int T, int C,
                                             int NH, const void* qkv, const void* out,
                                             const void* probs);
absl::StatusOr<OpCall> CheckAttentionBackward(absl::string_view backend, int B, int T,
                                              int C, int NH, const void* dout,
                                              const void* qkv, const void* probs,
                                              const void* dqkv);
// Llama's ops (backend.h). RmsNormForward: eps finite and positive.
absl::StatusOr<OpCall> CheckRmsNormForward(absl::string_view backend, int rows, int C, float eps,
                                           const void* x, const void* weight, const void* out,
                                           const void* rstd);
// Empty also when neither dx nor dweight is asked for; weight is needed for dx only.
absl::StatusOr<OpCall> CheckRmsNormBackward(absl::string_view backend, int rows, int C,
                                            const void* dout, const void* x, const void* weight,
                                            const void* rstd, const void* dx,
                                            const void* dweight);
// hs even, heads * hs <= stride, T positive where there are rows to rotate.
absl::StatusOr<OpCall> CheckRotary(absl::string_view backend, int rows, int T, int heads, int hs,
                                   int64_t stride, const void* cos, const void* sin,
                                   const void* x);
// The outputs that backend.h says must not overlap an input are refused when they are the
// same pointer (the checks compare pointers, not ranges).
absl::StatusOr<OpCall> CheckSwiGluForward(absl::string_view backend, int rows, int F,
                                          const void* gu, const void* out);
absl::StatusOr<OpCall> CheckSwiGluBackward(absl::string_view backend, int rows, int F,
                                           const void* gu, const void* dout, const void* dgu);
// NH and NKV positive, NKV dividing NH.
absl::StatusOr<OpCall> CheckRepeatKv(absl::string_view backend, int rows, int NH, int NKV, int hs,
                                     const void* qkv, const void* out);
absl::StatusOr<OpCall> CheckSumKvGroups(absl::string_view backend, int rows, int NH, int NKV,
                                        int hs, const void* dfull, const void* dqkv);
absl::StatusOr<OpCall> CheckSoftmax(absl::string_view backend, int rows, int cols, const void* x,
                                    const void* out);
// The mean loss needs rows > 0 and V > 0: never empty.
absl::StatusOr<OpCall> CheckCrossEntropyForward(absl::string_view backend, int rows, int V,
                                                const void* logits, const void* targets,
                                                const void* probs, const void* loss);
absl::StatusOr<OpCall> CheckCrossEntropyBackward(absl::string_view backend, int rows, int V,
                                                 const void* probs, const void* targets,
                                                 const void* dlogits);
// step counts from 1.
absl::StatusOr<OpCall> CheckAdamW(absl::string_view backend, int64_t n, const void* param,
                                  const void* grad, const void* m, const void* v, int step);

// FailedPrecondition for MakeProductCopy and MatmulByCopy while the products take fp32:
// a weight's product copy exists only with bf16 products.
absl::Status ProductCopyWithoutBf16(absl::string_view backend, const OpCall& call);

// InvalidArgument "<backend> backend: <call>: <what>[<position>] = <id> is outside the
// vocabulary [0, V)": the one wording of a bad token or target on every backend.
absl::Status IdOutOfRange(absl::string_view backend, const OpCall& call, const char* what,
                          int64_t position, int32_t id, int V);
// For backends whose memory is host memory: IdOutOfRange for the first of the n ids
// outside [0, V), else OK.
absl::Status CheckHostIds(absl::string_view backend, const OpCall& call, const char* what,
                          const int32_t* ids, int64_t n, int V);

}  // namespace pipetrain::compute
