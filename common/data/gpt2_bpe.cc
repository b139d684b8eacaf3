#include "common/data/gpt2_bpe.h"

#include "common/status_macros.h"

namespace pipetrain::data {

namespace {

constexpr ByteLevelBpeConfig kGpt2Config = {
    .name = "gpt2",
    .title = "GPT-2",
    .pattern = kGpt2Pattern,
    .env_var = "PIPETRAIN_TOKENIZER_DIR",
    .merge_order = MergeOrder::kOpenAiRounds,
    .whole_pre_token_first = false,
    .eot_symbol = "<|endoftext|>",
    .bos_symbol = "",
};

}  // namespace

Gpt2Bpe::Gpt2Bpe() : ByteLevelBpe(kGpt2Config) {}

absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Gpt2Bpe::Load(const std::string& dir) {
  std::unique_ptr<Gpt2Bpe> bpe(new Gpt2Bpe());
  RETURN_IF_ERROR(bpe->LoadFiles(dir));
  return bpe;
}

}  // namespace pipetrain::data
