// Token batches, as every trainer of this model reads them: B rows of T + 1 tokens
// (inputs = row[0:T], targets = row[1:T+1]) drawn from a token stream (a text's bytes,
// token files) by (seed, step) alone, so that any pipeline shape and any machine sees the
// same data, and cut into micro-batches.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/transformer_config.h"
#include "common/tensor.h"

namespace pipetrain::model {

// inputs and targets are (rows, T) row-major.
struct TokenBatch {
  int rows = 0;
  std::vector<int32_t> inputs;
  std::vector<int32_t> targets;
};

// A token stream of `size` tokens is read through a function that writes its tokens
// [start, start + n) to out[0, n); the range always lies within the stream. Streams
// need not be in memory (token files are mapped) nor contiguous (several files).
using CopyTokensFn = absl::FunctionRef<void(int64_t start, int64_t n, int32_t* out)>;

// Rows start at offsets drawn by a counter PRNG from (seed, step, row), uniform over
// [0, size - T - 1]: the same batches on every machine. Fails if the stream is shorter
// than T + 1 tokens or a token is outside the vocabulary.
absl::StatusOr<TokenBatch> SampleBatch(int64_t size, CopyTokensFn copy,
                                       const TransformerConfig& config, int rows, uint64_t seed,
                                       int step);
// The same over a text, whose bytes are the tokens.
absl::StatusOr<TokenBatch> SampleBatch(absl::string_view text, const TransformerConfig& config,
                                       int rows, uint64_t seed, int step);
// The first rows * (T + 1) tokens as consecutive rows (what `pipetrain eval` reads).
absl::StatusOr<TokenBatch> LeadingBatch(int64_t size, CopyTokensFn copy,
                                        const TransformerConfig& config, int rows);
absl::StatusOr<TokenBatch> LeadingBatch(absl::string_view text, const TransformerConfig& config,
                                        int rows);
// Checks that a text holds at least `needed` bytes (rows of seq_len + 1 bytes).
absl::Status CheckTextLength(absl::string_view text, int64_t needed);

// Replica `replica`'s share of a step's global batch for R = `replicas` data-parallel
// copies of the pipeline: the contiguous rows [r * B / R, (r + 1) * B / R), inputs and
// targets. The shares are disjoint, in order and together exactly the batch, so which
// sequences a replica trains on depends only on (seed, step) and R, and the job's data is
// the same for every R and K. INVALID_ARGUMENT, naming the counts, when R < 1, replica is
// outside [0, R), B is not divisible by R, or the batch's matrices are not B rows.
absl::StatusOr<TokenBatch> ReplicaRows(const TokenBatch& batch, int replica, int replicas);

// Rows [mb * rows, (mb + 1) * rows) of a (B, T) token matrix as one (rows, T) int32
// tensor: micro-batch `mb` of a batch split into micro-batches of `rows` rows.
common::Tensor MicroBatchRows(const std::vector<int32_t>& tokens, int mb, int rows,
                              int seq_len);

}  // namespace pipetrain::model
