#include "common/data/token_file_writer.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::data {
namespace {

constexpr size_t kFlushBytes = size_t{1} << 20;

void AppendLittleEndian32(int32_t v, std::string* out) {
  const auto u = static_cast<uint32_t>(v);
  for (int shift = 0; shift < 32; shift += 8) out->push_back(static_cast<char>(u >> shift));
}

}  // namespace

absl::StatusOr<TokenFileWriter> TokenFileWriter::Open(const std::string& path, int32_t vocab_size,
                                                      const LlmcLayout& layout) {
  if (vocab_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": vocabulary size ", vocab_size, " must be >= 1"));
  }
  ASSIGN_OR_RETURN(common::AtomicFileWriter file, common::AtomicFileWriter::Open(path));
  // Room for the header, filled in by Commit.
  RETURN_IF_ERROR(file.Write(std::string(kHeaderBytes, '\0')));
  return TokenFileWriter(std::move(file), vocab_size, layout);
}

absl::Status TokenFileWriter::Append(absl::Span<const int32_t> ids) {
  if (failed_) {
    return absl::FailedPreconditionError(absl::StrCat(path(), ": an earlier write failed"));
  }
  const int64_t most = layout_->token_bytes == 2 ? std::numeric_limits<uint16_t>::max()
                                                 : std::numeric_limits<int32_t>::max();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    const bool fits = id >= 0 && id <= most;
    if (!fits || id >= vocab_size_) {
      failed_ = true;
      return absl::InvalidArgumentError(absl::StrCat(
          path(), ": token id ", id, " (token ", tokens_ + static_cast<int64_t>(i), ") ",
          fits ? absl::StrCat("is not below the vocabulary size ", vocab_size_)
               : absl::StrCat("does not fit the file's uint", 8 * layout_->token_bytes,
                              " tokens (0..", most, ")")));
    }
  }
  if (tokens_ + static_cast<int64_t>(ids.size()) > std::numeric_limits<int32_t>::max()) {
    failed_ = true;
    return absl::OutOfRangeError(absl::StrCat(
        path(), ": more than 2^31 - 1 tokens, the most the header's int32 count can hold"));
  }
  for (int32_t id : ids) {
    for (int shift = 0; shift < 8 * layout_->token_bytes; shift += 8) {
      buffer_.push_back(static_cast<char>(id >> shift));
    }
  }
  tokens_ += static_cast<int64_t>(ids.size());
  if (buffer_.size() >= kFlushBytes) return Flush();
  return absl::OkStatus();
}

absl::Status TokenFileWriter::Flush() {
  absl::Status s = file_.Write(buffer_);
  buffer_.clear();
  if (!s.ok()) failed_ = true;
  return s;
}

absl::Status TokenFileWriter::Commit() {
  if (failed_) {
    return absl::FailedPreconditionError(absl::StrCat(path(), ": an earlier write failed"));
  }
  RETURN_IF_ERROR(Flush());
  std::string header;
  header.reserve(kHeaderBytes);
  AppendLittleEndian32(layout_->magic, &header);
  AppendLittleEndian32(layout_->version, &header);
  AppendLittleEndian32(static_cast<int32_t>(tokens_), &header);
  header.resize(kHeaderBytes, '\0');
  RETURN_IF_ERROR(file_.WriteAt(0, header));
  return file_.Commit();
}

}  // namespace pipetrain::data
