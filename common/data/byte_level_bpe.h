// Byte-level BPE, the core that GPT-2's and Llama 3's tokenizers share (gpt2_bpe.h,
// llama3_bpe.h): text is cut into pre-tokens by a pattern (PCRE2, JIT), each pre-token's
// bytes are mapped to printable characters and merged by rank. The vocabulary is two
// files in GPT-2's layout: encoder.json ({"symbol": id}) and vocab.bpe (one merge a
// line, highest priority first). What differs between tokenizers is a ByteLevelBpeConfig.
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

// bytes_to_unicode(): the code point that stands for each byte in the vocabulary's
// strings. Printable Latin-1 bytes stand for themselves; the other 68 are moved to
// U+0100.. so that no token string holds a space or a control character.
const std::array<char32_t, 256>& BytesToUnicode();
// The inverse: the byte a code point stands for, nullopt for any other code point.
std::optional<uint8_t> UnicodeToByte(char32_t c);

// How a pre-token's symbols are merged.
enum class MergeOrder {
  // OpenAI's encoder.py: in rounds, every occurrence of the lowest-ranked pair at once.
  kOpenAiRounds,
  // Hugging Face's tokenizers (and llama3-tokenizer-js, tiktoken): one merge at a time,
  // the lowest-ranked pair, the leftmost of equals.
  kLowestRankLeftmost,
};

struct ByteLevelBpeConfig {
  const char* name;      // "gpt2": the tokenizer's name, as MakeTokenizer knows it
  const char* title;     // "GPT-2": in messages about its files
  const char* pattern;   // the pre-tokenizer's pattern (PCRE2 with PCRE2_UTF | PCRE2_UCP)
  const char* env_var;   // names the default folder, for messages about missing files
  MergeOrder merge_order;
  // A pre-token that is a symbol of encoder.json is that symbol, without merging (Hugging
  // Face's ignore_merges; tiktoken does the same).
  bool whole_pre_token_first;
  const char* eot_symbol;  // the end-of-text token's symbol; its id if encoder.json has it
  const char* bos_symbol;  // the begin-of-text token's, "" for none
};

class ByteLevelBpe : public Tokenizer {
 public:
  ~ByteLevelBpe() override;

  absl::string_view name() const override { return config_.name; }
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> eot_id() const override { return eot_id_; }
  std::optional<int32_t> bos_id() const override { return bos_id_; }

  // Text that is not valid UTF-8: the pattern never matches an invalid sequence
  // (PCRE2_MATCH_INVALID_UTF), so each run of bytes it leaves between two matches is
  // a pre-token of its own and encodes byte-level like any other. Nothing is lost and
  // Decode gives the bytes back. Special tokens' text ("<|endoftext|>") in the text is
  // ordinary text: only the tokenize verb's flags put special ids in.
  absl::Status EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const override;
  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override;

  // A cut just after a '\n' that has an ASCII graphic character on either side, or just
  // before a ' ' between two ASCII letters or digits. Either way no pre-token of GPT-2's
  // or Llama 3's pattern spans the cut (none holds a letter or digit and then a space,
  // nor a newline and then a graphic character), neither has a look-behind, and their
  // one look-ahead ((?!\S) after whitespace) sees the same on both sides, so every
  // pre-token is unchanged.
  size_t NextSafeSplit(absl::string_view text, size_t pos) const override;

  // The pre-tokens of `text`, in order; they concatenate to `text`. For tests.
  absl::StatusOr<std::vector<absl::string_view>> PreTokenize(absl::string_view text) const;

 protected:
  explicit ByteLevelBpe(const ByteLevelBpeConfig& config);
  // Reads DIR/encoder.json and DIR/vocab.bpe and compiles the pattern. A missing file
  // names the path tried and says how to get it; a malformed one names the file and line.
  absl::Status LoadFiles(const std::string& dir);

 private:
  struct Regex;   // the compiled pattern (PCRE2 stays out of this header)
  struct Worker;  // one encoding thread's match data, JIT stack, cache and scratch

  struct Merge {
    int32_t rank;
    int32_t id;  // the merged symbol's id
  };

  static uint64_t PairKey(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  absl::Status LoadEncoder(const std::string& path);
  absl::Status LoadMerges(const std::string& path);
  absl::Status CompilePattern();
  // Appends the BPE ids of one pre-token (a symbol, a cache hit or a fresh merge).
  void EncodePiece(absl::string_view piece, Worker& worker, std::vector<int32_t>* ids) const;
  void MergeWord(std::vector<int32_t>& word, Worker& worker) const;
  void MergeRounds(std::vector<int32_t>& word) const;
  void MergeLowestFirst(std::vector<int32_t>& word, std::vector<Merge>& pairs) const;
  void MergeWithHeap(std::vector<int32_t>& word) const;
  const Merge* FindMerge(int32_t left, int32_t right) const;
  std::unique_ptr<Worker> TakeWorker() const;
  void ReturnWorker(std::unique_ptr<Worker> worker) const;

  ByteLevelBpeConfig config_;
  int32_t vocab_size_ = 0;
  std::optional<int32_t> eot_id_, bos_id_;
  std::array<int32_t, 256> byte_id_{};                 // the id of each single-byte symbol
  std::vector<std::string> id_bytes_;                  // id -> the bytes it stands for
  std::vector<bool> id_known_;                         // ids that encoder.json defines
  absl::flat_hash_map<std::string, int32_t> encoder_;  // symbol (UTF-8) -> id, while loading
  absl::flat_hash_map<std::string, int32_t> byte_symbols_;  // bytes -> id, whole_pre_token_first
  absl::flat_hash_map<uint64_t, Merge> merges_;         // (left id, right id) -> merge
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
