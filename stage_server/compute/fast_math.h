// The cpu backend's float exp and the logistic function built on it, written without
// calls or branches so that GCC vectorises the loops using them (libm's expf/tanhf took
// a quarter of a training step). Compiled with -fno-trapping-math (CMakeLists.txt).
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace pipetrain::compute {

// exp(x) in float, about 2 ulp: Cephes' polynomial on x - n ln2, then 2^n through the
// exponent bits.
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

}  // namespace pipetrain::compute
