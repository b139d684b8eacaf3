// GPT-2's byte-level BPE as OpenAI's encoder.py does it: pre-tokens by GPT-2's pattern
// (PCRE2, JIT), bytes mapped to printable characters, merged by rank from vocab.bpe, ids
// from encoder.json (installed by deploy/install-deps.sh; nothing is downloaded).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/data/tokenizer.h"

namespace pipetrain::data {

// GPT-2's pre-tokenizer pattern: OpenAI's contractions written as one group.
inline constexpr char kGpt2Pattern[] =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// bytes_to_unicode(): the code point that stands for each byte in the vocabulary's
// strings. Printable Latin-1 bytes stand for themselves; the other 68 are moved to
// U+0100.. so that no token string holds a space or a control character.
const std::array<char32_t, 256>& BytesToUnicode();
// The inverse: the byte a code point stands for, nullopt for any other code point.
std::optional<uint8_t> UnicodeToByte(char32_t c);

class Gpt2Bpe final : public Tokenizer {
 public:
  // Reads DIR/encoder.json and DIR/vocab.bpe. A missing file names the path tried and
  // says how to get it; a malformed one names the file and line.
  static absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Load(const std::string& dir);
  ~Gpt2Bpe() override;

  absl::string_view name() const override { return "gpt2"; }
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eot_id() const override { return eot_id_; }

  // Text that is not valid UTF-8: the pattern never matches an invalid sequence
  // (PCRE2_MATCH_INVALID_UTF), so each run of bytes it leaves between two matches is
  // a pre-token of its own and encodes byte-level like any other. Nothing is lost and
  // Decode gives the bytes back; valid UTF-8 is encoded exactly as OpenAI's encoder.
  // "<|endoftext|>" in the text is ordinary text, as in OpenAI's encoder.
  // Whitespace (\s) differs between regex engines on three code points, which next to
  // other characters can split differently: U+0085 is \s here (PCRE2 with PCRE2_UCP)
  // and in Python's `regex` (OpenAI's encoder), not in JavaScript (npm's gpt-3-encoder);
  // U+FEFF is \s only in JavaScript; U+180E only here (PCRE2 10.42 still lists it).
  absl::Status EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;

  // A cut just after a '\n' that has an ASCII graphic character on either side, or just
  // before a ' ' between two ASCII letters or digits. Either way no pre-token spans
  // the cut, and the pattern has no look-behind and its one look-ahead ((?!\S) after
  // whitespace) sees the same thing on both sides, so every pre-token is unchanged.
  size_t NextSafeSplit(absl::string_view text, size_t pos) const override;

  // The pre-tokens of `text`, in order; they concatenate to `text`. For tests.
  absl::StatusOr<std::vector<absl::string_view>> PreTokenize(absl::string_view text) const;

 private:
  struct Regex;   // the compiled pattern (PCRE2 stays out of this header)
  struct Worker;  // one encoding thread's match data, JIT stack and cache

  struct Merge {
    int32_t rank;
    int32_t id;  // the merged symbol's id
  };

  Gpt2Bpe() = default;
  absl::Status LoadEncoder(const std::string& path);
  absl::Status LoadMerges(const std::string& path);
  // Appends the BPE ids of one pre-token (a cache hit or a fresh merge).
  void EncodePiece(absl::string_view piece, Worker& worker, std::vector<int32_t>* ids) const;
  void MergeSimple(std::vector<int32_t>& word) const;
  void MergeWithHeap(std::vector<int32_t>& word) const;
  const Merge* FindMerge(int32_t left, int32_t right) const;
  std::unique_ptr<Worker> TakeWorker() const;
  void ReturnWorker(std::unique_ptr<Worker> worker) const;

  int32_t vocab_size_ = 0;
  std::optional<int32_t> eot_id_;
  std::array<int32_t, 256> byte_id_{};                 // the id of each single-byte symbol
  std::vector<std::string> id_bytes_;                  // id -> the bytes it stands for
  std::vector<bool> id_known_;                         // ids that encoder.json defines
  absl::flat_hash_map<std::string, int32_t> encoder_;  // symbol (UTF-8) -> id, while loading
  absl::flat_hash_map<uint64_t, Merge> merges_;        // (left id, right id) -> merge
  // Whether every merge's parts were made by earlier merges (or are bytes) and no two
  // merges make the same symbol. Then a merge only ever creates pairs of a higher rank,
  // and merging lowest rank first, leftmost first (a heap) equals OpenAI's rounds of
  // "merge every occurrence of the lowest-ranked pair". True for GPT-2's files.
  bool heap_exact_ = false;
  std::unique_ptr<Regex> regex_;

  mutable absl::Mutex workers_mu_;
  mutable std::vector<std::unique_ptr<Worker>> idle_workers_ ABSL_GUARDED_BY(workers_mu_);
};

}  // namespace pipetrain::data
