// A job's data: the corpus file (byte-level tokens) split into a training part and a
// held-out tail, and the batches drawn from them. Batches depend only on the seed and
// the step, so a job's data is the same on every run and for every pipeline shape.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/batch.h"
#include "common/model/gpt_config.h"
#include "pipetrain/v1/job.pb.h"

namespace pipetrain::coordinator {

struct Corpus {
  std::string path;
  std::string train;       // the head of the file
  std::string validation;  // its last data.validation_fraction (may be empty)
};

// Reads data.corpus and splits it (the spec has been through WithDefaults). Errors name data.corpus (unreadable, or a part
// shorter than one sequence of seq_len + 1 bytes).
absl::StatusOr<Corpus> LoadCorpus(const pipetrain::v1::JobSpec& spec);

// Training batch of step `step` (from 1): `rows` sequences drawn from the training part.
absl::StatusOr<model::TokenBatch> TrainingBatch(const Corpus& corpus, const model::GptConfig& model,
                                                int rows, uint64_t seed, int64_t step);
// The validation batch: the same `rows` sequences of the held-out part every time, so
// validation losses of different steps compare. FAILED_PRECONDITION if there is none.
absl::StatusOr<model::TokenBatch> ValidationBatch(const Corpus& corpus,
                                                  const model::GptConfig& model, int rows,
                                                  uint64_t seed);

}  // namespace pipetrain::coordinator
