#include "coordinator/corpus.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::coordinator {

absl::StatusOr<Corpus> LoadCorpus(const pipetrain::v1::JobSpec& spec) {
  const std::string& path = spec.data().corpus();
  if (path.empty()) {
    return absl::InvalidArgumentError(
        "data.corpus: missing; give the path of a text file the coordinator can read");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.corpus: cannot read '", path,
        "' on the coordinator's machine; paths are read by the coordinator, so give one it "
        "can open (absolute, or relative to its working directory)"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  Corpus corpus;
  corpus.path = path;
  corpus.train = std::move(text).str();
  const double fraction = spec.data().validation_fraction();  // WithDefaults filled it in
  const size_t held = static_cast<size_t>(std::floor(corpus.train.size() * fraction));
  corpus.validation = corpus.train.substr(corpus.train.size() - held);
  corpus.train.resize(corpus.train.size() - held);
  const size_t need = static_cast<size_t>(spec.model().seq_len()) + 1;
  if (corpus.train.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.corpus: '", path, "' gives ", corpus.train.size(),
        " training bytes, fewer than one sequence of model.seq_len + 1 = ", need));
  }
  if (held > 0 && spec.data().validate_every_steps() > 0 && corpus.validation.size() < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data.validation_fraction: the held-out tail of '", path, "' is ", held,
        " bytes, fewer than one sequence of model.seq_len + 1 = ", need,
        "; raise the fraction or set data.validate_every_steps to 0"));
  }
  return corpus;
}

absl::StatusOr<model::TokenBatch> TrainingBatch(const Corpus& corpus, const model::GptConfig& model,
                                                int rows, uint64_t seed, int64_t step) {
  return model::SampleBatch(corpus.train, model, rows, seed, static_cast<int>(step));
}

absl::StatusOr<model::TokenBatch> ValidationBatch(const Corpus& corpus,
                                                  const model::GptConfig& model, int rows,
                                                  uint64_t seed) {
  if (corpus.validation.size() < static_cast<size_t>(model.seq_len) + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("data.validation_fraction: '", corpus.path,
                     "' has no held-out tail long enough for one sequence"));
  }
  // Step 0 is never a training step, so this batch is not one the model trains on.
  return model::SampleBatch(corpus.validation, model, rows, seed, 0);
}

}  // namespace pipetrain::coordinator
