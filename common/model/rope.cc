#include "common/model/rope.h"

#include <cmath>
#include <numbers>

#include "common/checked_math.h"
#include "common/tensor.h"

namespace pipetrain::model {
namespace {

// Llama 3.1's scaling: wavelengths longer than original_context / low_freq_factor are
// stretched by factor, those shorter than original_context / high_freq_factor kept, and
// those between blended linearly in original_context / wavelength.
double ScaledFrequency(double inv_freq, const RopeScaling& s) {
  const double wavelength = 2 * std::numbers::pi / inv_freq;
  const double low_freq_wavelength = s.original_context / s.low_freq_factor;
  const double high_freq_wavelength = s.original_context / s.high_freq_factor;
  if (wavelength > low_freq_wavelength) return inv_freq / s.factor;
  if (wavelength < high_freq_wavelength) return inv_freq;
  const double smooth = (s.original_context / wavelength - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
  return (1 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

}  // namespace

std::vector<double> RotaryInverseFrequencies(const TransformerConfig& c) {
  const int hs = c.head_dim(), half = hs / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(c.rope_theta, 2.0 * i / hs);
    if (c.rope_scaling.factor != 0) inv[i] = ScaledFrequency(inv[i], c.rope_scaling);
  }
  return inv;
}

RotaryTables MakeRotaryTables(const TransformerConfig& c) {
  const std::vector<double> inv = RotaryInverseFrequencies(c);
  const size_t half = inv.size();
  RotaryTables t;
  t.cos.resize(size_t(c.seq_len) * half);
  t.sin.resize(t.cos.size());
  for (int pos = 0; pos < c.seq_len; ++pos) {
    for (size_t i = 0; i < half; ++i) {
      const double angle = pos * inv[i];
      t.cos[pos * half + i] = std::cos(angle);
      t.sin[pos * half + i] = std::sin(angle);
    }
  }
  return t;
}

uint64_t RotaryTableBytes(const TransformerConfig& c) {
  if (c.seq_len <= 0 || c.n_heads <= 0 || c.head_dim() / 2 <= 0) return 0;
  const uint64_t table = common::SaturatingMul(static_cast<uint64_t>(c.seq_len),
                                               static_cast<uint64_t>(c.head_dim() / 2));
  return common::SaturatingMul(2 * common::DTypeSize(common::DType::kF32), table);
}

}  // namespace pipetrain::model
