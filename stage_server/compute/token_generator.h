// The generation loop: a prompt into a key-value cache decoder, then one sampled token at
// a time, each handed to the caller as soon as it is drawn (to print it). A model sees at
// most seq_len positions, so a longer text slides a window: when the cache is full, it
// starts again from the last half of the context (kept tokens re-fed), which costs one
// re-feed every seq_len / 2 tokens instead of a whole forward every token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stage_server/compute/kv_cache_decoder.h"
#include "stage_server/compute/token_sampler.h"

namespace pipetrain::compute {

// Tokens kept when the window slides: the last half of the context (at least one).
inline int SlideKeep(int seq_len) { return seq_len / 2 > 0 ? seq_len / 2 : 1; }

// Feeds `prompt` (its last seq_len tokens if longer) and draws `new_tokens` tokens, draw i
// with SampleToken(..., i); on_token gets each one at once (an error from it stops the
// loop and is returned). Returns the new tokens. InvalidArgument for an empty prompt,
// new_tokens < 0, bad sampling options or a prompt token outside the vocabulary.
template <typename Real>
absl::StatusOr<std::vector<int32_t>> GenerateTokens(
    KvCacheDecoderT<Real>& decoder, std::span<const int32_t> prompt, int new_tokens,
    const SamplingOptions& sampling, absl::FunctionRef<absl::Status(int32_t)> on_token);

}  // namespace pipetrain::compute
