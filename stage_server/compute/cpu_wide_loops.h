// The cpu backend's hottest loops outside the products, each compiled once per vector
// width (SSE2, AVX2, AVX-512) and chosen when the program loads by what the processor
// reports (GCC's target_clones), so that one binary runs everywhere and uses the widest
// registers where they exist. One machine always takes the same clone, so the same
// inputs give the same bits run after run; the clones may differ from each other in the
// last bits (fused multiply-adds), which the conformance budgets allow.
#pragma once

#include <cstdint>

namespace pipetrain::compute::wide {

// out = x * 0.5 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise.
void GeluForward(int64_t n, const float* x, float* out);
// dx = dout * d/dx GELU(x), elementwise.
void GeluBackward(int64_t n, const float* x, const float* dout, float* dx);
// SwiGLU over n elements: out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
void SwiGluForward(int64_t n, const float* gate, const float* up, float* out);
// dgate[i] = dout[i] * up[i] * silu'(gate[i]); dup[i] = dout[i] * silu(gate[i]).
void SwiGluBackward(int64_t n, const float* gate, const float* up, const float* dout,
                    float* dgate, float* dup);
// out[i] = exp(x[i] - shift) (FastExp); out may be x.
void ExpShifted(int64_t n, const float* x, float shift, float* out);
// out[i] = the bf16 bits nearest x[i] (common::FloatToBf16Bits).
void FloatsToBf16Bits(int64_t n, const float* x, uint16_t* out);

}  // namespace pipetrain::compute::wide
