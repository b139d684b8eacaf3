// Paths a user named (a job's data, init_from, files given to flags), checked before they
// are read: a regular file (or a folder where one is meant) of bounded size, never a FIFO,
// device or socket, and, with --data-root, inside one of the allowed folders.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain::common {

// Per-kind maxima for files read on a user's behalf. A file read whole into memory is
// bounded by what a coordinator can hold; a mapped one only by what is sane on disk.
inline constexpr int64_t kMiB = int64_t{1} << 20;
inline constexpr int64_t kGiB = int64_t{1} << 30;
// data.corpus is read whole into the coordinator's memory.
inline constexpr int64_t kMaxTextFileBytes = 8 * kGiB;
// Token files are memory-mapped, never copied whole.
inline constexpr int64_t kMaxTokenFileBytes = 1024 * kGiB;
// One safetensors file (a checkpoint chunk, a Hugging Face model or shard): GPT-2 XL
// in float32 is 6.4 GB; this leaves room for far larger ones.
inline constexpr int64_t kMaxSafetensorsBytes = 256 * kGiB;
// config.json, checkpoint indexes, the GPT-2 vocabulary (encoder.json is 1 MB).
inline constexpr int64_t kMaxJsonFileBytes = 64 * kMiB;
// Bearer tokens, PEM certificates and keys.
inline constexpr int64_t kMaxSecretFileBytes = 1 * kMiB;

// What a stat mode is, in words for a message: "a FIFO", "a character device", ...
std::string FileKindName(mode_t mode);

// Stats `path` (following symlinks) without opening it, so a FIFO cannot block: its size
// when it is a regular file of at most `max_bytes`, else INVALID_ARGUMENT saying
// "<context> <path> is a FIFO, not a regular file" (or a folder, a device, too big,
// missing). `context` names the job and field, e.g. "job-7: data.corpus".
absl::StatusOr<int64_t> CheckRegularFile(const std::string& path, int64_t max_bytes,
                                         absl::string_view context);
// The same for a folder.
absl::Status CheckFolder(const std::string& path, absl::string_view context);

// A file opened read-only after the checks above, re-checked with fstat on the open
// descriptor (a path swapped for a FIFO between stat and open cannot block: it is
// opened non-blocking, refused, and the flag is cleared only on a regular file).
class ReadOnlyFile {
 public:
  ReadOnlyFile() = default;
  ReadOnlyFile(ReadOnlyFile&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  int fd() const { return fd_; }
  int64_t size() const { return size_; }  // as fstat saw it once opened
  // Gives the descriptor to the caller, who closes it.
  int Release() { return std::exchange(fd_, -1); }

 private:
  friend absl::StatusOr<ReadOnlyFile> OpenRegularFile(const std::string&, int64_t,
                                                      absl::string_view);
  ReadOnlyFile(int fd, int64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  int64_t size_ = 0;
};

absl::StatusOr<ReadOnlyFile> OpenRegularFile(const std::string& path, int64_t max_bytes,
                                             absl::string_view context);
// The whole contents of a checked regular file of at most `max_bytes`.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes,
                                            absl::string_view context);

// Where `path` really is: realpath after symlinks; for a path that does not exist yet (a
// new checkpoint folder) its nearest existing parent's realpath with the rest appended.
// A ".." below a missing folder is refused: it could not be resolved honestly.
absl::StatusOr<std::string> ResolvePath(const std::string& path, absl::string_view context);

// The folders job paths must lie in (the coordinator's --data-root, or its default).
// Empty: any path.
class DataRoots {
 public:
  DataRoots() = default;
  // Each root must be an existing folder; kept as its realpath.
  static absl::StatusOr<DataRoots> Make(const std::vector<std::string>& roots);
  // The roots of a coordinator started without --data-root: its working folder and its
  // state folder (created if missing). Refusals then say so, and how to allow a path.
  static absl::StatusOr<DataRoots> Default(const std::string& working_dir,
                                           const std::string& state_dir);

  bool confining() const { return !roots_.empty(); }
  // Whether "/" is a root: every path is allowed (--data-root /, or a coordinator whose
  // working folder is / and that was given no --data-root).
  bool allows_everything() const;
  const std::vector<std::string>& roots() const { return roots_; }
  // Also allows `folder` (created if missing), e.g. the coordinator's own checkpoints,
  // which `pipetrain resume` names as init_from. A no-op when not confining.
  absl::Status Allow(const std::string& folder);

  // OK when not confining or when `path` resolves inside a root; else INVALID_ARGUMENT
  // "<context> <path> resolves to <real>, outside the coordinator's --data-root folders
  // (<roots>); ..." (for the default roots: "outside the folders this coordinator lets
  // jobs read", and how to start it with --data-root).
  absl::Status Check(const std::string& path, absl::string_view context) const;

 private:
  std::vector<std::string> roots_;
  bool by_default_ = false;  // Default's roots, not --data-root's
};

}  // namespace pipetrain::common
