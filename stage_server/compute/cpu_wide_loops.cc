#include "stage_server/compute/cpu_wide_loops.h"

#include "common/bf16.h"
#include "stage_server/compute/fast_math.h"

// Each function below is built three times; the loader picks the widest the CPU has.
#define PIPETRAIN_WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace pipetrain::compute::wide {

namespace {
constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;
}  // namespace

PIPETRAIN_WIDE_CLONES
void GeluForward(int64_t n, const float* x, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    out[i] = v * SigmoidOfTwice(kGeluK * (v + kGeluA * v * v * v));
  }
}

PIPETRAIN_WIDE_CLONES
void GeluBackward(int64_t n, const float* x, const float* dout, float* dx) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    // With s = 0.5 (1 + tanh): 0.5 (1 - tanh^2) = 2 s (1 - s).
    const float s = SigmoidOfTwice(kGeluK * (v + kGeluA * v * v * v));
    const float grad = s + 2 * v * s * (1 - s) * kGeluK * (1 + 3 * kGeluA * v * v);
    dx[i] = grad * dout[i];
  }
}

// The logistic function through FastExp: 1 / (1 + exp(-g)) keeps FastExp's relative
// accuracy for every g (FastExp's clamp makes it 0 or 1 only beyond |g| = 87, where the
// float value is that anyway but for a denormal).
PIPETRAIN_WIDE_CLONES
void SwiGluForward(int64_t n, const float* gate, const float* up, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + FastExp(-g)) * up[i];
  }
}

PIPETRAIN_WIDE_CLONES
void SwiGluBackward(int64_t n, const float* gate, const float* up, const float* dout,
                    float* dgate, float* dup) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float s = 1.0f / (1.0f + FastExp(-g));
    // silu'(g) = s + g s (1 - s) = s (1 + g (1 - s))
    dgate[i] = dout[i] * up[i] * (s * (1.0f + g * (1.0f - s)));
    dup[i] = dout[i] * (g * s);
  }
}

PIPETRAIN_WIDE_CLONES
void ExpShifted(int64_t n, const float* x, float shift, float* out) {
  if (out == x) {  // in place: no overlap check for GCC to fail at run time
    for (int64_t i = 0; i < n; ++i) out[i] = FastExp(out[i] - shift);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = FastExp(x[i] - shift);
  }
}

PIPETRAIN_WIDE_CLONES
void FloatsToBf16Bits(int64_t n, const float* x, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = common::FloatToBf16Bits(x[i]);
}

}  // namespace pipetrain::compute::wide
