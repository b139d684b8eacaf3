#include "common/data/llama3_bpe.h"

#include "common/status_macros.h"

namespace pipetrain::data {

namespace {

constexpr ByteLevelBpeConfig kLlama3Config = {
    .name = "llama3",
    .title = "Llama 3",
    .pattern = kLlama3Pattern,
    .env_var = "PIPETRAIN_LLAMA3_TOKENIZER_DIR",
    .merge_order = MergeOrder::kLowestRankLeftmost,
    .whole_pre_token_first = true,
    .eot_symbol = "<|end_of_text|>",
    .bos_symbol = "<|begin_of_text|>",
};

}  // namespace

Llama3Bpe::Llama3Bpe() : ByteLevelBpe(kLlama3Config) {}

absl::StatusOr<std::unique_ptr<Llama3Bpe>> Llama3Bpe::Load(const std::string& dir) {
  std::unique_ptr<Llama3Bpe> bpe(new Llama3Bpe());
  RETURN_IF_ERROR(bpe->LoadFiles(dir));
  return bpe;
}

}  // namespace pipetrain::data
