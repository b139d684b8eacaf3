// bfloat16: the top 16 bits of an IEEE float (8 exponent bits, 7 mantissa bits). One
// rounding rule for the whole tree, round to nearest with ties to even (what oneDNN's
// reorders, cuBLAS and PyTorch do), so a tensor rounded here, by the reference backend,
// and by a fast path holds the same bits. NaN stays a (quiet) NaN.
#pragma once

#include <bit>
#include <cstdint>

namespace pipetrain::common {

// The bf16 nearest to x, as its 16 bits.
// Branch-free, so that loops over it vectorise.
constexpr uint16_t FloatToBf16Bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;  // NaN: keep the sign, force quiet
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// Every bf16 is exactly a float.
constexpr float Bf16BitsToFloat(uint16_t b) { return std::bit_cast<float>(uint32_t{b} << 16); }

// x rounded to the nearest bf16, held in a float.
constexpr float RoundToBf16(float x) { return Bf16BitsToFloat(FloatToBf16Bits(x)); }

}  // namespace pipetrain::common
