// Picks the next token from a model's logits: greedy at temperature 0, else a draw from
// softmax(logits / temperature) over the top-k ids. The draw is the seed's uniform number
// of a counter-based stream (model::UniformAt), not std::*_distribution, so one seed
// gives the same tokens from the same logits on every platform and standard library.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pipetrain::compute {

struct SamplingOptions {
  double temperature = 1.0;  // 0: greedy (argmax, ties to the lowest id); else > 0
  int top_k = 0;             // keep the k most likely ids; 0 (or k >= V): all of them
  uint64_t seed = 0;
};

// InvalidArgument naming "temperature" or "top_k" for a negative, NaN or infinite
// temperature or a negative top_k.
absl::Status ValidateSampling(const SamplingOptions& options);

// Token number `draw` (0, 1, ... within one generation) from logits (V): it uses the
// seed's uniform number `draw` and nothing else, so it is reproducible. Ids tied in
// logit are ordered lowest first, for the argmax and for the top-k cut. InvalidArgument
// for bad options, empty logits or a NaN logit.
template <typename Real>
absl::StatusOr<int32_t> SampleToken(std::span<const Real> logits, const SamplingOptions& options,
                                    uint64_t draw);

}  // namespace pipetrain::compute
