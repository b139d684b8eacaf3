// The cpu backend's ops other than products: single-pass float loops spread over the
// backend's threads by ForRanges (parallel_ranges.h). Each splits only what it computes
// independently (rows, columns or elements), so its bits are the one-thread bits.
#include <cmath>
#include <vector>

#include "common/status_macros.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cpu_wide_loops.h"
#include "stage_server/compute/fast_math.h"
#include "stage_server/compute/op_checks.h"
#include "stage_server/compute/parallel_ranges.h"
#include "stage_server/compute/reference_ops.h"

namespace pipetrain::compute {

// ---- Elementwise: the reference loops on each thread's piece --------------------------

absl::Status CpuBackend::Add(int64_t n, const float* a, const float* b, float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAdd(Name(), n, a, b, out));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, n, MinItems(1), [&](int64_t i0, int64_t i1) {
    reference::Add(i1 - i0, a + i0, b + i0, out + i0);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Axpy(int64_t n, float alpha, const float* x, float* y) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAxpy(Name(), n, x, y));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, n, MinItems(1), [&](int64_t i0, int64_t i1) {
    reference::Axpy(i1 - i0, alpha, x + i0, y + i0);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Scale(int64_t n, float alpha, float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckScale(Name(), n, x));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, n, MinItems(1),
            [&](int64_t i0, int64_t i1) { reference::Scale(i1 - i0, alpha, x + i0); });
  return absl::OkStatus();
}

absl::Status CpuBackend::RoundToBf16(int64_t n, float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckRoundToBf16(Name(), n, x));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, n, MinItems(1),
            [&](int64_t i0, int64_t i1) { reference::RoundToBf16(i1 - i0, x + i0); });
  return absl::OkStatus();
}

absl::Status CpuBackend::AdamW(int64_t n, float* param, const float* grad, float* m, float* v,
                               float lr, float beta1, float beta2, float eps,
                               float weight_decay, int step) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAdamW(Name(), n, param, grad, m, v, step));
  if (call.empty()) return absl::OkStatus();
  // In float, as torch.optim.AdamW computes it (the reference and the cuda kernel use
  // double): the bias corrections folded into a step size and a divisor once, then one
  // division and one square root a parameter. A double division and square root a
  // parameter made AdamW the largest cost of a GPT-2-124M step, above all its products.
  const float lr_decay = lr * weight_decay;
  const float step_size = static_cast<float>(lr / (1 - std::pow(double{beta1}, step)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1 - std::pow(double{beta2}, step)));
  const float one_minus_beta1 = 1 - beta1, one_minus_beta2 = 1 - beta2;
  // Captured by value: a store through p could alias a captured reference, which keeps
  // GCC from vectorising.
  ForRanges(loop_threads_, n, MinItems(1), [=](int64_t i0, int64_t i1) {
    float* __restrict p = param + i0;
    const float* __restrict g = grad + i0;
    float* __restrict mi = m + i0;
    float* __restrict vi = v + i0;
    for (int64_t i = 0; i < i1 - i0; ++i) {
      const float gi = g[i];
      const float pi = p[i] - lr_decay * p[i];
      const float mn = beta1 * mi[i] + one_minus_beta1 * gi;
      const float vn = beta2 * vi[i] + one_minus_beta2 * gi * gi;
      mi[i] = mn;
      vi[i] = vn;
      p[i] = pi - step_size * mn / (std::sqrt(vn) / bc2_sqrt + eps);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluForward(int64_t n, const float* x, float* out) {
  // x (N), out (N)
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluForward(Name(), n, x, out));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, n, MinItems(1), [&](int64_t i0, int64_t i1) {
    wide::GeluForward(i1 - i0, x + i0, out + i0);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::GeluBackward(int64_t n, const float* x, const float* dout,
                                      float* dx) {
  // x (N), dout (N), dx (N)
  ASSIGN_OR_RETURN(const OpCall call, CheckGeluBackward(Name(), n, x, dout, dx));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, n, MinItems(1), [&](int64_t i0, int64_t i1) {
    wide::GeluBackward(i1 - i0, x + i0, dout + i0, dx + i0);
  });
  return absl::OkStatus();
}

// ---- By rows --------------------------------------------------------------------------

absl::Status CpuBackend::AddBias(int rows, int cols, const float* bias, float* x) {
  ASSIGN_OR_RETURN(const OpCall call, CheckAddBias(Name(), rows, cols, bias, x));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, rows, MinItems(cols), [&](int64_t r0, int64_t r1) {
    reference::AddBias(static_cast<int>(r1 - r0), cols, bias, x + r0 * cols);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::EmbeddingForward(int B, int T, int C, int V, const int32_t* tokens,
                                          const float* wte, const float* wpe, float* out) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckEmbeddingForward(Name(), B, T, C, V, tokens, wte, wpe, out));
  if (call.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckHostIds(Name(), call, "tokens", tokens, int64_t{B} * T, V));
  ForRanges(loop_threads_, B, MinItems(int64_t{T} * C), [&](int64_t b0, int64_t b1) {
    reference::EmbeddingForward(static_cast<int>(b1 - b0), T, C, V, tokens + b0 * T, wte, wpe,
                                out + b0 * T * C);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::Softmax(int rows, int cols, const float* x, float* out) {
  ASSIGN_OR_RETURN(const OpCall call, CheckSoftmax(Name(), rows, cols, x, out));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, rows, MinItems(cols), [&](int64_t r0, int64_t r1) {
    reference::Softmax(static_cast<int>(r1 - r0), cols, x + r0 * cols, out + r0 * cols);
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::LayerNormForward(int rows, int C, const float* x,
                                          const float* weight, const float* bias,
                                          float* out, float* mean, float* rstd) {
  // x (rows, C), weight (C), bias (C), out (rows, C), mean (rows), rstd (rows)
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckLayerNormForward(Name(), rows, C, x, weight, bias, out, mean, rstd));
  if (call.empty()) return absl::OkStatus();
  const float eps = static_cast<float>(reference::kLayerNormEps);
  ForRanges(loop_threads_, rows, MinItems(C), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * C;
      float* o = out + r * C;
      float sum = 0;
      for (int c = 0; c < C; ++c) sum += xr[c];
      const float mu = sum / C;
      float var = 0;
      for (int c = 0; c < C; ++c) var += (xr[c] - mu) * (xr[c] - mu);
      const float rs = 1.0f / std::sqrt(var / C + eps);
      for (int c = 0; c < C; ++c) o[c] = (xr[c] - mu) * rs * weight[c] + bias[c];
      mean[r] = mu;
      rstd[r] = rs;
    }
  });
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
  if (dx != nullptr) {  // by rows
    ForRanges(loop_threads_, rows, MinItems(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x + r * C;
        const float* d = dout + r * C;
        const float mu = mean[r], rs = rstd[r];
        float g_mean = 0, gx_mean = 0;
        for (int c = 0; c < C; ++c) {
          const float g = d[c] * weight[c];
          g_mean += g;
          gx_mean += g * (xr[c] - mu) * rs;
        }
        g_mean /= C;
        gx_mean /= C;
        float* dxr = dx + r * C;
        for (int c = 0; c < C; ++c) {
          const float xhat = (xr[c] - mu) * rs;
          dxr[c] += rs * (d[c] * weight[c] - g_mean - xhat * gx_mean);
        }
      }
    });
  }
  if (dweight == nullptr && dbias == nullptr) return absl::OkStatus();
  // By columns: each sums its rows in row order.
  ForRanges(loop_threads_, C, MinItems(rows), [&](int64_t c0, int64_t c1) {
    for (int r = 0; r < rows; ++r) {
      const float* xr = x + int64_t{r} * C;
      const float* d = dout + int64_t{r} * C;
      const float mu = mean[r], rs = rstd[r];
      if (dweight != nullptr) {
        for (int64_t c = c0; c < c1; ++c) dweight[c] += d[c] * (xr[c] - mu) * rs;
      }
      if (dbias != nullptr) {
        for (int64_t c = c0; c < c1; ++c) dbias[c] += d[c];
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::BiasGrad(int rows, int cols, const float* dout, float* dbias) {
  // dout (rows, cols), dbias (cols) +=. By columns, each summing its rows in row order.
  ASSIGN_OR_RETURN(const OpCall call, CheckBiasGrad(Name(), rows, cols, dout, dbias));
  if (call.empty()) return absl::OkStatus();
  ForRanges(loop_threads_, cols, MinItems(rows), [&](int64_t c0, int64_t c1) {
    for (int r = 0; r < rows; ++r) {
      const float* d = dout + int64_t{r} * cols;
      for (int64_t c = c0; c < c1; ++c) dbias[c] += d[c];
    }
  });
  return absl::OkStatus();
}

// ---- Cross-entropy ----------------------------------------------------------------------

absl::Status CpuBackend::CrossEntropyForward(int rows, int V, const float* logits,
                                             const int32_t* targets, float* probs,
                                             float* loss) {
  // logits (rows, V), targets (rows), probs (rows, V), loss (1)
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCrossEntropyForward(Name(), rows, V, logits, targets, probs, loss));
  RETURN_IF_ERROR(CheckHostIds(Name(), call, "targets", targets, rows, V));
  std::vector<double> row_loss(rows);
  ForRanges(loop_threads_, rows, MinItems(V), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* l = logits + r * V;
      float* p = probs + r * V;
      float max_logit = l[0];
      for (int v = 1; v < V; ++v) max_logit = std::max(max_logit, l[v]);
      const float target_logit = l[targets[r]];  // read before p (which may alias l)
      // The denominator is summed in double: over GPT-2's 50,257 terms a float sum
      // drifts by ~1e-4 relative, which every probability would inherit.
      wide::ExpShifted(V, l, max_logit, p);
      double sum = 0;
      for (int v = 0; v < V; ++v) sum += p[v];
      const float inv = static_cast<float>(1.0 / sum);
      for (int v = 0; v < V; ++v) p[v] *= inv;
      row_loss[r] = std::log(sum) + max_logit - target_logit;
    }
  });
  double total = 0;  // in row order, whatever the pieces
  for (double l : row_loss) total += l;
  *loss = static_cast<float>(total / rows);
  return absl::OkStatus();
}

absl::Status CpuBackend::CrossEntropyBackward(int rows, int V, const float* probs,
                                              const int32_t* targets, float dloss_scale,
                                              float* dlogits) {
  ASSIGN_OR_RETURN(const OpCall call,
                   CheckCrossEntropyBackward(Name(), rows, V, probs, targets, dlogits));
  if (call.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckHostIds(Name(), call, "targets", targets, rows, V));
  ForRanges(loop_threads_, rows, MinItems(V), [&](int64_t r0, int64_t r1) {
    reference::CrossEntropyBackward(static_cast<int>(r1 - r0), V, probs + r0 * V, targets + r0,
                                    dloss_scale, dlogits + r0 * V);
  });
  return absl::OkStatus();
}

}  // namespace pipetrain::compute
