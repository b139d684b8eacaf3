// Llama 3's tokenizer (tiktoken-style byte-level BPE): 128,000 byte-level symbols merged
// lowest rank first, then 256 special tokens, <|begin_of_text|> = 128000 and
// <|end_of_text|> = 128001 among them (128,256 ids in all). The vocabulary and merges
// are npm's llama3-tokenizer-js@1.2.0's, exported to encoder.json and vocab.bpe by
// deploy/export-llama3-vocab.js (deploy/install-deps.sh; nothing is downloaded), and the
// ids equal that package's encoder's. The machinery is byte_level_bpe.h's.
#pragma once

#include <memory>
#include <string>

#include "common/data/byte_level_bpe.h"

namespace pipetrain::data {

// Llama 3's pre-tokenizer pattern (Meta's tokenizer.py), its case-insensitive group
// (?i:'s|'t|'re|'ve|'m|'ll|'d) written out in ASCII as llama3-tokenizer-js writes it:
// PCRE2's caseless matching would also take U+017F (long s) for 's'.
inline constexpr char kLlama3Pattern[] =
    R"('(?:[sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|)"
    R"(\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

class Llama3Bpe final : public ByteLevelBpe {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe (as Gpt2Bpe::Load does).
  //
  // A pre-token that is a symbol is that symbol; any other is merged one pair at a time,
  // the lowest-ranked first, the leftmost of equals: Hugging Face's tokenizers with
  // ignore_merges, and llama3-tokenizer-js. Special tokens' text ("<|eot_id|>") in the
  // text is ordinary text, as in Meta's tokenizer.py by default and in llm.c's data
  // scripts (split_special_tokens); llama3-tokenizer-js makes it the special id unless
  // given a specialTokenRegex that matches nothing, which our cross-check gives it.
  // Where the two encoders may still differ: \s (U+0085 is \s here, not in JavaScript;
  // U+FEFF the other way round), letters and digits that Unicode added after PCRE2's
  // tables, and the package's merge order within one call's text when a pre-token has
  // more than twice as many UTF-8 bytes as the whole text has UTF-16 units (its
  // tie-break fraction, position / text length, then outgrows the gap between ranks).
  static absl::StatusOr<std::unique_ptr<Llama3Bpe>> Load(const std::string& dir);

 private:
  Llama3Bpe();
};

}  // namespace pipetrain::data
