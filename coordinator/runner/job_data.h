// A job's data: a text (data.corpus, its bytes are the tokens) or token files
// (data.tokens, memory-mapped), as a training stream and a validation stream, and the
// batches drawn from them. Batches depend only on the seed and the step, so a job's data
// is the same on every run and for every pipeline shape.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/data/token_file.h"
#include "common/model/batch.h"
#include "common/model/transformer_config.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

// Tokens [begin, begin + size) of a text's bytes or of a token dataset's stream. Cheap
// to copy: the text and the mapped files are shared.
class TokenWindow {
 public:
  TokenWindow() = default;
  TokenWindow(std::shared_ptr<const std::string> text, int64_t begin, int64_t size)
      : text_(std::move(text)), begin_(begin), size_(size) {}
  TokenWindow(std::shared_ptr<const data::TokenDataset> tokens, int64_t begin, int64_t size)
      : tokens_(std::move(tokens)), begin_(begin), size_(size) {}

  int64_t size() const { return size_; }
  // Tokens [start, start + n) of the window into out[0, n) (a model::CopyTokensFn).
  void Copy(int64_t start, int64_t n, int32_t* out) const;

 private:
  std::shared_ptr<const std::string> text_;           // set for a text,
  std::shared_ptr<const data::TokenDataset> tokens_;  // or this for token files
  int64_t begin_ = 0;
  int64_t size_ = 0;
};

struct JobData {
  std::string description;       // the files, as errors name them: "'kjv.txt'"
  TokenWindow train;             // data.tokens, or the head of the text / token stream
  TokenWindow validation;        // data.validation_tokens, or the held-out tail (may be empty)
  std::string validation_field;  // what errors about `validation` name
};

// Reads data.corpus or maps data.tokens (globs expanded) and data.validation_tokens,
// and splits off the held-out tail unless validation files are given (the spec has
// been through WithDefaults). Token files are checked whole, once: their layout and
// every id against model.vocab_size. INVALID_ARGUMENT naming the field and the file:
// unreadable, malformed, an id out of the vocabulary, a pattern matching nothing, or a
// part shorter than one sequence of seq_len + 1 tokens.
absl::StatusOr<JobData> LoadJobData(const pipetrain::v1::JobSpec& spec);

// Training batch of step `step` (from 1): `rows` sequences drawn from the training part.
absl::StatusOr<model::TokenBatch> TrainingBatch(const JobData& data,
                                                const model::TransformerConfig& model, int rows,
                                                uint64_t seed, int64_t step);
// The validation batch: the same `rows` sequences of the validation part every time, so
// validation losses of different steps compare. FAILED_PRECONDITION if there is none.
absl::StatusOr<model::TokenBatch> ValidationBatch(const JobData& data,
                                                  const model::TransformerConfig& model, int rows,
                                                  uint64_t seed);

}  // namespace pipetrain::coordinator
