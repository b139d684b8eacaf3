// The cpu backend's Llama ops (backend.h): RMSNorm, rotary embeddings, SwiGLU and the
// grouped-query head copies, as single-pass float loops spread by ForRanges
// (parallel_ranges.h). Each splits only rows (RMSNorm's weight gradient: columns, each
// summed in row order), so its bits are the one-thread bits.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/status_macros.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cpu_wide_loops.h"
#include "stage_server/compute/op_checks.h"
#include "stage_server/compute/parallel_ranges.h"

namespace pipetrain::compute {

// ---- RMSNorm ----------------------------------------------------------------------------
// The row sums are accumulated in double: without reassociation (which would make the
// bits depend on the vector width) a float sum is a scalar loop as well, so double costs
// nothing and leaves only the final roundings.

absl::Status CpuBackend::RmsNormForward(int rows, int C, float eps, const float* x,
                                        const float* weight, float* out, float* rstd) {
  // x (rows, C), weight (C), out (rows, C), rstd (rows)
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRmsNormForward(Name(), rows, C, eps, x, weight, out, rstd));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, rows, MinItems(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * C;
      float* o = out + r * C;
      double sq = 0;
      for (int c = 0; c < C; ++c) sq += double{xr[c]} * xr[c];
      const float rs = static_cast<float>(1.0 / std::sqrt(sq / C + double{eps}));
      for (int c = 0; c < C; ++c) o[c] = xr[c] * rs * weight[c];
      rstd[r] = rs;
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNormBackward(int rows, int C, const float* dout, const float* x,
                                         const float* weight, const float* rstd, float* dx,
                                         float* dweight) {
  // dout (rows, C), x (rows, C), weight (C), rstd (rows), dx (rows, C) +=, dweight (C) +=
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRmsNormBackward(Name(), rows, C, dout, x, weight, rstd, dx, dweight));
  if (call.empty()) return absl::OkStatus();
  if (dx != nullptr) {  // by rows: dx = rs (g - xhat mean(g xhat)), g = dout * weight
    ForRanges(loop_threads_, rows, MinItems(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * C;
        const float* d = dout + r * C;
        const float rs = rstd[r];
        double gx = 0;
        for (int c = 0; c < C; ++c) gx += double{d[c] * weight[c]} * xr[c];
        // xhat mean(g xhat) = x rs^2 mean(g x)
        const float k = static_cast<float>(gx / C * rs * rs);
        float* dxr = dx + r * C;
        for (int c = 0; c < C; ++c) dxr[c] += rs * (d[c] * weight[c] - xr[c] * k);
      }
    });
  }
  if (dweight == nullptr) return absl::OkStatus();
  // By columns: each sums its rows in row order.
  ForRanges(loop_threads_, C, MinItems(rows), [&](int64_t c0, int64_t c1) {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + int64_t{r} * C;
      const float* d = dout + int64_t{r} * C;
      const float rs = rstd[r];
      for (int64_t c = c0; c < c1; ++c) dweight[c] += d[c] * (xr[c] * rs);
    }
  });
  return absl::OkStatus();
}

// ---- Rotary embeddings ----------------------------------------------------------------------

namespace {
// One head's halves x1, x2 (half elements each) by the angles whose cosines and sines are
// c and sign * s: sign 1 forward, -1 back by the transposed rotation (as exact as writing
// the inverse's signs out: the product by -1 only flips the sign bit).
void RotateHead(int half, const float* c, const float* s, float sign, float* x1, float* x2) {
  for (int i = 0; i < half; ++i) {
    const float a = x1[i], b = x2[i], si = sign * s[i];
    x1[i] = a * c[i] - b * si;
    x2[i] = b * c[i] + a * si;
  }
}
}  // namespace

absl::Status CpuBackend::Rotary(int rows, int T, int heads, int hs, int64_t stride,
                                const float* cos, const float* sin, bool inverse, float* x) {
  // x (rows, >= stride), cos (T, hs/2), sin (T, hs/2)
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckRotary(Name(), rows, T, heads, hs, stride, cos, sin, x));
  if (call.empty()) return absl::OkStatus();
  const int half = hs / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  ForRanges(loop_threads_, rows, MinItems(int64_t{heads} * hs), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T;
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      for (int h = 0; h < heads; ++h) {
        float* x1 = x + r * stride + int64_t{h} * hs;
        RotateHead(half, c, s, sign, x1, x1 + half);
      }
    }
  });
  return absl::OkStatus();
}

// ---- SwiGLU (the exponentials through FastExp, cpu_wide_loops.h) ------------------------

absl::Status CpuBackend::SwiGluForward(int rows, int F, const float* gu, float* out) {
  // gu (rows, 2F), out (rows, F)
  ASSIGN_OR_RETURN(const OpCall call, CheckSwiGluForward(Name(), rows, F, gu, out));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, rows, MinItems(F), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* gate = gu + r * 2 * F;
      wide::SwiGluForward(F, gate, gate + F, out + r * F);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SwiGluBackward(int rows, int F, const float* gu, const float* dout,
                                        float* dgu) {
  // gu (rows, 2F), dout (rows, F), dgu (rows, 2F)
  ASSIGN_OR_RETURN(const OpCall call, CheckSwiGluBackward(Name(), rows, F, gu, dout, dgu));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, rows, MinItems(F), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* gate = gu + r * 2 * F;
      float* dgate = dgu + r * 2 * F;
      wide::SwiGluBackward(F, gate, gate + F, dout + r * F, dgate, dgate + F);
    }
  });
  return absl::OkStatus();
}

// ---- Grouped-query heads ----------------------------------------------------------------

absl::Status CpuBackend::RepeatKv(int rows, int NH, int NKV, int hs, const float* qkv,
                                  float* out) {
  // qkv (rows, (NH + 2 NKV) hs), out (rows, 3 NH hs)
  ASSIGN_OR_RETURN(const OpCall call, CheckRepeatKv(Name(), rows, NH, NKV, hs, qkv, out));
  if (call.empty()) return absl::OkStatus();
  const int group = NH / NKV;
  const int64_t q_cols = int64_t{NH} * hs, kv_cols = int64_t{NKV} * hs;
  const int64_t in_cols = q_cols + 2 * kv_cols, out_cols = 3 * q_cols;
  ForRanges(loop_threads_, rows, MinItems(out_cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* in = qkv + r * in_cols;
      float* o = out + r * out_cols;
      std::copy(in, in + q_cols, o);
      for (int part = 0; part < 2; ++part) {  // k, then v
        const float* src = in + q_cols + part * kv_cols;
        float* dst = o + (part + 1) * q_cols;
        for (int h = 0; h < NH; ++h) {
          const float* head = src + int64_t{h / group} * hs;
          std::copy(head, head + hs, dst + int64_t{h} * hs);
        }
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SumKvGroups(int rows, int NH, int NKV, int hs, const float* dfull,
                                     float* dqkv) {
  // dfull (rows, 3 NH hs), dqkv (rows, (NH + 2 NKV) hs)
  ASSIGN_OR_RETURN(const OpCall call, CheckSumKvGroups(Name(), rows, NH, NKV, hs, dfull, dqkv));
  if (call.empty()) return absl::OkStatus();
  const int group = NH / NKV;
  const int64_t q_cols = int64_t{NH} * hs, kv_cols = int64_t{NKV} * hs;
  const int64_t cols = q_cols + 2 * kv_cols, full_cols = 3 * q_cols;
  ForRanges(loop_threads_, rows, MinItems(full_cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* d = dfull + r * full_cols;
      float* o = dqkv + r * cols;
      std::copy(d, d + q_cols, o);
      for (int part = 0; part < 2; ++part) {
        const float* src = d + (part + 1) * q_cols;
        float* dst = o + q_cols + part * kv_cols;
        for (int kv = 0; kv < NKV; ++kv) {
          // The copies' gradients in copy order, the first one first.
          const float* copies = src + int64_t{kv} * group * hs;
          float* sum = dst + int64_t{kv} * hs;
          std::copy(copies, copies + hs, sum);
          for (int g = 1; g < group; ++g) {
            const float* copy = copies + int64_t{g} * hs;
            for (int i = 0; i < hs; ++i) sum[i] += copy[i];
          }
        }
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
