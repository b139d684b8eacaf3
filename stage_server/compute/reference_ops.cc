#include "stage_server/compute/reference_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/bf16.h"

namespace pipetrain::compute::reference {

// An operand of a product as it enters it: itself, or rounded to bf16 (a double is
// first rounded to float, as the float backends hold it).
template <typename Real>
double Operand(Real x, bool bf16) {
  return bf16 ? double{common::RoundToBf16(static_cast<float>(x))} : double{x};
}

template <typename Real>
void Matmul(bool trans_a, bool trans_b, int m, int n, int k, Real alpha, const Real* a,
            const Real* b, Real beta, Real* c, bool bf16) {
  // a (m, k) or (k, m); b (k, n) or (n, k); c (m, n)
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        const double av = Operand(trans_a ? a[int64_t{p} * m + i] : a[int64_t{i} * k + p], bf16);
        const double bv = Operand(trans_b ? b[int64_t{j} * k + p] : b[int64_t{p} * n + j], bf16);
        acc += av * bv;
      }
      Real& out = c[int64_t{i} * n + j];
      // beta == 0 overwrites even NaN, as BLAS does.
      out = static_cast<Real>(alpha * acc + (beta == 0 ? 0.0 : double{beta} * out));
    }
  }
}

template <typename Real>
void Add(int64_t n, const Real* a, const Real* b, Real* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename Real>
void Axpy(int64_t n, Real alpha, const Real* x, Real* y) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

template <typename Real>
void Scale(int64_t n, Real alpha, Real* x) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

template <typename Real>
void RoundToBf16(int64_t n, Real* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = common::RoundToBf16(static_cast<float>(x[i]));
}

template <typename Real>
void AddBias(int rows, int cols, const Real* bias, Real* x) {
  // x (rows, cols), bias (cols)
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) x[int64_t{r} * cols + c] += bias[c];
  }
}

template <typename Real>
void BiasGrad(int rows, int cols, const Real* dout, Real* dbias) {
  // dout (rows, cols), dbias (cols) +=
  for (int c = 0; c < cols; ++c) {
    double acc = 0;
    for (int r = 0; r < rows; ++r) acc += dout[int64_t{r} * cols + c];
    dbias[c] += static_cast<Real>(acc);
  }
}

template <typename Real>
double SumOfSquares(int64_t n, const Real* x) {
  double acc = 0;
  for (int64_t i = 0; i < n; ++i) acc += double{x[i]} * x[i];
  return acc;
}

template <typename Real>
void EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens, const Real* wte,
                      const Real* wpe, Real* out) {
  // tokens (B, T), wte (V, C), wpe (>= T, C), out (B, T, C)
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t bt = int64_t{b} * T + t;
      const Real* e = wte + int64_t{tokens[bt]} * C;
      if (wpe == nullptr) {  // no position embedding (Llama: positions are rotary)
        for (int c = 0; c < C; ++c) out[bt * C + c] = e[c];
        continue;
      }
      const Real* p = wpe + int64_t{t} * C;
      for (int c = 0; c < C; ++c) out[bt * C + c] = e[c] + p[c];
    }
  }
}

template <typename Real>
void EmbeddingBackward(int B, int T, int C, int V, const int32_t* tokens, const Real* dout,
                       Real* dwte, Real* dwpe) {
  // tokens (B, T), dout (B, T, C), dwte (V, C) +=, dwpe (>= T, C) +=
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      const int64_t bt = int64_t{b} * T + t;
      for (int c = 0; c < C; ++c) {
        if (dwte != nullptr) dwte[int64_t{tokens[bt]} * C + c] += dout[bt * C + c];
        if (dwpe != nullptr) dwpe[int64_t{t} * C + c] += dout[bt * C + c];
      }
    }
  }
}

template <typename Real>
void LayerNormForward(int rows, int C, const Real* x, const Real* weight,
                      const Real* bias, Real* out, Real* mean, Real* rstd) {
  // x (rows, C), weight (C), bias (C), out (rows, C), mean (rows), rstd (rows)
  for (int r = 0; r < rows; ++r) {
    const Real* xr = x + int64_t{r} * C;
    double mu = 0;
    for (int c = 0; c < C; ++c) mu += xr[c];
    mu /= C;
    double var = 0;
    for (int c = 0; c < C; ++c) var += (xr[c] - mu) * (xr[c] - mu);
    var /= C;  // biased, as torch.nn.LayerNorm
    const double rs = 1.0 / std::sqrt(var + kLayerNormEps);
    for (int c = 0; c < C; ++c) {
      out[int64_t{r} * C + c] =
          static_cast<Real>((xr[c] - mu) * rs * weight[c] + bias[c]);
    }
    mean[r] = static_cast<Real>(mu);
    rstd[r] = static_cast<Real>(rs);
  }
}

template <typename Real>
void LayerNormBackward(int rows, int C, const Real* dout, const Real* x,
                       const Real* weight, const Real* mean, const Real* rstd, Real* dx,
                       Real* dweight, Real* dbias) {
  // dout (rows, C), x (rows, C), weight (C), mean (rows), rstd (rows),
  // dx (rows, C) +=, dweight (C) +=, dbias (C) +=
  for (int r = 0; r < rows; ++r) {
    const Real* xr = x + int64_t{r} * C;
    const Real* dr = dout + int64_t{r} * C;
    const double mu = mean[r], rs = rstd[r];
    // With xhat = (x - mu) rs and g = dout * weight:
    // dx = rs * (g - mean(g) - xhat * mean(g * xhat)). Only dx reads weight, so a
    // backward-weight pass may leave it null.
    double g_mean = 0, gx_mean = 0;
    for (int c = 0; c < C && dx != nullptr; ++c) {
      const double xhat = (xr[c] - mu) * rs;
      const double g = double{dr[c]} * weight[c];
      g_mean += g;
      gx_mean += g * xhat;
    }
    g_mean /= C;
    gx_mean /= C;
    for (int c = 0; c < C; ++c) {
      const double xhat = (xr[c] - mu) * rs;
      if (dx != nullptr) {
        const double g = double{dr[c]} * weight[c];
        dx[int64_t{r} * C + c] += static_cast<Real>(rs * (g - g_mean - xhat * gx_mean));
      }
      if (dweight != nullptr) dweight[c] += static_cast<Real>(dr[c] * xhat);
      if (dbias != nullptr) dbias[c] += dr[c];
    }
  }
}

namespace {
constexpr double kGeluK = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluA = 0.044715;
}  // namespace

template <typename Real>
void GeluForward(int64_t n, const Real* x, Real* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    out[i] =
        static_cast<Real>(0.5 * v * (1 + std::tanh(kGeluK * (v + kGeluA * v * v * v))));
  }
}

template <typename Real>
void GeluBackward(int64_t n, const Real* x, const Real* dout, Real* dx) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    const double th = std::tanh(kGeluK * (v + kGeluA * v * v * v));
    const double sech2 = 1 - th * th;
    const double grad =
        0.5 * (1 + th) + 0.5 * v * sech2 * kGeluK * (1 + 3 * kGeluA * v * v);
    dx[i] = static_cast<Real>(grad * dout[i]);
  }
}

template <typename Real>
void AttentionForward(int B, int T, int C, int NH, const Real* qkv, Real* out,
                      Real* probs, bool bf16) {
  // qkv (B, T, 3C), out (B, T, C), probs (B, NH, T, T)
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::vector<double> score(T);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const Real* q = qkv + (int64_t{b} * T + t) * 3 * C + h * hs;
        double max_score = -INFINITY;
        for (int u = 0; u <= t; ++u) {
          const Real* k = qkv + (int64_t{b} * T + u) * 3 * C + C + h * hs;
          double dot = 0;
          for (int i = 0; i < hs; ++i) dot += Operand(q[i], bf16) * Operand(k[i], bf16);
          score[u] = dot * scale;
          max_score = std::max(max_score, score[u]);
        }
        double sum = 0;
        for (int u = 0; u <= t; ++u) {
          score[u] = std::exp(score[u] - max_score);
          sum += score[u];
        }
        Real* p = probs + ((int64_t{b} * NH + h) * T + t) * T;
        for (int u = 0; u < T; ++u) p[u] = u <= t ? static_cast<Real>(score[u] / sum) : 0;
        Real* o = out + (int64_t{b} * T + t) * C + h * hs;
        for (int i = 0; i < hs; ++i) {
          double acc = 0;
          for (int u = 0; u <= t; ++u) {
            acc += Operand(p[u], bf16) *
                   Operand(qkv[(int64_t{b} * T + u) * 3 * C + 2 * C + h * hs + i], bf16);
          }
          o[i] = static_cast<Real>(acc);
        }
      }
    }
  }
}

template <typename Real>
void AttentionBackward(int B, int T, int C, int NH, const Real* dout, const Real* qkv,
                       const Real* probs, Real* dqkv, bool bf16) {
  // dout (B, T, C), qkv (B, T, 3C), probs (B, NH, T, T), dqkv (B, T, 3C)
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  std::fill(dqkv, dqkv + int64_t{B} * T * 3 * C, Real{0});
  std::vector<double> dp(T);
  auto at = [&](auto* base, int b, int t, int part, int h) {
    return base + (int64_t{b} * T + t) * 3 * C + part * C + h * hs;
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      for (int t = 0; t < T; ++t) {
        const Real* p = probs + ((int64_t{b} * NH + h) * T + t) * T;
        const Real* d = dout + (int64_t{b} * T + t) * C + h * hs;
        // d probs[u] = dout . v[u]; dv[u] += probs[u] * dout
        double p_dot_dp = 0;
        for (int u = 0; u <= t; ++u) {
          const Real* v = at(qkv, b, u, 2, h);
          Real* dv = at(dqkv, b, u, 2, h);
          double acc = 0;
          for (int i = 0; i < hs; ++i) {
            acc += Operand(d[i], bf16) * Operand(v[i], bf16);
            dv[i] += static_cast<Real>(Operand(p[u], bf16) * Operand(d[i], bf16));
          }
          dp[u] = acc;
          p_dot_dp += p[u] * acc;
        }
        // Softmax backward, then through the scaled dot products.
        const Real* q = at(qkv, b, t, 0, h);
        Real* dq = at(dqkv, b, t, 0, h);
        for (int u = 0; u <= t; ++u) {
          const double ds = Operand(p[u] * (dp[u] - p_dot_dp) * scale, bf16);
          const Real* k = at(qkv, b, u, 1, h);
          Real* dk = at(dqkv, b, u, 1, h);
          for (int i = 0; i < hs; ++i) {
            dq[i] += static_cast<Real>(ds * Operand(k[i], bf16));
            dk[i] += static_cast<Real>(ds * Operand(q[i], bf16));
          }
        }
      }
    }
  }
}

template <typename Real>
void Copy2D(int rows, int cols, const Real* src, int64_t src_stride, Real* dst,
            int64_t dst_stride) {
  // src (rows, >= cols) with row stride src_stride, dst likewise with dst_stride
  for (int r = 0; r < rows; ++r) {
    std::copy(src + r * src_stride, src + r * src_stride + cols, dst + r * dst_stride);
  }
}

template <typename Real>
void Softmax(int rows, int cols, const Real* x, Real* out) {
  // x (rows, cols), out (rows, cols); out may alias x, so each row is read whole first.
  std::vector<double> e(cols);
  for (int r = 0; r < rows; ++r) {
    const Real* xr = x + int64_t{r} * cols;
    double max_x = -INFINITY;
    for (int c = 0; c < cols; ++c) max_x = std::max(max_x, double{xr[c]});
    double sum = 0;
    for (int c = 0; c < cols; ++c) {
      e[c] = std::exp(xr[c] - max_x);
      sum += e[c];
    }
    Real* o = out + int64_t{r} * cols;
    for (int c = 0; c < cols; ++c) o[c] = static_cast<Real>(e[c] / sum);
  }
}

template <typename Real>
void CrossEntropyForward(int rows, int V, const Real* logits, const int32_t* targets, Real* probs,
                         Real* loss) {
  // logits (rows, V), targets (rows), probs (rows, V), loss (1)
  double total = 0;
  for (int r = 0; r < rows; ++r) {
    const Real* l = logits + int64_t{r} * V;
    Real* p = probs + int64_t{r} * V;
    double max_logit = -INFINITY;
    for (int v = 0; v < V; ++v) max_logit = std::max(max_logit, double{l[v]});
    double sum = 0;
    for (int v = 0; v < V; ++v) sum += std::exp(l[v] - max_logit);
    // log-sum-exp form keeps the loss exact even where the target's probability
    // underflows.
    total += std::log(sum) + max_logit - l[targets[r]];
    for (int v = 0; v < V; ++v)
      p[v] = static_cast<Real>(std::exp(l[v] - max_logit) / sum);
  }
  *loss = static_cast<Real>(total / rows);
}

template <typename Real>
void CrossEntropyBackward(int rows, int V, const Real* probs, const int32_t* targets,
                          Real dloss_scale, Real* dlogits) {
  // probs (rows, V), targets (rows), dlogits (rows, V)
  for (int r = 0; r < rows; ++r) {
    for (int v = 0; v < V; ++v) {
      const int64_t i = int64_t{r} * V + v;
      dlogits[i] = (probs[i] - (v == targets[r] ? Real{1} : Real{0})) * dloss_scale;
    }
  }
}

template <typename Real>
void AdamW(int64_t n, Real* param, const Real* grad, Real* m, Real* v, float lr,
           float beta1, float beta2, float eps, float weight_decay, int step) {
  // param, grad, m, v (N)
  const double bc1 = 1 - std::pow(double{beta1}, step);
  const double bc2 = 1 - std::pow(double{beta2}, step);
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    double p = param[i];
    p -= double{lr} * weight_decay * p;
    const double mi = beta1 * double{m[i]} + (1 - double{beta1}) * g;
    const double vi = beta2 * double{v[i]} + (1 - double{beta2}) * g * g;
    m[i] = static_cast<Real>(mi);
    v[i] = static_cast<Real>(vi);
    p -= lr * (mi / bc1) / (std::sqrt(vi / bc2) + eps);
    param[i] = static_cast<Real>(p);
  }
}

#define PIPETRAIN_INSTANTIATE_REFERENCE_OPS(Real)                                                  \
  template void Matmul<Real>(bool, bool, int, int, int, Real, const Real*, const Real*, Real,      \
                             Real*, bool);                                                               \
  template void Add<Real>(int64_t, const Real*, const Real*, Real*);                               \
  template void Axpy<Real>(int64_t, Real, const Real*, Real*);                                     \
  template void Scale<Real>(int64_t, Real, Real*);                                                 \
  template void RoundToBf16<Real>(int64_t, Real*);                                                 \
  template void AddBias<Real>(int, int, const Real*, Real*);                                       \
  template void BiasGrad<Real>(int, int, const Real*, Real*);                                      \
  template double SumOfSquares<Real>(int64_t, const Real*);                                        \
  template void EmbeddingForward<Real>(int, int, int, int, const int32_t*, const Real*,            \
                                       const Real*, Real*);                                        \
  template void EmbeddingBackward<Real>(int, int, int, int, const int32_t*, const Real*, Real*,    \
                                        Real*);                                                    \
  template void LayerNormForward<Real>(int, int, const Real*, const Real*, const Real*, Real*,     \
                                       Real*, Real*);                                              \
  template void LayerNormBackward<Real>(int, int, const Real*, const Real*, const Real*,           \
                                        const Real*, const Real*, Real*, Real*, Real*);            \
  template void GeluForward<Real>(int64_t, const Real*, Real*);                                    \
  template void GeluBackward<Real>(int64_t, const Real*, const Real*, Real*);                      \
  template void AttentionForward<Real>(int, int, int, int, const Real*, Real*, Real*, bool);       \
  template void AttentionBackward<Real>(int, int, int, int, const Real*, const Real*, const Real*, \
                                        Real*, bool);                                              \
  template void Copy2D<Real>(int, int, const Real*, int64_t, Real*, int64_t);                      \
  template void Softmax<Real>(int, int, const Real*, Real*);                                       \
  template void CrossEntropyForward<Real>(int, int, const Real*, const int32_t*, Real*, Real*);    \
  template void CrossEntropyBackward<Real>(int, int, const Real*, const int32_t*, Real, Real*);    \
  template void AdamW<Real>(int64_t, Real*, const Real*, Real*, Real*, float, float, float, float, \
                            float, int);

PIPETRAIN_INSTANTIATE_REFERENCE_OPS(float)
PIPETRAIN_INSTANTIATE_REFERENCE_OPS(double)

}  // namespace pipetrain::compute::reference
