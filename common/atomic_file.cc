#include "common/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::common {
namespace {

absl::Status ErrnoError(int error, absl::string_view what, absl::string_view path) {
  // Both mean there is no room for the file (EFBIG: a file-size limit such as
  // RLIMIT_FSIZE or a quota); say so in the words an operator acts on.
  if (error == ENOSPC || error == EFBIG) {
    return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path, ": disk full"));
  }
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path));
}

// The folder that holds `path`, for the fsync that makes the rename durable.
std::string FolderOf(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

}  // namespace

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("empty output path");
  std::string pattern = absl::StrCat(path, ".tmp.XXXXXX");
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0) return ErrnoError(errno, "cannot create a temp file for", path);
  // mkstemp makes the file 0600; a checkpoint is an ordinary data file.
  fchmod(fd, 0644);
  return AtomicFileWriter(path, std::string(name.data()), fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)) {}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ < 0) return;
  close(fd_);
  fd_ = -1;
  unlink(temp_path_.c_str());
}

absl::Status AtomicFileWriter::Write(std::span<const std::byte> bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = write(fd_, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      Abandon();
      return ErrnoError(error, "cannot write", temp_path_);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Write(absl::string_view bytes) {
  return Write(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
}

absl::Status AtomicFileWriter::WriteAt(uint64_t offset, absl::string_view bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  while (!bytes.empty()) {
    const ssize_t n = pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int error = errno;
      Abandon();
      return ErrnoError(error, "cannot write", temp_path_);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  if (fsync(fd_) != 0) {
    const int error = errno;
    Abandon();
    return ErrnoError(error, "cannot fsync", temp_path_);
  }
  const int fd = std::exchange(fd_, -1);
  if (close(fd) != 0) {
    const int error = errno;
    unlink(temp_path_.c_str());
    return ErrnoError(error, "cannot close", temp_path_);
  }
  if (rename(temp_path_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    unlink(temp_path_.c_str());
    return ErrnoError(error, absl::StrCat("cannot rename ", temp_path_, " to"), path_);
  }
  // Without this the rename itself may not survive a crash.
  const std::string folder = FolderOf(path_);
  const int dir_fd = open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoError(errno, "cannot open folder", folder);
  const int rc = fsync(dir_fd);
  const int error = errno;
  close(dir_fd);
  if (rc != 0) return ErrnoError(error, "cannot fsync folder", folder);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents) {
  ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(writer.Write(contents));
  return writer.Commit();
}

}  // namespace pipetrain::common
