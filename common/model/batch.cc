#include "common/model/batch.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/model/init.h"
#include "common/status_macros.h"

namespace pipetrain::model {
namespace {

// How errors name a stream's tokens: a text's are bytes.
struct Words {
  const char* stream;  // "text"
  const char* token;   // "byte"
};
constexpr Words kTextWords = {"text", "byte"};
constexpr Words kStreamWords = {"stream", "token"};

absl::Status CheckLength(int64_t size, int64_t needed, Words words) {
  if (size < needed) {
    return absl::InvalidArgumentError(absl::StrCat(words.stream, " has ", size, " ", words.token,
                                                   "s; need at least ", needed,
                                                   " (rows of seq_len + 1 ", words.token, "s)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenBatch> BatchFromOffsets(CopyTokensFn copy, const TransformerConfig& config,
                                            const std::vector<int64_t>& offsets, Words words) {
  const int T = config.seq_len;
  TokenBatch batch;
  batch.rows = static_cast<int>(offsets.size());
  batch.inputs.reserve(offsets.size() * T);
  batch.targets.reserve(offsets.size() * T);
  std::vector<int32_t> row(static_cast<size_t>(T) + 1);
  for (int64_t start : offsets) {
    copy(start, T + 1, row.data());
    for (int t = 0; t <= T; ++t) {
      if (row[t] < 0 || row[t] >= config.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(words.stream, " ", words.token, " ", start + t, " = ", row[t],
                         " is outside the vocabulary (", config.vocab_size, ")"));
      }
    }
    batch.inputs.insert(batch.inputs.end(), row.begin(), row.end() - 1);
    batch.targets.insert(batch.targets.end(), row.begin() + 1, row.end());
  }
  return batch;
}

absl::StatusOr<TokenBatch> Sample(int64_t size, CopyTokensFn copy, const TransformerConfig& config,
                                  int rows, uint64_t seed, int step, Words words) {
  const int64_t row_len = int64_t{config.seq_len} + 1;
  RETURN_IF_ERROR(CheckLength(size, row_len, words));
  const uint64_t starts = size - row_len + 1;
  // Stream key per step (layer index -1 marks data, apart from every parameter stream).
  const uint64_t key = InitStreamKey(seed, -1, step);
  std::vector<int64_t> offsets;
  for (int r = 0; r < rows; ++r) {
    // The modulo bias is below starts / 2^64: negligible for any stream.
    const uint64_t bits = InitStreamKey(key, r, 0);
    offsets.push_back(static_cast<int64_t>(bits % starts));
  }
  return BatchFromOffsets(copy, config, offsets, words);
}

absl::StatusOr<TokenBatch> Leading(int64_t size, CopyTokensFn copy, const TransformerConfig& config,
                                   int rows, Words words) {
  const int64_t row_len = int64_t{config.seq_len} + 1;
  RETURN_IF_ERROR(CheckLength(size, row_len * rows, words));
  std::vector<int64_t> offsets;
  for (int r = 0; r < rows; ++r) offsets.push_back(r * row_len);
  return BatchFromOffsets(copy, config, offsets, words);
}

// A text's bytes as a token stream.
auto TextCopier(absl::string_view text) {
  return [text](int64_t start, int64_t n, int32_t* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(text[start + i]);
  };
}

}  // namespace

absl::Status CheckTextLength(absl::string_view text, int64_t needed) {
  return CheckLength(static_cast<int64_t>(text.size()), needed, kTextWords);
}

absl::StatusOr<TokenBatch> SampleBatch(int64_t size, CopyTokensFn copy,
                                       const TransformerConfig& config, int rows, uint64_t seed,
                                       int step) {
  return Sample(size, copy, config, rows, seed, step, kStreamWords);
}

absl::StatusOr<TokenBatch> SampleBatch(absl::string_view text, const TransformerConfig& config,
                                       int rows, uint64_t seed, int step) {
  return Sample(static_cast<int64_t>(text.size()), TextCopier(text), config, rows, seed, step,
                kTextWords);
}

absl::StatusOr<TokenBatch> LeadingBatch(int64_t size, CopyTokensFn copy,
                                        const TransformerConfig& config, int rows) {
  return Leading(size, copy, config, rows, kStreamWords);
}

absl::StatusOr<TokenBatch> LeadingBatch(absl::string_view text, const TransformerConfig& config,
                                        int rows) {
  return Leading(static_cast<int64_t>(text.size()), TextCopier(text), config, rows, kTextWords);
}

absl::StatusOr<TokenBatch> ReplicaRows(const TokenBatch& batch, int replica, int replicas) {
  if (replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica rows: replicas must be >= 1 (got ", replicas, ")"));
  }
  if (replica < 0 || replica >= replicas) {
    return absl::InvalidArgumentError(absl::StrCat("replica rows: replica ", replica,
                                                   " is outside [0, ", replicas, ")"));
  }
  if (batch.rows < 0 || batch.rows % replicas != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica rows: a batch of ", batch.rows, " rows does not split into ",
                     replicas, " equal replica shares"));
  }
  const size_t size = batch.inputs.size();
  if (batch.targets.size() != size || (batch.rows == 0 ? size != 0 : size % batch.rows != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica rows: the batch's ", batch.rows, " rows hold ", size, " inputs and ",
        batch.targets.size(), " targets; expected the same whole number of tokens per row"));
  }
  const size_t per_row = batch.rows == 0 ? 0 : size / batch.rows;
  const int rows = batch.rows / replicas;
  const size_t first = static_cast<size_t>(replica) * rows * per_row;
  const size_t end = first + static_cast<size_t>(rows) * per_row;
  TokenBatch share;
  share.rows = rows;
  share.inputs.assign(batch.inputs.begin() + first, batch.inputs.begin() + end);
  share.targets.assign(batch.targets.begin() + first, batch.targets.begin() + end);
  return share;
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
