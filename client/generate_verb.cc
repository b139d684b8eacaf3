#include "client/generate_verb.h"

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "client/cli.h"
#include "common/data/tokenizer.h"
#include "common/error_context.h"
#include "common/flags.h"
#include "common/model/checkpoint_folder.h"
#include "common/model/model_family.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/cuda_backend.h"
#include "stage_server/compute/kv_cache_decoder.h"
#include "stage_server/compute/model_chunk.h"
#include "stage_server/compute/token_generator.h"

namespace pipetrain::client {
namespace {

constexpr char kProgram[] = "pipetrain generate";
constexpr int64_t kMaxTokens = int64_t{1} << 20;

// ---- The tokenizer ------------------------------------------------------------------------
// What the verb needs of a tokenizer: text to ids and ids to the bytes they stand for
// (decoding ids one at a time and concatenating gives the bytes of the whole, as for any
// byte-level tokenizer, so tokens can be printed as they come). Both come from
// pipetrain::data (common/data/): "bytes", or GPT-2's or Llama 3's BPE read from
// --tokenizer-dir (else its default folder).
struct TextTokenizer {
  std::string name;
  int vocab_size = 0;  // the ids it can decode: [0, vocab_size)
  std::function<absl::StatusOr<std::vector<int32_t>>(absl::string_view text)> encode;
  std::function<std::string(std::span<const int32_t> ids)> decode;
};

absl::StatusOr<TextTokenizer> TokenizerNamed(const std::string& name, const std::string& dir) {
  if (!data::IsTokenizerName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer '", name, "' is not one of ", data::TokenizerNames()));
  }
  if (name == "bytes" && !dir.empty()) {
    return absl::InvalidArgumentError(
        "--tokenizer-dir is read by --tokenizer gpt2 and llama3 only; --tokenizer bytes needs "
        "no files");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const data::Tokenizer> tokenizer,
                   common::ErrorContext(absl::StrCat("--tokenizer ", name))
                       .Wrap(data::MakeTokenizer(name, dir)));
  TextTokenizer t;
  t.name = name;
  t.vocab_size = tokenizer->vocab_size();
  t.encode = [tokenizer](absl::string_view text) { return tokenizer->Encode(text); };
  t.decode = [tokenizer](std::span<const int32_t> ids) {
    // Every id was drawn from the model's logits, checked against the tokenizer's
    // vocabulary before generation starts, so decoding cannot fail here.
    absl::StatusOr<std::string> bytes = tokenizer->Decode(absl::MakeConstSpan(ids.data(), ids.size()));
    return bytes.ok() ? *std::move(bytes) : std::string();
  };
  return t;
}

// ---- The device -----------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<compute::Backend>> MakeBackend(const std::string& device,
                                                              int threads) {
  if (device == "cpu") {
    ASSIGN_OR_RETURN(std::unique_ptr<compute::CpuBackend> cpu,
                     compute::CpuBackend::Create(threads));
    return std::unique_ptr<compute::Backend>(std::move(cpu));
  }
  int index = -1;
  if (!absl::StartsWith(device, "cuda:") || !absl::SimpleAtoi(device.substr(5), &index) ||
      index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device '", device, "' is not one of cpu or cuda:N (N >= 0)"));
  }
  return common::ErrorContext(absl::StrCat("--device ", device))
      .Wrap(compute::CreateCudaBackend(index));
}

// What a run produced, for the summary and --json.
struct Generation {
  std::vector<int32_t> tokens;
  double seconds = 0;
};

}  // namespace

int RunGenerate(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::string checkpoint_path, prompt, tokenizer_name = "bytes", tokenizer_dir, device = "cpu";
  int64_t tokens = 64, top_k = 0, seed = 0, threads = 1;
  double temperature = 1.0;
  bool json = false, help = false;
  common::FlagSet flags(
      kProgram, "--checkpoint CKPT --prompt TEXT [flags]",
      "Continues TEXT with a whole-model checkpoint: prints the prompt, then each new token\n"
      "as soon as it is drawn, then a newline. Every block keeps the keys and values of\n"
      "the positions so far (a key-value cache), so a token costs one position's work.\n"
      "Temperature 0 is greedy (the most likely token, ties to the lowest id); otherwise\n"
      "tokens are drawn from softmax(logits / T) over the --top-k most likely ids, with\n"
      "numbers that depend only on --seed and the token's index, the same on every\n"
      "machine: a seed reproduces the text (up to the logits' rounding, which differs\n"
      "between devices and BLAS kernels). The model sees at most seq_len positions:\n"
      "when prompt and text outgrow them, generation goes on from the last seq_len / 2\n"
      "tokens (a longer prompt starts from its last seq_len tokens).\n"
      "Runs in-process; logs go to stderr.\n"
      "Exit codes: 0 done, 1 the computation failed, 2 usage error, an unreadable or\n"
      "invalid checkpoint, a prompt token outside the model's vocabulary, or no such device.");
  flags.AddString("checkpoint", &checkpoint_path,
                  "whole-model checkpoint: a .safetensors file (pipetrain init, train-local "
                  "--save), a job's checkpoint folder (pipetrain status ID: checkpoint) or a "
                  "Hugging Face GPT-2 or Llama folder",
                  "CKPT");
  flags.AddString("prompt", &prompt, "the text to continue (not empty)", "TEXT");
  flags.AddInt("tokens", &tokens, "tokens to generate (>= 0)", "N");
  flags.AddDouble("temperature", &temperature, "sampling temperature (>= 0; 0 is greedy)", "T");
  flags.AddInt("top-k", &top_k, "draw from the K most likely tokens only (0: all)", "K");
  flags.AddInt("seed", &seed, "seed of the sampling draws (>= 0)", "S");
  flags.AddString("tokenizer", &tokenizer_name,
                  "bytes (one token a byte), gpt2 (GPT-2 BPE) or llama3 (Llama 3's BPE, "
                  "vocabulary 128256; special tokens decode to their text); the BPE "
                  "vocabularies come from --tokenizer-dir",
                  "NAME");
  flags.AddString("tokenizer-dir", &tokenizer_dir,
                  "the folder of the gpt2 or llama3 tokenizer's encoder.json and vocab.bpe "
                  "(default: $PIPETRAIN_TOKENIZER_DIR or $PIPETRAIN_LLAMA3_TOKENIZER_DIR, else "
                  "where deploy/install-deps.sh puts them, /usr/local/share/pipetrain/gpt2 or "
                  ".../llama3)",
                  "DIR");
  flags.AddString("device", &device, "cpu or cuda:N", "DEVICE");
  flags.AddInt("threads", &threads, "compute threads on the cpu device (>= 1)", "N");
  flags.AddBool("json", &json,
                "print one JSON object instead of the text: prompt, completion, "
                "prompt_tokens, tokens (the new ids), tokens_per_s, seconds, and the settings");
  flags.AddBool("help", &help, "print this help and exit");
  flags.MarkRequired("checkpoint");
  flags.MarkRequired("prompt");
  if (auto exit = ParseVerbFlags(flags, args, help, out, err)) return *exit;
  auto usage = [&](absl::string_view message) { return UsageError(flags, message, err); };
  if (checkpoint_path.empty()) return usage("--checkpoint CKPT is required");
  if (prompt.empty()) return usage("--prompt TEXT is required and must not be empty");
  for (const auto& [flag, value, least, most] :
       {std::tuple{"--tokens", tokens, int64_t{0}, kMaxTokens},
        {"--top-k", top_k, int64_t{0}, int64_t{1} << 30},
        {"--seed", seed, int64_t{0}, INT64_MAX},
        {"--threads", threads, int64_t{1}, int64_t{1024}}}) {
    if (value < least || value > most) {
      return usage(absl::StrCat(flag, " must be in [", least, ", ", most, "] (got ", value, ")"));
    }
  }
  const compute::SamplingOptions sampling{.temperature = temperature,
                                          .top_k = static_cast<int>(top_k),
                                          .seed = static_cast<uint64_t>(seed)};
  if (!compute::ValidateSampling(sampling).ok()) {
    return usage(absl::StrCat("--temperature must be a finite number >= 0 (0 is greedy; got ",
                              temperature, ")"));
  }
  absl::StatusOr<TextTokenizer> tokenizer = TokenizerNamed(tokenizer_name, tokenizer_dir);
  if (!tokenizer.ok()) return usage(tokenizer.status().message());

  // The checkpoint, whole, and what it can read.
  auto fail = [&](int code, absl::string_view message) {
    err << kProgram << ": " << message << "\n";
    return code;
  };
  std::error_code ec;
  if (!std::filesystem::exists(checkpoint_path, ec)) {
    return fail(kExitUsage, absl::StrCat("--checkpoint: '", checkpoint_path, "' does not exist"));
  }
  absl::StatusOr<model::Checkpoint> checkpoint =
      model::LoadWholeModel(checkpoint_path, "--checkpoint", "generate");
  if (!checkpoint.ok()) return fail(kExitUsage, checkpoint.status().message());
  const model::TransformerConfig config = checkpoint->config;
  if (config.vocab_size > tokenizer->vocab_size) {
    return fail(kExitUsage,
                absl::StrFormat("--tokenizer %s decodes ids below %d, but %s has vocab_size %d",
                                tokenizer->name, tokenizer->vocab_size, checkpoint_path,
                                config.vocab_size));
  }
  absl::StatusOr<std::vector<int32_t>> prompt_ids = tokenizer->encode(prompt);
  if (!prompt_ids.ok()) {
    return fail(kExitUsage, absl::StrCat("--prompt: ", prompt_ids.status().message()));
  }
  for (size_t i = 0; i < prompt_ids->size(); ++i) {
    const int32_t id = (*prompt_ids)[i];
    if (id >= 0 && id < config.vocab_size) continue;
    return fail(kExitUsage,
                absl::StrFormat("--prompt: token %d at position %d of the prompt (tokenizer %s) "
                                "is outside the vocabulary [0, %d) of %s",
                                id, i, tokenizer->name, config.vocab_size, checkpoint_path));
  }

  absl::StatusOr<std::unique_ptr<compute::Backend>> backend =
      MakeBackend(device, static_cast<int>(threads));
  if (!backend.ok()) return fail(kExitUsage, backend.status().message());
  absl::StatusOr<std::unique_ptr<compute::ModelChunk>> chunk =
      compute::ModelChunk::Create(config, 0, config.num_pipeline_layers(), backend->get());
  if (!chunk.ok()) return fail(kExitJobFailed, chunk.status().message());
  if (absl::Status s = compute::RestoreChunk(*checkpoint, **chunk); !s.ok()) {
    return fail(kExitUsage, absl::StrCat("--checkpoint: ", checkpoint_path, ": ", s.message()));
  }
  checkpoint->params.clear();  // the host copy of the weights is no longer needed
  checkpoint->optimizer.reset();
  err << absl::StrFormat(
      "%s: %s (%s) on %s; %d prompt tokens, %d to generate, temperature %g, top-k %d, "
      "seed %d\n",
      kProgram, checkpoint_path, model::DescribeModel(config), (*backend)->Name(),
      prompt_ids->size(), tokens, temperature, top_k, seed);

  if (!json) {
    out << prompt;
    out.flush();
  }
  auto generation = [&]() -> absl::StatusOr<Generation> {
    ASSIGN_OR_RETURN(auto decoder, compute::KvCacheDecoder::Create(chunk->get()));
    Generation g;
    const auto start = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(
        g.tokens, compute::GenerateTokens(*decoder, *prompt_ids, static_cast<int>(tokens), sampling,
                                          [&](int32_t token) {
                                            if (!json) {
                                              out << tokenizer->decode({&token, 1});
                                              out.flush();
                                            }
                                            return absl::OkStatus();
                                          }));
    g.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return g;
  }();
  if (!json) out << "\n";
  if (!generation.ok()) return fail(kExitJobFailed, generation.status().message());
  const double tokens_per_s =
      generation->seconds > 0 ? generation->tokens.size() / generation->seconds : 0;
  err << absl::StrFormat("%s: %d tokens in %.3f s (%.1f tokens/s, the prompt's included)\n",
                         kProgram, generation->tokens.size(), generation->seconds, tokens_per_s);
  if (json) {
    const nlohmann::ordered_json j = {{"prompt", prompt},
                                      {"completion", tokenizer->decode(generation->tokens)},
                                      {"prompt_tokens", *prompt_ids},
                                      {"tokens", generation->tokens},
                                      {"tokens_per_s", tokens_per_s},
                                      {"seconds", generation->seconds},
                                      {"checkpoint", checkpoint_path},
                                      {"device", (*backend)->Name()},
                                      {"tokenizer", tokenizer->name},
                                      {"temperature", temperature},
                                      {"top_k", top_k},
                                      {"seed", seed}};
    // A byte-level model may end inside a UTF-8 sequence (or make invalid ones): JSON
    // strings get U+FFFD for those bytes, and "tokens" keeps the exact ids.
    out << j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  }
  return kExitOk;
}

}  // namespace pipetrain::client
