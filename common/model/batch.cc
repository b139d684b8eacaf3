#include "common/model/batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/model/init.h"
#include "common/status_macros.h"

namespace pipetrain::model {
namespace {

absl::StatusOr<TokenBatch> BatchFromOffsets(absl::string_view text,
                                            const GptConfig& config,
                                            const std::vector<int64_t>& offsets) {
  const int T = config.seq_len;
  TokenBatch batch;
  batch.rows = static_cast<int>(offsets.size());
  for (int64_t start : offsets) {
    for (int t = 0; t <= T; ++t) {
      const int32_t byte = static_cast<unsigned char>(text[start + t]);
      if (byte >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("text byte ", start + t, " = ", byte,
                         " is outside the vocabulary (", config.vocab_size, ")"));
      }
      if (t < T) batch.inputs.push_back(byte);
      if (t > 0) batch.targets.push_back(byte);
    }
  }
  return batch;
}

}  // namespace

absl::Status CheckTextLength(absl::string_view text, int64_t needed) {
  if (static_cast<int64_t>(text.size()) < needed) {
    return absl::InvalidArgumentError(absl::StrCat("text has ", text.size(),
                                                   " bytes; need at least ", needed,
                                                   " (rows of seq_len + 1 bytes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenBatch> SampleBatch(absl::string_view text, const GptConfig& config,
                                       int rows, uint64_t seed, int step) {
  const int64_t row_len = int64_t{config.seq_len} + 1;
  RETURN_IF_ERROR(CheckTextLength(text, row_len));
  const uint64_t starts = text.size() - row_len + 1;
  // Stream key per step (layer index -1 marks data, apart from every parameter stream).
  const uint64_t key = InitStreamKey(seed, -1, step);
  std::vector<int64_t> offsets;
  for (int r = 0; r < rows; ++r) {
    // The modulo bias is below starts / 2^64: negligible for any text.
    const uint64_t bits = InitStreamKey(key, r, 0);
    offsets.push_back(static_cast<int64_t>(bits % starts));
  }
  return BatchFromOffsets(text, config, offsets);
}

absl::StatusOr<TokenBatch> LeadingBatch(absl::string_view text, const GptConfig& config,
                                        int rows) {
  const int64_t row_len = int64_t{config.seq_len} + 1;
  RETURN_IF_ERROR(CheckTextLength(text, row_len * rows));
  std::vector<int64_t> offsets;
  for (int r = 0; r < rows; ++r) offsets.push_back(r * row_len);
  return BatchFromOffsets(text, config, offsets);
}

common::Tensor MicroBatchRows(const std::vector<int32_t>& tokens, int mb, int rows,
                              int seq_len) {
  common::Tensor t = *common::Tensor::Create(common::DType::kI32, {rows, seq_len});
  std::copy(tokens.begin() + static_cast<size_t>(mb) * rows * seq_len,
            tokens.begin() + static_cast<size_t>(mb + 1) * rows * seq_len,
            t.data<int32_t>().begin());
  return t;
}

}  // namespace pipetrain::model
