// Writes llm.c's token files (its dev/data scripts' .bin; train_gpt2.c and our corpus
// readers load them): a header of 256 little-endian int32 (magic 20240520, version 1,
// the token count, zeros), then the tokens as little-endian uint16. Written atomically.
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
  static constexpr int32_t kMagic = kLlmcMagic;
  static constexpr int32_t kVersion = kLlmcVersion;
  static constexpr int kHeaderInts = 256;
  static constexpr int64_t kHeaderBytes = kLlmcHeaderBytes;
  static_assert(kHeaderInts * 4 == kLlmcHeaderBytes);

  // vocab_size: every id appended must be below it (and fit in uint16).
  static absl::StatusOr<TokenFileWriter> Open(const std::string& path, int32_t vocab_size);

  // An id that is negative, above 65535 or not below vocab_size is refused, naming the
  // id and its position in the file; nothing of that call is written.
  absl::Status Append(absl::Span<const int32_t> ids);
  absl::Status Commit();

  int64_t tokens() const { return tokens_; }
  const std::string& path() const { return file_.path(); }

 private:
  TokenFileWriter(common::AtomicFileWriter file, int32_t vocab_size)
      : file_(std::move(file)), vocab_size_(vocab_size) {}
  absl::Status Flush();

  common::AtomicFileWriter file_;
  int32_t vocab_size_;
  int64_t tokens_ = 0;
  std::string buffer_;  // encoded tokens not yet written
  bool failed_ = false;
};

}  // namespace pipetrain::data
