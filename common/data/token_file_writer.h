// Writes llm.c's token files (its dev/data scripts' .bin; train_gpt2.c and our corpus
// readers load them): a header of 256 little-endian int32 (magic, version, the token
// count, zeros), then the tokens, in GPT-2's layout (magic 20240520, version 1,
// little-endian uint16) or Llama 3's (magic 20240801, version 7, uint32). Written
// atomically.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/atomic_file.h"
#include "common/data/token_file.h"

namespace pipetrain::data {

// Usage: Open, Append as often as needed, Commit. Readers of `path` see the old file or
// the whole new one: the tokens go to a temp file in the same folder, the header (whose
// count is known only at the end) is written last, then the file is renamed over `path`.
// A writer destroyed before Commit, or after a failed Append, leaves `path` untouched.
class TokenFileWriter {
 public:
  // The format's figures are the reader's (token_file.h): one definition of llm.c's.
  static constexpr int kHeaderInts = 256;
  static constexpr int64_t kHeaderBytes = kLlmcHeaderBytes;
  static_assert(kHeaderInts * 4 == kLlmcHeaderBytes);

  // vocab_size: every id appended must be below it (and fit the layout's tokens).
  // LlmcLayoutFor(vocab_size) is the layout llm.c would choose.
  static absl::StatusOr<TokenFileWriter> Open(const std::string& path, int32_t vocab_size,
                                              const LlmcLayout& layout = kLlmcGpt2);

  // An id that is negative, does not fit the layout's tokens (above 65535 in GPT-2's)
  // or is not below vocab_size is refused, naming the id and its position in the file;
  // nothing of that call is written.
  absl::Status Append(absl::Span<const int32_t> ids);
  absl::Status Commit();

  int64_t tokens() const { return tokens_; }
  const std::string& path() const { return file_.path(); }

 private:
  TokenFileWriter(common::AtomicFileWriter file, int32_t vocab_size, const LlmcLayout& layout)
      : file_(std::move(file)), vocab_size_(vocab_size), layout_(&layout) {}
  absl::Status Flush();

  common::AtomicFileWriter file_;
  int32_t vocab_size_;
  const LlmcLayout* layout_;
  int64_t tokens_ = 0;
  std::string buffer_;  // encoded tokens not yet written
  bool failed_ = false;
};

}  // namespace pipetrain::data
