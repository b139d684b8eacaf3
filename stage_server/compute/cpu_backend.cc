#include "stage_server/compute/cpu_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/onednn_matmul.h"
#include "stage_server/compute/op_checks.h"
#include "stage_server/compute/openblas_products.h"
#include "stage_server/compute/reference_ops.h"

namespace pipetrain::compute {

namespace {
// exp(x) in float, about 2 ulp, written without calls or branches so that the compiler
// vectorises the loops using it (libm's expf/tanhf took a quarter of a training step).
// Cephes' polynomial on x - n ln2, then 2^n through the exponent bits.
inline float FastExp(float x) {
  x = std::min(88.0f, std::max(-87.0f, x));
  // Round x / ln2 to the nearest integer with the 1.5 * 2^23 trick (no conversions).
  constexpr float kMagic = 12582912.0f;
  const float t = x * 1.44269504088896341f + kMagic;
  const float n = t - kMagic;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kMagic);
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float e = p * r * r + r + 1.0f;
  return e * std::bit_cast<float>((ni + 127) << 23);
}
// GELU's 0.5 (1 + tanh(z)) is the logistic sigmoid of 2z. Computed as 1 / (1 + exp(-2z))
// it keeps FastExp's relative accuracy; through tanh, 1 + tanh(z) cancels for negative
// z and a small GELU value lost half its digits.
inline float SigmoidOfTwice(float z) { return 1.0f / (1.0f + FastExp(-2.0f * z)); }

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(int threads,
                                                               ProductEngine engine) {
  if (threads < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: threads must be >= 1 (got ", threads, ")"));
  }
  std::unique_ptr<Products> products;
  if (engine == ProductEngine::kOneDnn) {
    ASSIGN_OR_RETURN(products, OneDnnMatmul::Create(threads));
  } else {
    ASSIGN_OR_RETURN(products, OpenBlasProducts::Create(threads));
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(threads, std::move(products)));
}

CpuBackend::CpuBackend(int threads, std::unique_ptr<Products> products)
    : threads_(threads), products_(std::move(products)) {}

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
  return products_->Run(common::DType::kF32,
                        ProductShape::RowMajor(trans_a, trans_b, m, n, k, trans_a ? m : k,
                                               trans_b ? k : n, n, alpha, beta),
                        a, b, c);
}

absl::Status CpuBackend::BiasGrad(int rows, int cols, const float* dout, float* dbias) {
  // dout (rows, cols), dbias (cols) +=. Row-major sweep so memory is read once.
  ASSIGN_OR_RETURN(const OpCall call, CheckBiasGrad(Name(), rows, cols, dout, dbias));
  if (call.empty()) return absl::OkStatus();
  for (int r = 0; r < rows; ++r) {
    const float* d = dout + int64_t{r} * cols;
    for (int c = 0; c < cols; ++c) dbias[c] += d[c];
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormForward(int rows, int C, const float* x,
                                          const float* weight, const float* bias,
                                          float* out, float* mean, float* rstd) {
  // x (rows, C), weight (C), bias (C), out (rows, C), mean (rows), rstd (rows)
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckLayerNormForward(Name(), rows, C, x, weight, bias, out, mean, rstd));
  if (call.empty()) return absl::OkStatus();
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + int64_t{r} * C;
    float* o = out + int64_t{r} * C;
    float sum = 0;
    for (int c = 0; c < C; ++c) sum += xr[c];
    const float mu = sum / C;
    float var = 0;
    for (int c = 0; c < C; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    const float rs =
        1.0f / std::sqrt(var / C + static_cast<float>(reference::kLayerNormEps));
    for (int c = 0; c < C; ++c) o[c] = (xr[c] - mu) * rs * weight[c] + bias[c];
    mean[r] = mu;
    rstd[r] = rs;
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormBackward(int rows, int C, const float* dout,
                                           const float* x, const float* weight,
                                           const float* mean, const float* rstd,
                                           float* dx, float* dweight, float* dbias) {
  // dout (rows, C), x (rows, C), weight (C), mean (rows), rstd (rows),
  // dx (rows, C) +=, dweight (C) +=, dbias (C) +=
  ASSIGN_OR_RETURN(const OpCall call, CheckLayerNormBackward(Name(), rows, C, dout, x, weight, mean,
                                                             rstd, dx, dweight, dbias));
  if (call.empty()) return absl::OkStatus();
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + int64_t{r} * C;
    const float* d = dout + int64_t{r} * C;
    const float mu = mean[r], rs = rstd[r];
    if (dx != nullptr) {
      float g_mean = 0, gx_mean = 0;
      for (int c = 0; c < C; ++c) {
        const float g = d[c] * weight[c];
        g_mean += g;
        gx_mean += g * (xr[c] - mu) * rs;
      }
      g_mean /= C;
      gx_mean /= C;
      float* dxr = dx + int64_t{r} * C;
      for (int c = 0; c < C; ++c) {
        const float xhat = (xr[c] - mu) * rs;
        dxr[c] += rs * (d[c] * weight[c] - g_mean - xhat * gx_mean);
      }
    }
    if (dweight != nullptr) {
      for (int c = 0; c < C; ++c) dweight[c] += d[c] * (xr[c] - mu) * rs;
    }
    if (dbias != nullptr) {
      for (int c = 0; c < C; ++c) dbias[c] += d[c];
    }
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluForward(int64_t n, const float* x, float* out) {
  // x (N), out (N)
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluForward(Name(), n, x, out));
  if (call.empty()) return absl::OkStatus();
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = v * SigmoidOfTwice(kGeluK * (v + kGeluA * v * v * v));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluBackward(int64_t n, const float* x, const float* dout,
                                      float* dx) {
  // x (N), dout (N), dx (N)
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluBackward(Name(), n, x, dout, dx));
  if (call.empty()) return absl::OkStatus();
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    // With s = 0.5 (1 + tanh): 0.5 (1 - tanh^2) = 2 s (1 - s).
    const float s = SigmoidOfTwice(kGeluK * (v + kGeluA * v * v * v));
    const float grad = s + 2 * v * s * (1 - s) * kGeluK * (1 + 3 * kGeluA * v * v);
    dx[i] = grad * dout[i];
  }
  return absl::OkStatus();
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
  ProductShape p;
  p.batch0 = B;
  p.batch1 = NH;
  p.m = m;
  p.n = n;
  p.k = k;
  p.a = a;
  p.b = b;
  p.c = c;
  p.alpha = alpha;
  return p;
}

// Causal softmax of each row of every (T, T) score matrix, in place; zeros above the
// diagonal.
void CausalSoftmaxRows(int64_t matrices, int T, float* p) {
  for (int64_t i = 0; i < matrices * T; ++i) {
    const int t = static_cast<int>(i % T);
    float* row = p + i * T;
    float max_score = row[0];
    for (int u = 1; u <= t; ++u) max_score = std::max(max_score, row[u]);
    float sum = 0;
    for (int u = 0; u <= t; ++u) {
      row[u] = FastExp(row[u] - max_score);
      sum += row[u];
    }
    const float inv = 1.0f / sum;
    for (int u = 0; u <= t; ++u) row[u] *= inv;
    for (int u = t + 1; u < T; ++u) row[u] = 0;
  }
}

// Softmax backward in place over every row: dS = P * (dP - rowsum(P * dP)) * scale.
void CausalSoftmaxBackwardRows(int64_t matrices, int T, const float* probs, float scale,
                               float* dp) {
  for (int64_t i = 0; i < matrices * T; ++i) {
    const int t = static_cast<int>(i % T);
    const float* pr = probs + i * T;
    float* dr = dp + i * T;
    float dot = 0;
    for (int u = 0; u <= t; ++u) dot += pr[u] * dr[u];
    for (int u = 0; u <= t; ++u) dr[u] = pr[u] * (dr[u] - dot) * scale;
    for (int u = t + 1; u < T; ++u) dr[u] = 0;
  }
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
      common::DType::kF32,
      HeadProduct(B, NH, T, T, hs, HeadsOfQkv(T, C, hs), HeadsOfQkvTransposed(T, C, hs),
                  Probs(NH, T), scale),
      qkv, qkv + C, probs));
  CausalSoftmaxRows(int64_t{B} * NH, T, probs);
  // out_h = P V.
  return products_->Run(common::DType::kF32,
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
  const common::DType f32 = common::DType::kF32;
  const MatrixStrides heads = HeadsOfQkv(T, C, hs);
  // dP = dO V^T; dV = P^T dO.
  RETURN_IF_ERROR(products_->Run(f32,
                                 HeadProduct(B, NH, T, T, hs, HeadsOfOut(T, C, hs),
                                             HeadsOfQkvTransposed(T, C, hs), Probs(NH, T), 1),
                                 dout, qkv + 2 * C, dp));
  RETURN_IF_ERROR(products_->Run(
      f32, HeadProduct(B, NH, T, hs, T, ProbsTransposed(NH, T), HeadsOfOut(T, C, hs), heads, 1),
      probs, dout, dqkv + 2 * C));
  CausalSoftmaxBackwardRows(int64_t{B} * NH, T, probs, scale, dp);
  // dQ = dS K; dK = dS^T Q.
  RETURN_IF_ERROR(products_->Run(f32, HeadProduct(B, NH, T, hs, T, Probs(NH, T), heads, heads, 1),
                                 dp, qkv + C, dqkv));
  return products_->Run(
      f32, HeadProduct(B, NH, T, hs, T, ProbsTransposed(NH, T), heads, heads, 1), dp, qkv,
      dqkv + C);
}

absl::Status CpuBackend::CrossEntropyForward(int rows, int V, const float* logits,
                                             const int32_t* targets, float* probs,
                                             float* loss) {
  // logits (rows, V), targets (rows), probs (rows, V), loss (1)
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCrossEntropyForward(Name(), rows, V, logits, targets, probs, loss));
  RETURN_IF_ERROR(CheckHostIds(Name(), call, "targets", targets, rows, V));
  double total = 0;
  for (int r = 0; r < rows; ++r) {
    const float* l = logits + int64_t{r} * V;
    float* p = probs + int64_t{r} * V;
    float max_logit = l[0];
    for (int v = 1; v < V; ++v) max_logit = std::max(max_logit, l[v]);
    const float target_logit = l[targets[r]];  // read before p (which may alias l)
    // The denominator is summed in double: over GPT-2's 50,257 terms a float sum
    // drifts by ~1e-4 relative, which every probability would inherit.
    double sum = 0;
    for (int v = 0; v < V; ++v) {
      p[v] = FastExp(l[v] - max_logit);
      sum += p[v];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int v = 0; v < V; ++v) p[v] *= inv;
    total += std::log(sum) + max_logit - target_logit;
  }
  *loss = static_cast<float>(total / rows);
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
