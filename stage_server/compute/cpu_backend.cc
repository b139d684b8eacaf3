#include "stage_server/compute/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "common/status_macros.h"
#include "stage_server/compute/cpu_wide_loops.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/fast_math.h"
#include "stage_server/compute/onednn_matmul.h"
#include "stage_server/compute/op_checks.h"
#include "stage_server/compute/openblas_products.h"
#include "stage_server/compute/parallel_ranges.h"
#include "stage_server/compute/reference_ops.h"

namespace pipetrain::compute {


absl::StatusOr<std::unique_ptr<Products>> CpuBackend::MakeProducts(ProductEngine engine,
                                                                   int threads) {
  if (engine == ProductEngine::kOneDnn) return OneDnnMatmul::Create(threads);
  return OpenBlasProducts::Create(threads);
}

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(int threads,
                                                               ProductEngine engine) {
  if (threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: threads must be >= 1 (got ", threads, ")"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Products> products, MakeProducts(engine, threads));
  return std::unique_ptr<CpuBackend>(new CpuBackend(threads, engine, std::move(products)));
}

CpuBackend::CpuBackend(int threads, ProductEngine engine, std::unique_ptr<Products> products)
    : threads_(threads),
      // OpenBLAS's own pthreads would fight OpenMP's for the cores: with that engine the
      // loops stay on one thread, as they were before oneDNN.
      loop_threads_(engine == ProductEngine::kOpenBlas ? 1 : threads),
      engine_(engine),
      products_(std::move(products)) {}

CpuBackend::~CpuBackend() {
  for (auto& [bytes, blocks] : free_blocks_) {
    for (void* p : blocks) std::free(p);
  }
}

absl::StatusOr<void*> CpuBackend::Allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t rounded = (bytes + 63) / 64 * 64;
  std::vector<void*>& cached = free_blocks_[rounded];
  void* p = nullptr;
  if (!cached.empty()) {
    p = cached.back();
    cached.pop_back();
  } else {
    p = std::aligned_alloc(64, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu backend: cannot allocate ", bytes, " bytes"));
    }
  }
  block_bytes_[p] = rounded;
  return p;
}

absl::Status CpuBackend::Free(void* ptr) {
  if (ptr == nullptr) return absl::OkStatus();
  auto it = block_bytes_.find(ptr);
  if (it == block_bytes_.end()) {
    return absl::InvalidArgumentError(
        "cpu backend: Free of a pointer it did not allocate");
  }
  free_blocks_[it->second].push_back(ptr);
  block_bytes_.erase(it);
  return absl::OkStatus();
}

absl::Status CpuBackend::SetProductOperands(common::DType operands) {
  if (operands == common::DType::kBF16 && engine_ == ProductEngine::kOpenBlas) {
    return absl::UnimplementedError("cpu backend: the openblas engine has no bf16 products");
  }
  return SetF32OrBf16Products(operands);
}

absl::Status CpuBackend::Matmul(bool trans_a, bool trans_b, int m, int n, int k,
                                float alpha, const float* a, const float* b, float beta,
                                float* c) {
  // a (m, k) or (k, m); b (k, n) or (n, k); c (m, n)
  ASSIGN_OR_RETURN(const OpCall call, CheckMatmul(Name(), m, n, k, a, b, c));
  if (call.empty()) return absl::OkStatus();
  if (k == 0) {  // BLAS may leave c untouched; the contract says c = beta * c.
    if (beta == 0) return Zero(c, BytesOf<float>(int64_t{m} * n));  // even over NaN
    return Scale(int64_t{m} * n, beta, c);
  }
  return products_->Run(product_operands(),
                        ProductShape::RowMajor(trans_a, trans_b, m, n, k, trans_a ? m : k,
                                               trans_b ? k : n, n, alpha, beta),
                        a, b, c);
}

int64_t CpuBackend::ProductCopyBytes(int64_t n) const {
  return bf16_products() ? n * static_cast<int64_t>(common::DTypeSize(common::DType::kBF16)) : 0;
}

absl::Status CpuBackend::MakeProductCopy(int64_t n, const float* x, void* copy) {
  ASSIGN_OR_RETURN(const OpCall call, CheckMakeProductCopy(Name(), n, x, copy));
  if (!bf16_products()) return ProductCopyWithoutBf16(Name(), call);
  auto* out = static_cast<uint16_t*>(copy);
  ForRanges(loop_threads_, n, MinItems(1), [&](int64_t i0, int64_t i1) {
    wide::FloatsToBf16Bits(i1 - i0, x + i0, out + i0);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::MatmulByCopy(bool trans_a, bool trans_b, int m, int n, int k,
                                      float alpha, ProductOperand<float> a,
                                      ProductOperand<float> b, float beta, float* c) {
  ASSIGN_OR_RETURN(const OpCall call, CheckMatmulByCopy(Name(), m, n, k, a.data(), b.data(), c));
  if (!bf16_products()) return ProductCopyWithoutBf16(Name(), call);
  if (call.empty()) return absl::OkStatus();
  if (k == 0) return Matmul(trans_a, trans_b, m, n, 0, alpha, nullptr, nullptr, beta, c);
  const auto bf16 = [](const ProductOperand<float>& o) {
    return Bf16Operand{o.values, static_cast<const uint16_t*>(o.copy)};
  };
  return products_->RunBf16(ProductShape::RowMajor(trans_a, trans_b, m, n, k, trans_a ? m : k,
                                                   trans_b ? k : n, n, alpha, beta),
                            bf16(a), bf16(b), c);
}

namespace {
// Views of attention's tensors as (B, NH) batches of per-head matrices. qkv is (B, T, 3C)
// with head h of q at columns h*hs (k at C + h*hs, v at 2C + h*hs); out and dout are
// (B, T, C); probs and its gradient are (B, NH, T, T), dense.
MatrixStrides HeadsOfQkv(int T, int C, int hs) { return {int64_t{T} * 3 * C, hs, 3 * C, 1}; }
MatrixStrides HeadsOfQkvTransposed(int T, int C, int hs) {
  return {int64_t{T} * 3 * C, hs, 1, 3 * C};
}
MatrixStrides HeadsOfOut(int T, int C, int hs) { return {int64_t{T} * C, hs, C, 1}; }
MatrixStrides Probs(int NH, int T) { return {int64_t{NH} * T * T, int64_t{T} * T, T, 1}; }
MatrixStrides ProbsTransposed(int NH, int T) {
  return {int64_t{NH} * T * T, int64_t{T} * T, 1, T};
}
ProductShape HeadProduct(int B, int NH, int m, int n, int k, MatrixStrides a,
                         MatrixStrides b, MatrixStrides c, float alpha) {
  return {.batch0 = B, .batch1 = NH, .m = m, .n = n, .k = k, .a = a, .b = b, .c = c,
          .alpha = alpha};
}

// Causal softmax of each row of every (T, T) score matrix, in place; zeros above the
// diagonal. By rows over `threads`.
void CausalSoftmaxRows(int threads, int64_t matrices, int T, float* p) {
  ForRanges(threads, matrices * T, MinItems(T), [&](int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const int t = static_cast<int>(i % T);
    float* row = p + i * T;
    float max_score = row[0];
    for (int u = 1; u <= t; ++u) max_score = std::max(max_score, row[u]);
    wide::ExpShifted(t + 1, row, max_score, row);
    float sum = 0;
    for (int u = 0; u <= t; ++u) sum += row[u];
    const float inv = 1.0f / sum;
    for (int u = 0; u <= t; ++u) row[u] *= inv;
    for (int u = t + 1; u < T; ++u) row[u] = 0;
  }
  });
}

// Softmax backward in place over every row: dS = P * (dP - rowsum(P * dP)) * scale.
void CausalSoftmaxBackwardRows(int threads, int64_t matrices, int T, const float* probs,
                               float scale, float* dp) {
  ForRanges(threads, matrices * T, MinItems(T), [&](int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const int t = static_cast<int>(i % T);
    const float* pr = probs + i * T;
    float* dr = dp + i * T;
    float dot = 0;
    for (int u = 0; u <= t; ++u) dot += pr[u] * dr[u];
    for (int u = 0; u <= t; ++u) dr[u] = pr[u] * (dr[u] - dot) * scale;
    for (int u = t + 1; u < T; ++u) dr[u] = 0;
  }
  });
}
}  // namespace

absl::Status CpuBackend::AttentionForward(int B, int T, int C, int NH, const float* qkv,
                                          float* out, float* probs) {
  // qkv (B, T, 3C), out (B, T, C), probs (B, NH, T, T)
  ASSIGN_OR_RETURN(const OpCall call, CheckAttentionForward(Name(), B, T, C, NH, qkv, out, probs));
  if (call.empty()) return absl::OkStatus();
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  // scores = scale * Q K^T for every head in one product; the upper triangle is computed
  // and then masked, cheaper than T small products.
  RETURN_IF_ERROR(products_->Run(
      product_operands(),
      HeadProduct(B, NH, T, T, hs, HeadsOfQkv(T, C, hs), HeadsOfQkvTransposed(T, C, hs),
                  Probs(NH, T), scale),
      qkv, qkv + C, probs));
  CausalSoftmaxRows(loop_threads_, int64_t{B} * NH, T, probs);
  // out_h = P V.
  return products_->Run(product_operands(),
                        HeadProduct(B, NH, T, hs, T, Probs(NH, T), HeadsOfQkv(T, C, hs),
                                    HeadsOfOut(T, C, hs), 1.0f),
                        probs, qkv + 2 * C, out);
}

absl::Status CpuBackend::AttentionBackward(int B, int T, int C, int NH, const float* dout,
                                           const float* qkv, const float* probs,
                                           float* dqkv) {
  // dout (B, T, C), qkv (B, T, 3C), probs (B, NH, T, T), dqkv (B, T, 3C)
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckAttentionBackward(Name(), B, T, C, NH, dout, qkv, probs, dqkv));
  if (call.empty()) return absl::OkStatus();
  const int hs = C / NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  scratch_.resize(int64_t{B} * NH * T * T);
  float* dp = scratch_.data();  // (B, NH, T, T)
  const common::DType operands = product_operands();
  const MatrixStrides heads = HeadsOfQkv(T, C, hs);
  // dP = dO V^T; dV = P^T dO.
  RETURN_IF_ERROR(products_->Run(operands,
                                 HeadProduct(B, NH, T, T, hs, HeadsOfOut(T, C, hs),
                                             HeadsOfQkvTransposed(T, C, hs), Probs(NH, T), 1),
                                 dout, qkv + 2 * C, dp));
  RETURN_IF_ERROR(products_->Run(
      operands, HeadProduct(B, NH, T, hs, T, ProbsTransposed(NH, T), HeadsOfOut(T, C, hs), heads, 1),
      probs, dout, dqkv + 2 * C));
  CausalSoftmaxBackwardRows(loop_threads_, int64_t{B} * NH, T, probs, scale, dp);
  // dQ = dS K; dK = dS^T Q.
  RETURN_IF_ERROR(products_->Run(operands, HeadProduct(B, NH, T, hs, T, Probs(NH, T), heads, heads, 1),
                                 dp, qkv + C, dqkv));
  return products_->Run(
      operands, HeadProduct(B, NH, T, hs, T, ProbsTransposed(NH, T), heads, heads, 1), dp, qkv,
      dqkv + C);
}

}  // namespace pipetrain::compute
