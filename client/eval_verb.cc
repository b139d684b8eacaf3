#include "client/eval_verb.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli.h"
#include "client/local_model.h"
#include "common/data/token_file.h"
#include "common/error_context.h"
#include "common/flags.h"
#include "common/model/checkpoint.h"
#include "common/model/checkpoint_folder.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/trainer.h"

namespace pipetrain::client {
namespace {

// Far more rows than one in-process batch can hold; refused before anything is read.
constexpr int64_t kMaxBatch = int64_t{1} << 20;

// What a run computed.
struct EvalResult {
  double loss = 0;
  int64_t tokens = 0;
};

// The first `rows` rows of a text; errors name the file.
absl::StatusOr<model::TokenBatch> LeadingText(const std::string& path,
                                              const model::TransformerConfig& config,
                                              int64_t rows) {
  const int64_t needed = rows * (int64_t{config.seq_len} + 1);
  ASSIGN_OR_RETURN(std::string text, ReadFile(path, needed));
  if (static_cast<int64_t>(text.size()) < needed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s has %d bytes; --batch %d rows of seq_len %d + 1 bytes need %d (give a longer text "
        "or a smaller --batch)",
        path, text.size(), rows, config.seq_len, needed));
  }
  absl::StatusOr<model::TokenBatch> batch =
      model::LeadingBatch(text, config, static_cast<int>(rows));
  if (!batch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", batch.status().message()));
  }
  return batch;
}

// The first `rows` rows of a token file, read through its mapping (only those pages are
// touched); errors name the file.
absl::StatusOr<model::TokenBatch> LeadingTokens(const std::string& path, data::TokenFormat format,
                                                const model::TransformerConfig& config,
                                                int64_t rows) {
  ASSIGN_OR_RETURN(const data::TokenFile file, data::TokenFile::Open(path, format));
  const int64_t needed = rows * (int64_t{config.seq_len} + 1);
  if (file.size() < needed) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' has %d tokens; --batch %d rows of seq_len %d + 1 tokens need %d (give a longer "
        "file or a smaller --batch)",
        path, file.size(), rows, config.seq_len, needed));
  }
  absl::StatusOr<model::TokenBatch> batch = model::LeadingBatch(
      file.size(),
      [&file](int64_t start, int64_t n, int32_t* out) { file.CopyTokens(start, n, out); },
      config, static_cast<int>(rows));
  if (!batch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", batch.status().message(),
                                                   ", the checkpoint's model.vocab_size"));
  }
  return batch;
}

// The checkpoint for rows of `seq_len` positions (--seq-len): at most its own.
absl::StatusOr<model::Checkpoint> FitToSeqLen(model::Checkpoint whole, int64_t seq_len) {
  if (seq_len > whole.config.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("--seq-len ", seq_len, " is more than the checkpoint's seq_len ",
                     whole.config.seq_len, " (the positions it was made for)"));
  }
  model::TransformerConfig want = whole.config;
  want.seq_len = static_cast<int>(seq_len);
  return model::FitCheckpointToModel(std::move(whole), want, "--seq-len");
}

}  // namespace

int RunEval(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string checkpoint_path, text_path, tokens_path, format_name = "llmc", grads_out;
  int64_t batch = 0, threads = 1, seq_len = 0;
  bool json = false, help = false;
  common::FlagSet flags(
      "pipetrain eval", "--checkpoint FILE (--text FILE | --tokens FILE) --batch B [flags]",
      "Prints the mean cross-entropy loss of a whole-model checkpoint on the first\n"
      "B * (T + 1) tokens of a text (its bytes) or of a token file, read as B rows of\n"
      "T + 1 tokens (T = --seq-len, else the checkpoint's seq_len): inputs =\n"
      "row[0:T], targets = row[1:T+1]. With --grads-out, also writes the gradient of that loss for every\n"
      "parameter, under the parameter's name, as a safetensors file in the checkpoint\n"
      "format. Optimizer state in the checkpoint is ignored. Runs in-process on the cpu\n"
      "backend.\n"
      "Exit codes: 0 done, 1 the computation or writing --grads-out failed, 2 usage\n"
      "error or an unreadable or invalid checkpoint, text or token file.");
  flags.AddString("checkpoint", &checkpoint_path,
                  "whole-model checkpoint: a safetensors file (pipetrain init, train-local "
                  "--save), a job's checkpoint folder or a Hugging Face GPT-2 or Llama folder",
                  "FILE");
  flags.AddString("text", &text_path, "the text; its bytes are the tokens", "FILE");
  flags.AddString("tokens", &tokens_path,
                  "instead of --text: a token file (llm.c's .bin shards, or nanoGPT's)", "FILE");
  flags.AddString("format", &format_name,
                  "the --tokens file's format: llmc (a 1024-byte header) or nanogpt (raw uint16)",
                  "llmc|nanogpt");
  flags.AddInt("batch", &batch, "B, rows of seq_len + 1 tokens", "B");
  flags.AddInt("seq-len", &seq_len,
               "T, positions per row: at most the checkpoint's (a Llama with "
               "max_position_embeddings 131072 evaluated on rows of 2048; GPT-2 keeps the "
               "first T rows of its position table); 0, the default: the checkpoint's",
               "T");
  flags.AddString("grads-out", &grads_out,
                  "write the gradient of the loss for every parameter here", "FILE");
  flags.AddInt("threads", &threads, "compute threads", "N");
  flags.AddBool("json", &json,
                "print one JSON object: loss, tokens, rows, seq_len, checkpoint, text (or "
                "token_file and format) and grads_out if given");
  flags.AddBool("help", &help, "print this help and exit");
  flags.MarkRequired("checkpoint");
  flags.MarkRequired("batch");
  if (auto exit = ParseVerbFlags(flags, args, help, out, err)) return *exit;
  auto usage = [&](absl::string_view message) { return UsageError(flags, message, err); };
  if (checkpoint_path.empty()) return usage("--checkpoint FILE is required");
  if (text_path.empty() == tokens_path.empty()) {
    return usage(text_path.empty() ? "--text FILE or --tokens FILE is required"
                                   : "--text and --tokens: give one of them, not both");
  }
  absl::StatusOr<data::TokenFormat> format = data::ParseTokenFormat(format_name);
  if (!format.ok()) {
    return usage(absl::StrCat("--format: unknown format '", format_name, "' (llmc or nanogpt)"));
  }
  if (tokens_path.empty() && format_name != "llmc") {
    return usage("--format is the format of a --tokens file; a --text file is read as bytes");
  }
  if (batch < 1) {
    return usage(absl::StrCat("--batch B is required and must be >= 1 (got ", batch, ")"));
  }
  if (threads < 1) return usage(absl::StrCat("--threads must be >= 1 (got ", threads, ")"));
  if (seq_len < 0) return usage(absl::StrCat("--seq-len must be >= 0 (got ", seq_len, ")"));
  if (batch > kMaxBatch) {
    return usage(absl::StrCat("--batch ", batch, " is more than ", kMaxBatch, " rows"));
  }

  auto checkpoint = model::LoadWholeModel(checkpoint_path, "--checkpoint", "eval");
  if (checkpoint.ok() && seq_len > 0) checkpoint = FitToSeqLen(*std::move(checkpoint), seq_len);
  if (!checkpoint.ok()) {
    err << "pipetrain eval: " << checkpoint.status().message() << "\n";
    return kExitUsage;
  }
  const model::TransformerConfig config = checkpoint->config;
  absl::StatusOr<model::TokenBatch> tokens =
      text_path.empty() ? LeadingTokens(tokens_path, *format, config, batch)
                        : LeadingText(text_path, config, batch);
  if (!tokens.ok()) {
    err << "pipetrain eval: " << (text_path.empty() ? "--tokens: " : "--text: ")
        << tokens.status().message() << "\n";
    return kExitUsage;
  }

  auto result = [&]() -> absl::StatusOr<EvalResult> {
    ASSIGN_OR_RETURN(auto backend, compute::CpuBackend::Create(static_cast<int>(threads)));
    ASSIGN_OR_RETURN(auto chunk, compute::ModelChunk::Create(
                                     config, 0, config.num_pipeline_layers(), backend.get()));
    RETURN_IF_ERROR(
        common::ErrorContext(checkpoint_path).Wrap(compute::RestoreChunk(*checkpoint, *chunk)));
    RETURN_IF_ERROR(chunk->ZeroGrads());
    EvalResult r;
    r.tokens = int64_t{tokens->rows} * config.seq_len;
    ASSIGN_OR_RETURN(r.loss, compute::LossAndGrads(*chunk, *tokens));
    RETURN_IF_ERROR(chunk->SumTiedGradients());  // a tied wte's gradient is the sum
    if (!grads_out.empty()) {
      ASSIGN_OR_RETURN(model::Checkpoint grads, compute::GradientsOfChunk(*chunk));
      RETURN_IF_ERROR(common::ErrorContext(absl::StrCat("--grads-out: cannot write ", grads_out))
                          .Wrap(model::SaveCheckpoint(grads_out, grads)));
    }
    return r;
  }();
  if (!result.ok()) {
    err << "pipetrain eval: " << result.status().message() << "\n";
    return kExitJobFailed;
  }
  if (json) {
    nlohmann::ordered_json j = {{"loss", result->loss},
                                {"tokens", result->tokens},
                                {"rows", batch},
                                {"seq_len", config.seq_len},
                                {"checkpoint", checkpoint_path}};
    // "tokens" is the count already, so the file of --tokens is "token_file".
    if (text_path.empty()) {
      j["token_file"] = tokens_path;
      j["format"] = format_name;
    } else {
      j["text"] = text_path;
    }
    if (!grads_out.empty()) j["grads_out"] = grads_out;
    out << j.dump() << "\n";
  } else {
    out << absl::StrFormat("loss %.9g: mean over %d tokens (%d rows of %d) of %s, checkpoint %s\n",
                           result->loss, result->tokens, batch, config.seq_len,
                           text_path.empty() ? tokens_path : text_path, checkpoint_path);
    if (!grads_out.empty()) {
      out << absl::StrFormat("wrote the gradients of %d parameter tensors to %s\n",
                             checkpoint->params.size(), grads_out);
    }
  }
  return kExitOk;
}

}  // namespace pipetrain::client
