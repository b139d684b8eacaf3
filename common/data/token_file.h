// Token files as llm.c and nanoGPT write them (GPT-2 BPE ids as little-endian uint16;
// llm.c's Llama 3 ids as uint32), memory-mapped read-only and checked when opened, and a
// dataset of several such files read as one token stream (their concatenation), which
// is what batches are drawn from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pipetrain::data {

enum class TokenFormat {
  // llm.c: a header of 256 little-endian int32 (magic, version, token count, the rest
  // unused), then the tokens: GPT-2's layout (magic 20240520, version 1, uint16 tokens)
  // or Llama 3's (magic 20240801, version 7, uint32 tokens), told apart by the magic.
  kLlmc,
  // nanoGPT's train.bin / val.bin: the tokens alone.
  kNanoGpt,
};

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// One of llm.c's two layouts: what its header says and how wide its tokens are.
struct LlmcLayout {
  int32_t magic;
  int32_t version;
  int token_bytes;       // 2: little-endian uint16 tokens; 4: uint32
  const char* contents;  // for messages: "uint16 GPT-2 tokens"
};
inline constexpr LlmcLayout kLlmcGpt2 = {kLlmcMagic, kLlmcVersion, 2, "uint16 GPT-2 tokens"};
inline constexpr LlmcLayout kLlmcLlama3 = {20240801, 7, 4, "uint32 Llama 3 tokens"};
// The layout llm.c would write ids below vocab_size in: GPT-2's where they fit uint16
// (vocab_size <= 65536), else Llama 3's.
const LlmcLayout& LlmcLayoutFor(int64_t vocab_size);

// "llmc" or "nanogpt"; anything else is INVALID_ARGUMENT naming data.format.
absl::StatusOr<TokenFormat> ParseTokenFormat(absl::string_view name);
absl::string_view TokenFormatName(TokenFormat format);

// One token file, mapped for as long as the object lives; its tokens are read in place,
// never copied into memory as a whole, so files larger than memory work.
class TokenFile {
 public:
  // Maps `path` and checks its layout. INVALID_ARGUMENT naming the file when it is not a
  // regular file, cannot be opened, or does not have the format's layout: a wrong magic
  // (with a hint when the file could be raw uint16, i.e. nanoGPT's), a version that is
  // not its magic's, a header count that disagrees with the file's size, bytes left
  // over after the last whole token.
  static absl::StatusOr<TokenFile> Open(const std::string& path, TokenFormat format);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile();

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  int token_bytes() const { return token_bytes_; }  // 2 (uint16 tokens) or 4 (uint32)
  uint32_t token(int64_t i) const;                  // i in [0, size())

  // Tokens [start, start + n) into out[0, n) as int32 ids; the range must lie within
  // [0, size()). A uint32 id of 2^31 or more would come out negative: check the
  // vocabulary first.
  void CopyTokens(int64_t start, int64_t n, int32_t* out) const;

  // OK when every id is below vocab_size; else INVALID_ARGUMENT naming the file, the
  // index and id of the first token at or above it, and model.vocab_size. Reads the
  // whole file: call it once per file.
  absl::Status CheckVocabulary(int vocab_size) const;

 private:
  TokenFile(std::string path, void* mapping, size_t mapped_bytes)
      : path_(std::move(path)), mapping_(mapping), mapped_bytes_(mapped_bytes) {}
  void Unmap();

  std::string path_;
  void* mapping_ = nullptr;  // nullptr for an empty file (nothing to map)
  size_t mapped_bytes_ = 0;
  const char* tokens_ = nullptr;  // the first token's bytes, in the mapping
  int64_t size_ = 0;
  int token_bytes_ = 2;
};

// Token files in order, seen as one stream: token i of the stream is token i - start(f)
// of the file f that holds it. Rows drawn from the stream may span two files.
class TokenDataset {
 public:
  TokenDataset() = default;
  explicit TokenDataset(std::vector<TokenFile> files);

  // Opens every path (already expanded, see ExpandTokenPaths) in the given format; the
  // first failure, naming its file.
  static absl::StatusOr<TokenDataset> Open(const std::vector<std::string>& paths,
                                           TokenFormat format);

  int64_t size() const { return starts_.back(); }
  const std::vector<TokenFile>& files() const { return files_; }

  // Tokens [start, start + n) of the stream into out[0, n), as int32 ids. The range must
  // lie within [0, size()).
  void CopyTokens(int64_t start, int64_t n, int32_t* out) const;

  // TokenFile::CheckVocabulary on every file; the first failure.
  absl::Status CheckVocabulary(int vocab_size) const;

  // How errors name the dataset: "'a.bin'", or "the 3 files 'a.bin' ... 'c.bin'".
  std::string Describe() const;

 private:
  std::vector<TokenFile> files_;
  std::vector<int64_t> starts_ = {0};  // starts_[f]: stream index of file f's first token;
                                       // the last entry is the stream's size
};

// Each entry of `patterns` in order, an entry with a wildcard (*, ?, [) replaced by its
// glob(3) matches in sorted order (train_000001.bin before train_000002.bin); an entry
// without one stays as given, so that opening it says what is wrong with it. A pattern
// that matches nothing is INVALID_ARGUMENT naming the pattern.
absl::StatusOr<std::vector<std::string>> ExpandTokenPaths(const std::vector<std::string>& patterns);

}  // namespace pipetrain::data
