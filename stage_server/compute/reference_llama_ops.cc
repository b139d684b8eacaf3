// The plain loops of Llama's ops (reference_ops.h; semantics and shapes in backend.h):
// RMSNorm, rotary embeddings, SwiGLU and grouped-query attention's head copies. Every
// value is computed in double and rounded to Real once.
#include <cmath>
#include <cstdint>

#include "stage_server/compute/reference_ops.h"

namespace pipetrain::compute::reference {

template <typename Real>
void RmsNormForward(int rows, int C, float eps, const Real* x, const Real* weight, Real* out,
                    Real* rstd) {
  // x (rows, C), weight (C), out (rows, C), rstd (rows)
  for (int r = 0; r < rows; ++r) {
    const Real* xr = x + int64_t{r} * C;
    double sq = 0;
    for (int c = 0; c < C; ++c) sq += double{xr[c]} * xr[c];
    const double rs = 1.0 / std::sqrt(sq / C + double{eps});
    for (int c = 0; c < C; ++c) {
      out[int64_t{r} * C + c] = static_cast<Real>(xr[c] * rs * weight[c]);
    }
    rstd[r] = static_cast<Real>(rs);
  }
}

template <typename Real>
void RmsNormBackward(int rows, int C, const Real* dout, const Real* x, const Real* weight,
                     const Real* rstd, Real* dx, Real* dweight) {
  // dout (rows, C), x (rows, C), weight (C), rstd (rows), dx (rows, C) +=, dweight (C) +=
  for (int r = 0; r < rows; ++r) {
    const Real* xr = x + int64_t{r} * C;
    const Real* dr = dout + int64_t{r} * C;
    const double rs = rstd[r];
    // With xhat = x rs and g = dout * weight: d rs / dx_j = -rs^3 x_j / C, so
    // dx = rs * (g - xhat * mean(g * xhat)). Only dx reads weight.
    if (dx != nullptr) {
      double gx_mean = 0;
      for (int c = 0; c < C; ++c) gx_mean += double{dr[c]} * weight[c] * (xr[c] * rs);
      gx_mean /= C;
      for (int c = 0; c < C; ++c) {
        const double g = double{dr[c]} * weight[c];
        dx[int64_t{r} * C + c] += static_cast<Real>(rs * (g - xr[c] * rs * gx_mean));
      }
    }
    if (dweight != nullptr) {
      for (int c = 0; c < C; ++c) dweight[c] += static_cast<Real>(double{dr[c]} * xr[c] * rs);
    }
  }
}

template <typename Real>
void Rotary(int rows, int T, int heads, int hs, int64_t stride, const Real* cos, const Real* sin,
            bool inverse, Real* x) {
  // x (rows, >= stride), cos (T, hs/2), sin (T, hs/2); the inverse rotates by -angle.
  const int half = hs / 2;
  const double sign = inverse ? -1.0 : 1.0;
  for (int r = 0; r < rows; ++r) {
    const int64_t t = r % T;
    for (int h = 0; h < heads; ++h) {
      Real* x1 = x + r * stride + int64_t{h} * hs;
      Real* x2 = x1 + half;
      for (int i = 0; i < half; ++i) {
        const double c = cos[t * half + i], s = sign * sin[t * half + i];
        const double a = x1[i], b = x2[i];
        x1[i] = static_cast<Real>(a * c - b * s);
        x2[i] = static_cast<Real>(b * c + a * s);
      }
    }
  }
}

namespace {
double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }
}  // namespace

template <typename Real>
void SwiGluForward(int rows, int F, const Real* gu, Real* out) {
  // gu (rows, 2F) gate|up, out (rows, F)
  for (int r = 0; r < rows; ++r) {
    const Real* gate = gu + int64_t{r} * 2 * F;
    const Real* up = gate + F;
    for (int j = 0; j < F; ++j) {
      const double g = gate[j];
      out[int64_t{r} * F + j] = static_cast<Real>(g * Sigmoid(g) * up[j]);
    }
  }
}

template <typename Real>
void SwiGluBackward(int rows, int F, const Real* gu, const Real* dout, Real* dgu) {
  // gu (rows, 2F), dout (rows, F), dgu (rows, 2F)
  for (int r = 0; r < rows; ++r) {
    const Real* gate = gu + int64_t{r} * 2 * F;
    const Real* up = gate + F;
    const Real* d = dout + int64_t{r} * F;
    Real* dgate = dgu + int64_t{r} * 2 * F;
    Real* dup = dgate + F;
    for (int j = 0; j < F; ++j) {
      const double g = gate[j], s = Sigmoid(g);
      // silu'(g) = s + g s (1 - s)
      dgate[j] = static_cast<Real>(double{d[j]} * up[j] * s * (1 + g * (1 - s)));
      dup[j] = static_cast<Real>(double{d[j]} * g * s);
    }
  }
}

template <typename Real>
void RepeatKv(int rows, int NH, int NKV, int hs, const Real* qkv, Real* out) {
  // qkv (rows, (NH + 2 NKV) hs), out (rows, 3 NH hs)
  const int group = NH / NKV;
  const int64_t in_cols = int64_t{NH + 2 * NKV} * hs, out_cols = int64_t{3} * NH * hs;
  for (int r = 0; r < rows; ++r) {
    const Real* in = qkv + r * in_cols;
    Real* o = out + r * out_cols;
    for (int64_t c = 0; c < int64_t{NH} * hs; ++c) o[c] = in[c];
    for (int part = 1; part <= 2; ++part) {  // k, then v
      const Real* src = in + int64_t{NH} * hs + int64_t{part - 1} * NKV * hs;
      Real* dst = o + int64_t{part} * NH * hs;
      for (int h = 0; h < NH; ++h) {
        for (int i = 0; i < hs; ++i) dst[int64_t{h} * hs + i] = src[int64_t{h / group} * hs + i];
      }
    }
  }
}

template <typename Real>
void SumKvGroups(int rows, int NH, int NKV, int hs, const Real* dfull, Real* dqkv) {
  // dfull (rows, 3 NH hs), dqkv (rows, (NH + 2 NKV) hs)
  const int group = NH / NKV;
  const int64_t full_cols = int64_t{3} * NH * hs, cols = int64_t{NH + 2 * NKV} * hs;
  for (int r = 0; r < rows; ++r) {
    const Real* d = dfull + r * full_cols;
    Real* o = dqkv + r * cols;
    for (int64_t c = 0; c < int64_t{NH} * hs; ++c) o[c] = d[c];
    for (int part = 1; part <= 2; ++part) {
      const Real* src = d + int64_t{part} * NH * hs;
      Real* dst = o + int64_t{NH} * hs + int64_t{part - 1} * NKV * hs;
      for (int kv = 0; kv < NKV; ++kv) {
        for (int i = 0; i < hs; ++i) {
          double sum = 0;
          for (int g = 0; g < group; ++g) sum += src[int64_t{kv * group + g} * hs + i];
          dst[int64_t{kv} * hs + i] = static_cast<Real>(sum);
        }
      }
    }
  }
}

#define PIPETRAIN_INSTANTIATE_REFERENCE_LLAMA_OPS(Real)                                        \
  template void RmsNormForward<Real>(int, int, float, const Real*, const Real*, Real*, Real*); \
  template void RmsNormBackward<Real>(int, int, const Real*, const Real*, const Real*,         \
                                      const Real*, Real*, Real*);                              \
  template void Rotary<Real>(int, int, int, int, int64_t, const Real*, const Real*, bool,      \
                             Real*);                                                           \
  template void SwiGluForward<Real>(int, int, const Real*, Real*);                             \
  template void SwiGluBackward<Real>(int, int, const Real*, const Real*, Real*);               \
  template void RepeatKv<Real>(int, int, int, int, const Real*, Real*);                        \
  template void SumKvGroups<Real>(int, int, int, int, const Real*, Real*);

PIPETRAIN_INSTANTIATE_REFERENCE_LLAMA_OPS(float)
PIPETRAIN_INSTANTIATE_REFERENCE_LLAMA_OPS(double)

}  // namespace pipetrain::compute::reference
