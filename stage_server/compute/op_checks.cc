#include "stage_server/compute/op_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pipetrain::compute {

OpCall::OpCall(const char* op, std::initializer_list<Size> sizes) : op_(op) {
  for (const Size& s : sizes) {
    if (num_sizes_ == static_cast<int>(sizes_.size())) break;  // messages show the first 5
    sizes_[num_sizes_++] = s;
  }
}

std::string OpCall::ToString() const {
  std::string out = absl::StrCat(op_, "(");
  for (int i = 0; i < num_sizes_; ++i) {
    absl::StrAppend(&out, i == 0 ? "" : " ", sizes_[i].first, "=", sizes_[i].second);
  }
  out += ")";
  return out;
}

// Builds one OpCall and keeps the first problem found. The order of the checks is the
// order of the questions: are the sizes sizes, are the values in the op's domain, is
// there any work, and only then are the pointers that work needs there.
class OpCheck {
 public:
  OpCheck(absl::string_view backend, const char* op, std::initializer_list<OpCall::Size> sizes)
      : backend_(backend), call_(op, sizes) {
    for (const auto& [name, value] : sizes) {
      if (value < 0) {
        Fail(absl::StrCat(name, " = ", value, " is negative"));
        break;
      }
    }
  }

  OpCheck& Require(bool ok, absl::string_view problem) {
    if (status_.ok() && !ok) Fail(problem);
    return *this;
  }
  // Require for what matters only to a call with work to do (pointers that must differ).
  OpCheck& RequireIfWork(bool ok, absl::string_view problem) {
    return call_.empty_ ? *this : Require(ok, problem);
  }
  OpCheck& EmptyIf(bool empty) {
    call_.empty_ = call_.empty_ || empty;
    return *this;
  }
  OpCheck& Need(std::initializer_list<std::pair<const char*, const void*>> pointers) {
    if (!status_.ok() || call_.empty_) return *this;
    for (const auto& [name, p] : pointers) {
      if (p == nullptr) {
        Fail(absl::StrCat(name, " is null"));
        break;
      }
    }
    return *this;
  }
  OpCheck& NeedIf(bool needed, const char* name, const void* p) {
    return needed ? Need({{name, p}}) : *this;
  }

  absl::StatusOr<OpCall> Done() const {
    if (!status_.ok()) return status_;
    return call_;
  }

 private:
  void Fail(absl::string_view problem) {
    status_ = absl::InvalidArgumentError(
        absl::StrCat(backend_, " backend: ", call_.ToString(), ": ", problem));
  }

  absl::string_view backend_;
  OpCall call_;
  absl::Status status_;
};

absl::StatusOr<OpCall> CheckCopy2D(absl::string_view backend, int rows, int cols, const void* src,
                                   int64_t src_stride, const void* dst, int64_t dst_stride) {
  return OpCheck(backend, "Copy2D",
                 {{"rows", rows},
                  {"cols", cols},
                  {"src_stride", src_stride},
                  {"dst_stride", dst_stride}})
      .Require(src_stride >= cols, "src_stride is less than cols")
      .Require(dst_stride >= cols, "dst_stride is less than cols")
      .EmptyIf(rows == 0 || cols == 0)
      .Need({{"src", src}, {"dst", dst}})
      .Done();
}

absl::StatusOr<OpCall> CheckMatmul(absl::string_view backend, int m, int n, int k,
                                   const void* a, const void* b, const void* c) {
  // k = 0 is work: c = beta * c.
  return OpCheck(backend, "Matmul", {{"m", m}, {"n", n}, {"k", k}})
      .EmptyIf(m == 0 || n == 0)
      .Need({{"c", c}})
      .NeedIf(k > 0, "a", a)
      .NeedIf(k > 0, "b", b)
      .Done();
}

absl::StatusOr<OpCall> CheckMatmulByCopy(absl::string_view backend, int m, int n, int k,
                                         const void* a, const void* b, const void* c) {
  return OpCheck(backend, "MatmulByCopy", {{"m", m}, {"n", n}, {"k", k}})
      .EmptyIf(m == 0 || n == 0)
      .Need({{"c", c}})
      .NeedIf(k > 0, "a", a)
      .NeedIf(k > 0, "b", b)
      .Done();
}

absl::StatusOr<OpCall> CheckMakeProductCopy(absl::string_view backend, int64_t n,
                                            const void* x, const void* copy) {
  return OpCheck(backend, "MakeProductCopy", {{"n", n}})
      .EmptyIf(n == 0)
      .Need({{"x", x}, {"copy", copy}})
      .Done();
}

absl::Status ProductCopyWithoutBf16(absl::string_view backend, const OpCall& call) {
  return absl::FailedPreconditionError(
      absl::StrCat(backend, " backend: ", call.ToString(),
                   ": a weight's product copy exists only with bf16 products"));
}

absl::StatusOr<OpCall> CheckAdd(absl::string_view backend, int64_t n, const void* a,
                                const void* b, const void* out) {
  return OpCheck(backend, "Add", {{"n", n}})
      .EmptyIf(n == 0)
      .Need({{"a", a}, {"b", b}, {"out", out}})
      .Done();
}

absl::StatusOr<OpCall> CheckAxpy(absl::string_view backend, int64_t n, const void* x,
                                 const void* y) {
  return OpCheck(backend, "Axpy", {{"n", n}}).EmptyIf(n == 0).Need({{"x", x}, {"y", y}}).Done();
}

absl::StatusOr<OpCall> CheckScale(absl::string_view backend, int64_t n, const void* x) {
  return OpCheck(backend, "Scale", {{"n", n}}).EmptyIf(n == 0).Need({{"x", x}}).Done();
}

absl::StatusOr<OpCall> CheckRoundToBf16(absl::string_view backend, int64_t n, const void* x) {
  return OpCheck(backend, "RoundToBf16", {{"n", n}}).EmptyIf(n == 0).Need({{"x", x}}).Done();
}

absl::StatusOr<OpCall> CheckAddBias(absl::string_view backend, int rows, int cols,
                                    const void* bias, const void* x) {
  return OpCheck(backend, "AddBias", {{"rows", rows}, {"cols", cols}})
      .EmptyIf(rows == 0 || cols == 0)
      .Need({{"bias", bias}, {"x", x}})
      .Done();
}

absl::StatusOr<OpCall> CheckBiasGrad(absl::string_view backend, int rows, int cols,
                                     const void* dout, const void* dbias) {
  return OpCheck(backend, "BiasGrad", {{"rows", rows}, {"cols", cols}})
      .EmptyIf(rows == 0 || cols == 0)
      .Need({{"dout", dout}, {"dbias", dbias}})
      .Done();
}

absl::StatusOr<OpCall> CheckSumOfSquares(absl::string_view backend, int64_t n,
                                         const void* x) {
  return OpCheck(backend, "SumOfSquares", {{"n", n}}).EmptyIf(n == 0).Need({{"x", x}}).Done();
}

absl::StatusOr<OpCall> CheckEmbeddingForward(absl::string_view backend, int B, int T, int C,
                                             int V, const void* tokens, const void* wte,
                                             const void* wpe, const void* out) {
  return OpCheck(backend, "EmbeddingForward", {{"B", B}, {"T", T}, {"C", C}, {"V", V}})
      .EmptyIf(int64_t{B} * T * C == 0)
      .Need({{"tokens", tokens}, {"wte", wte}, {"out", out}})  // wpe: optional
      .Done();
}

absl::StatusOr<OpCall> CheckEmbeddingBackward(absl::string_view backend, int B, int T,
                                              int C, int V, const void* tokens,
                                              const void* dout, const void* dwte,
                                              const void* dwpe) {
  return OpCheck(backend, "EmbeddingBackward", {{"B", B}, {"T", T}, {"C", C}, {"V", V}})
      .EmptyIf(int64_t{B} * T * C == 0 || (dwte == nullptr && dwpe == nullptr))
      .Need({{"tokens", tokens}, {"dout", dout}})
      .Done();
}

absl::StatusOr<OpCall> CheckLayerNormForward(absl::string_view backend, int rows, int C,
                                             const void* x, const void* weight,
                                             const void* bias, const void* out,
                                             const void* mean, const void* rstd) {
  return OpCheck(backend, "LayerNormForward", {{"rows", rows}, {"C", C}})
      .EmptyIf(rows == 0 || C == 0)
      .Need({{"x", x},
             {"weight", weight},
             {"bias", bias},
             {"out", out},
             {"mean", mean},
             {"rstd", rstd}})
      .Done();
}

absl::StatusOr<OpCall> CheckLayerNormBackward(absl::string_view backend, int rows, int C,
                                              const void* dout, const void* x,
                                              const void* weight, const void* mean,
                                              const void* rstd, const void* dx,
                                              const void* dweight, const void* dbias) {
  return OpCheck(backend, "LayerNormBackward", {{"rows", rows}, {"C", C}})
      .EmptyIf(rows == 0 || C == 0 ||
               (dx == nullptr && dweight == nullptr && dbias == nullptr))
      .Need({{"dout", dout}, {"x", x}, {"mean", mean}, {"rstd", rstd}})
      .NeedIf(dx != nullptr, "weight", weight)
      .Done();
}

absl::StatusOr<OpCall> CheckGeluForward(absl::string_view backend, int64_t n, const void* x,
                                        const void* out) {
  return OpCheck(backend, "GeluForward", {{"n", n}})
      .EmptyIf(n == 0)
      .Need({{"x", x}, {"out", out}})
      .Done();
}

absl::StatusOr<OpCall> CheckGeluBackward(absl::string_view backend, int64_t n,
                                         const void* x, const void* dout, const void* dx) {
  return OpCheck(backend, "GeluBackward", {{"n", n}})
      .EmptyIf(n == 0)
      .Need({{"x", x}, {"dout", dout}, {"dx", dx}})
      .Done();
}

namespace {
bool HeadsDivide(int C, int NH) { return NH > 0 && C % NH == 0; }
constexpr absl::string_view kHeadsProblem = "NH must be positive and divide C";
}  // namespace

absl::StatusOr<OpCall> CheckAttentionForward(absl::string_view backend, int B, int T, int C,
                                             int NH, const void* qkv, const void* out,
                                             const void* probs) {
  return OpCheck(backend, "AttentionForward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}})
      .Require(HeadsDivide(C, NH), kHeadsProblem)
      .EmptyIf(int64_t{B} * T * C == 0)
      .Need({{"qkv", qkv}, {"out", out}, {"probs", probs}})
      .Done();
}

absl::StatusOr<OpCall> CheckAttentionBackward(absl::string_view backend, int B, int T,
                                              int C, int NH, const void* dout,
                                              const void* qkv, const void* probs,
                                              const void* dqkv) {
  return OpCheck(backend, "AttentionBackward", {{"B", B}, {"T", T}, {"C", C}, {"NH", NH}})
      .Require(HeadsDivide(C, NH), kHeadsProblem)
      .EmptyIf(int64_t{B} * T * C == 0)
      .Need({{"dout", dout}, {"qkv", qkv}, {"probs", probs}, {"dqkv", dqkv}})
      .Done();
}

// ---- Llama ------------------------------------------------------------------------------

absl::StatusOr<OpCall> CheckRmsNormForward(absl::string_view backend, int rows, int C, float eps,
                                           const void* x, const void* weight, const void* out,
                                           const void* rstd) {
  const bool eps_ok = std::isfinite(eps) && eps > 0;
  return OpCheck(backend, "RmsNormForward", {{"rows", rows}, {"C", C}})
      .Require(eps_ok, eps_ok ? "" : absl::StrCat("eps = ", eps, " must be finite and positive"))
      .EmptyIf(rows == 0 || C == 0)
      .Need({{"x", x}, {"weight", weight}, {"out", out}, {"rstd", rstd}})
      .Done();
}

absl::StatusOr<OpCall> CheckRmsNormBackward(absl::string_view backend, int rows, int C,
                                            const void* dout, const void* x, const void* weight,
                                            const void* rstd, const void* dx,
                                            const void* dweight) {
  return OpCheck(backend, "RmsNormBackward", {{"rows", rows}, {"C", C}})
      .EmptyIf(rows == 0 || C == 0 || (dx == nullptr && dweight == nullptr))
      .Need({{"dout", dout}, {"x", x}, {"rstd", rstd}})
      .NeedIf(dx != nullptr, "weight", weight)
      .Done();
}

absl::StatusOr<OpCall> CheckRotary(absl::string_view backend, int rows, int T, int heads, int hs,
                                   int64_t stride, const void* cos, const void* sin,
                                   const void* x) {
  const bool fits = int64_t{heads} * hs <= stride;
  return OpCheck(backend, "Rotary",
                 {{"rows", rows}, {"T", T}, {"heads", heads}, {"hs", hs}, {"stride", stride}})
      .Require(hs % 2 == 0, "hs must be even (the two halves of a head are the pairs)")
      .Require(fits, fits ? "" : absl::StrCat("heads * hs = ", int64_t{heads} * hs,
                                              " is more than stride"))
      .Require(T > 0 || rows == 0, "T must be positive (row r is position r % T)")
      .EmptyIf(rows == 0 || heads == 0 || hs == 0)
      .Need({{"cos", cos}, {"sin", sin}, {"x", x}})
      .Done();
}

absl::StatusOr<OpCall> CheckSwiGluForward(absl::string_view backend, int rows, int F,
                                          const void* gu, const void* out) {
  return OpCheck(backend, "SwiGluForward", {{"rows", rows}, {"F", F}})
      .EmptyIf(rows == 0 || F == 0)
      .Need({{"gu", gu}, {"out", out}})
      .RequireIfWork(out != gu, "out must not overlap gu")
      .Done();
}

absl::StatusOr<OpCall> CheckSwiGluBackward(absl::string_view backend, int rows, int F,
                                           const void* gu, const void* dout, const void* dgu) {
  return OpCheck(backend, "SwiGluBackward", {{"rows", rows}, {"F", F}})
      .EmptyIf(rows == 0 || F == 0)
      .Need({{"gu", gu}, {"dout", dout}, {"dgu", dgu}})
      .RequireIfWork(dgu != gu, "dgu must not alias gu")
      .RequireIfWork(dgu != dout, "dgu must not alias dout")
      .Done();
}

namespace {
bool KvHeadsDivide(int NH, int NKV) { return NH > 0 && NKV > 0 && NH % NKV == 0; }
constexpr absl::string_view kKvHeadsProblem = "NH and NKV must be positive and NKV must divide NH";
}  // namespace

absl::StatusOr<OpCall> CheckRepeatKv(absl::string_view backend, int rows, int NH, int NKV, int hs,
                                     const void* qkv, const void* out) {
  return OpCheck(backend, "RepeatKv", {{"rows", rows}, {"NH", NH}, {"NKV", NKV}, {"hs", hs}})
      .Require(KvHeadsDivide(NH, NKV), kKvHeadsProblem)
      .EmptyIf(rows == 0 || hs == 0)
      .Need({{"qkv", qkv}, {"out", out}})
      .RequireIfWork(out != qkv, "out must not overlap qkv")
      .Done();
}

absl::StatusOr<OpCall> CheckSumKvGroups(absl::string_view backend, int rows, int NH, int NKV,
                                        int hs, const void* dfull, const void* dqkv) {
  return OpCheck(backend, "SumKvGroups", {{"rows", rows}, {"NH", NH}, {"NKV", NKV}, {"hs", hs}})
      .Require(KvHeadsDivide(NH, NKV), kKvHeadsProblem)
      .EmptyIf(rows == 0 || hs == 0)
      .Need({{"dfull", dfull}, {"dqkv", dqkv}})
      .RequireIfWork(dqkv != dfull, "dqkv must not overlap dfull")
      .Done();
}

absl::StatusOr<OpCall> CheckSoftmax(absl::string_view backend, int rows, int cols, const void* x,
                                    const void* out) {
  return OpCheck(backend, "Softmax", {{"rows", rows}, {"cols", cols}})
      .EmptyIf(rows == 0 || cols == 0)
      .Need({{"x", x}, {"out", out}})
      .Done();
}

absl::StatusOr<OpCall> CheckCrossEntropyForward(absl::string_view backend, int rows, int V,
                                                const void* logits, const void* targets,
                                                const void* probs, const void* loss) {
  return OpCheck(backend, "CrossEntropyForward", {{"rows", rows}, {"V", V}})
      .Require(rows > 0 && V > 0, "the mean loss needs rows > 0 and V > 0")
      .Need({{"logits", logits}, {"targets", targets}, {"probs", probs}, {"loss", loss}})
      .Done();
}

absl::StatusOr<OpCall> CheckCrossEntropyBackward(absl::string_view backend, int rows, int V,
                                                 const void* probs, const void* targets,
                                                 const void* dlogits) {
  return OpCheck(backend, "CrossEntropyBackward", {{"rows", rows}, {"V", V}})
      .EmptyIf(rows == 0 || V == 0)
      .Need({{"probs", probs}, {"targets", targets}, {"dlogits", dlogits}})
      .Done();
}

absl::StatusOr<OpCall> CheckAdamW(absl::string_view backend, int64_t n, const void* param,
                                  const void* grad, const void* m, const void* v,
                                  int step) {
  return OpCheck(backend, "AdamW", {{"n", n}, {"step", step}})
      .Require(step >= 1, "step counts from 1")
      .EmptyIf(n == 0)
      .Need({{"param", param}, {"grad", grad}, {"m", m}, {"v", v}})
      .Done();
}

absl::Status IdOutOfRange(absl::string_view backend, const OpCall& call, const char* what,
                          int64_t position, int32_t id, int V) {
  return absl::InvalidArgumentError(absl::StrCat(backend, " backend: ", call.ToString(), ": ",
                                                 what, "[", position, "] = ", id,
                                                 " is outside the vocabulary [0, ", V, ")"));
}

absl::Status CheckHostIds(absl::string_view backend, const OpCall& call, const char* what,
                          const int32_t* ids, int64_t n, int V) {
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= V) return IdOutOfRange(backend, call, what, i, ids[i], V);
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
