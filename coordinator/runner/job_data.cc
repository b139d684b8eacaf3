#include "coordinator/runner/job_data.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/error_context.h"
#include "common/status_macros.h"
#include "common/user_path.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

// The share of `size` that data.validation_fraction holds out, rounded down.
int64_t HeldOut(int64_t size, const pb::DataSpec& d) {
  const double fraction = d.validation_fraction();  // WithDefaults filled it in
  return static_cast<int64_t>(std::floor(size * fraction));
}

absl::StatusOr<JobData> LoadText(const pb::JobSpec& spec) {
  const std::string& path = spec.data().corpus();
  // Checked without opening first: a FIFO or a device would block or never end.
  absl::StatusOr<std::string> read =
      common::ReadRegularFile(path, common::kMaxTextFileBytes, "data.corpus:");
  if (!read.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        read.status().message(),
        " on the coordinator's machine; paths are read by the coordinator, so give a text "
        "file it can open (absolute, or relative to its working directory)"));
  }
  auto text = std::make_shared<const std::string>(*std::move(read));
  const int64_t size = static_cast<int64_t>(text->size());
  const int64_t held = HeldOut(size, spec.data());
  JobData data;
  data.description = absl::StrCat("'", path, "'");
  data.train = TokenWindow(text, 0, size - held);
  data.validation = TokenWindow(text, size - held, held);
  data.validation_field = "data.validation_fraction";
  const int64_t need = int64_t{spec.model().seq_len()} + 1;
  if (data.train.size() < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.corpus: '", path, "' gives ", data.train.size(),
                     " training bytes, fewer than one sequence of model.seq_len + 1 = ", need));
  }
  if (held > 0 && spec.data().validate_every_steps() > 0 && held < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.validation_fraction: the held-out tail of '", path, "' is ", held,
                     " bytes, fewer than one sequence of model.seq_len + 1 = ", need,
                     "; raise the fraction or set data.validate_every_steps to 0"));
  }
  return data;
}

// The files of `patterns` (data.tokens or data.validation_tokens, named by `field`),
// mapped and checked whole against the vocabulary.
absl::StatusOr<std::shared_ptr<const data::TokenDataset>> OpenTokens(
    absl::string_view field, const google::protobuf::RepeatedPtrField<std::string>& patterns,
    data::TokenFormat format, int vocab_size) {
  auto named = [field](const absl::Status& s) { return common::ErrorContext(field).Wrap(s); };
  absl::StatusOr<std::vector<std::string>> paths =
      data::ExpandTokenPaths({patterns.begin(), patterns.end()});
  if (!paths.ok()) return named(paths.status());
  absl::StatusOr<data::TokenDataset> dataset = data::TokenDataset::Open(*paths, format);
  if (!dataset.ok()) return named(dataset.status());
  if (absl::Status s = dataset->CheckVocabulary(vocab_size); !s.ok()) return named(s);
  return std::make_shared<const data::TokenDataset>(*std::move(dataset));
}

absl::StatusOr<JobData> LoadTokens(const pb::JobSpec& spec) {
  const pb::DataSpec& d = spec.data();
  ASSIGN_OR_RETURN(const data::TokenFormat format, data::ParseTokenFormat(d.format()));
  const int vocab = spec.model().vocab_size();
  ASSIGN_OR_RETURN(std::shared_ptr<const data::TokenDataset> train,
                   OpenTokens("data.tokens", d.tokens(), format, vocab));
  JobData data;
  data.description = train->Describe();
  const int64_t need = int64_t{spec.model().seq_len()} + 1;
  if (d.validation_tokens_size() > 0) {
    ASSIGN_OR_RETURN(std::shared_ptr<const data::TokenDataset> validation,
                     OpenTokens("data.validation_tokens", d.validation_tokens(), format, vocab));
    if (validation->size() < need) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.validation_tokens: ", validation->Describe(), " holds ", validation->size(),
          " tokens, fewer than one sequence of model.seq_len + 1 = ", need));
    }
    data.train = TokenWindow(train, 0, train->size());
    data.validation = TokenWindow(validation, 0, validation->size());
    data.validation_field = "data.validation_tokens";
  } else {
    const int64_t held = HeldOut(train->size(), d);
    data.train = TokenWindow(train, 0, train->size() - held);
    data.validation = TokenWindow(train, train->size() - held, held);
    data.validation_field = "data.validation_fraction";
    if (held > 0 && d.validate_every_steps() > 0 && held < need) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.validation_fraction: the held-out tail of ", data.description, " is ",
                       held, " tokens, fewer than one sequence of model.seq_len + 1 = ", need,
                       "; raise the fraction, give data.validation_tokens or set "
                       "data.validate_every_steps to 0"));
    }
  }
  if (data.train.size() < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.tokens: ", data.description, " gives ", data.train.size(),
                     " training tokens, fewer than one sequence of model.seq_len + 1 = ", need));
  }
  return data;
}

absl::StatusOr<model::TokenBatch> Sample(const TokenWindow& w,
                                         const model::TransformerConfig& model, int rows,
                                         uint64_t seed, int step) {
  return model::SampleBatch(
      w.size(), [&w](int64_t start, int64_t n, int32_t* out) { w.Copy(start, n, out); }, model,
      rows, seed, step);
}

}  // namespace

void TokenWindow::Copy(int64_t start, int64_t n, int32_t* out) const {
  if (tokens_ != nullptr) return tokens_->CopyTokens(begin_ + start, n, out);
  const char* bytes = text_->data() + begin_ + start;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<unsigned char>(bytes[i]);
}

absl::StatusOr<JobData> LoadJobData(const pb::JobSpec& spec) {
  if (spec.data().tokens_size() > 0) return LoadTokens(spec);
  if (spec.data().corpus().empty()) {
    return absl::InvalidArgumentError(
        "data.corpus: missing; give the path of a text file the coordinator can read, or "
        "instead data.tokens: token files (llm.c or nanoGPT)");
  }
  return LoadText(spec);
}

absl::StatusOr<model::TokenBatch> TrainingBatch(const JobData& data,
                                                const model::TransformerConfig& model, int rows,
                                                uint64_t seed, int64_t step) {
  return Sample(data.train, model, rows, seed, static_cast<int>(step));
}

absl::StatusOr<model::TokenBatch> ValidationBatch(const JobData& data,
                                                  const model::TransformerConfig& model, int rows,
                                                  uint64_t seed) {
  const TokenWindow& w = data.validation;
  if (w.size() < int64_t{model.seq_len} + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat(data.validation_field, ": ", data.description,
                     " has no validation part long enough for one sequence"));
  }
  // Step 0 is never a training step, so this batch is not one the model trains on.
  return Sample(w, model, rows, seed, 0);
}

}  // namespace pipetrain::coordinator
