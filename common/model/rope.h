// Rotary position embeddings' angles (RoFormer; Llama's convention): position t turns
// the pair (i, i + hs/2) of every head by t * inv_freq[i], inv_freq[i] = theta^(-2i/hs),
// with Llama 3.1's "llama3" scaling of the long wavelengths where the config has it (as
// Hugging Face's _compute_llama3_parameters). Computed in double, so that every backend
// and the float64 reference start from the same angles.
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/transformer_config.h"

namespace pipetrain::model {

// inv_freq (hs / 2) of a Llama config.
std::vector<double> RotaryInverseFrequencies(const TransformerConfig& config);

// cos and sin of t * inv_freq[i], each (seq_len, hs / 2) row-major.
struct RotaryTables {
  std::vector<double> cos, sin;
};
RotaryTables MakeRotaryTables(const TransformerConfig& config);
// Bytes of the two tables on a stage, in fp32: 2 x seq_len x hs / 2 x 4, saturating at
// UINT64_MAX; 0 for a shape without positions or heads.
uint64_t RotaryTableBytes(const TransformerConfig& config);

}  // namespace pipetrain::model
