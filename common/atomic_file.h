// Writes a file so that readers see either the old contents or the complete new ones,
// never a torn mix, even across a crash: temp file in the same folder, write, fsync,
// rename over the target, fsync the folder. Checkpoints and their index use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::common {

// Usage: Open, Write as often as needed, Commit. Destroying an uncommitted writer (for
// example after a failed Write) removes the temp file and leaves the target untouched.
class AtomicFileWriter {
 public:
  // Creates "<path>.tmp.XXXXXX" next to `path` (same folder, so the rename cannot cross
  // file systems).
  static absl::StatusOr<AtomicFileWriter> Open(const std::string& path);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Write(std::span<const std::byte> bytes);
  absl::Status Write(absl::string_view bytes);
  // Overwrites bytes already written, at `offset` from the start, leaving the position
  // where writes go on as it is: for a header whose figures are known only at the end.
  absl::Status WriteAt(uint64_t offset, absl::string_view bytes);
  // fsync, close, rename over the target, fsync the folder. The writer is done after
  // this whatever the outcome.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  AtomicFileWriter(std::string path, std::string temp_path, int fd)
      : path_(std::move(path)), temp_path_(std::move(temp_path)), fd_(fd) {}
  void Abandon();

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
};

// One-shot convenience: the whole contents at once.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents);

}  // namespace pipetrain::common
