// Tokenizers turn text (bytes) into the token ids a model trains on and back: "bytes"
// (a token is a byte, the project's default), "gpt2" (gpt2_bpe.h) and "llama3"
// (llama3_bpe.h); EncodeParallel encodes a long text on several threads, cut where no
// token can change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pipetrain::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  virtual absl::string_view name() const = 0;  // "bytes", "gpt2", "llama3"
  virtual int32_t vocab_size() const = 0;      // every id is in [0, vocab_size)
  // The end-of-text token that separates documents, where the vocabulary has one.
  virtual std::optional<int32_t> eot_id() const = 0;
  // The begin-of-text token that starts a document, where the vocabulary has one.
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }

  // Appends the ids of `text` to *ids. Any bytes are accepted (see byte_level_bpe.h for
  // text that is not valid UTF-8). Thread-safe: several threads may encode at once.
  virtual absl::Status EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const = 0;
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text) const;

  // The bytes the ids stand for. An id outside the vocabulary is an error naming it.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const = 0;

  // The first position p >= pos at which the text can be cut without changing a token:
  // Encode(text) == Encode(text[0, p)) + Encode(text[p, end)). text.size() when there is
  // none before the end.
  virtual size_t NextSafeSplit(absl::string_view text, size_t pos) const = 0;
};

// The names MakeTokenizer knows, in order: "bytes, gpt2, llama3".
std::string TokenizerNames();
bool IsTokenizerName(absl::string_view name);

// "bytes" (dir is ignored), "gpt2" or "llama3", whose encoder.json and vocab.bpe are
// read from `dir`, or from DefaultTokenizerDir(name) when dir is empty.
absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(absl::string_view name,
                                                         const std::string& dir);

// Where a tokenizer's vocabulary is looked for, where deploy/install-deps.sh puts it
// unless an environment variable says otherwise: gpt2's $PIPETRAIN_TOKENIZER_DIR, else
// /usr/local/share/pipetrain/gpt2; llama3's $PIPETRAIN_LLAMA3_TOKENIZER_DIR, else
// /usr/local/share/pipetrain/llama3. Empty for a name without files ("bytes").
std::string DefaultTokenizerDir(absl::string_view name);
// gpt2's.
std::string DefaultTokenizerDir();

// Texts shorter than this are not worth a thread.
inline constexpr size_t kDefaultMinPartBytes = size_t{64} << 10;

// Encode(text) on `threads` threads: the text is cut at safe splits into parts of at
// least min_part_bytes (a few per thread, so a slow part does not hold the others up),
// encoded in parallel and concatenated in order. The result equals Encode(text).
absl::StatusOr<std::vector<int32_t>> EncodeParallel(const Tokenizer& tokenizer,
                                                    absl::string_view text, int threads,
                                                    size_t min_part_bytes = kDefaultMinPartBytes);

}  // namespace pipetrain::data
