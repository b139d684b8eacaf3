#include "common/user_path.h"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_format.h"
#include "common/status_macros.h"

namespace pipetrain::common {
namespace {

namespace fs = std::filesystem;

absl::Status Refuse(absl::string_view context, const std::string& path,
                    absl::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(context, context.empty() ? "" : " ", path, " ", problem));
}

// NOT_FOUND for a missing file (callers that judge a spec turn it into INVALID_ARGUMENT),
// INVALID_ARGUMENT otherwise.
absl::Status StatError(int error, absl::string_view context, const std::string& path) {
  const std::string message = absl::StrCat(context, context.empty() ? "" : " ", "cannot read ",
                                           path, ": ", std::strerror(error));
  if (error == ENOENT) return absl::NotFoundError(message);
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<int64_t> CheckStatRegular(const struct stat& st, const std::string& path,
                                         int64_t max_bytes, absl::string_view context) {
  if (!S_ISREG(st.st_mode)) {
    return Refuse(context, path,
                  absl::StrCat("is ", FileKindName(st.st_mode), ", not a regular file"));
  }
  const int64_t size = static_cast<int64_t>(st.st_size);
  if (size > max_bytes) {
    return Refuse(context, path,
                  absl::StrCat("is ", size, " bytes, more than the ", FormatBytes(max_bytes),
                               " allowed for it"));
  }
  return size;
}

absl::StatusOr<std::string> RealPath(const std::string& path) {
  char buffer[PATH_MAX];
  if (realpath(path.c_str(), buffer) == nullptr) return absl::ErrnoToStatus(errno, path);
  return std::string(buffer);
}

bool Inside(const std::string& real, const std::string& root) {
  if (root == "/") return true;
  return real == root || (real.size() > root.size() && real.compare(0, root.size(), root) == 0 &&
                          real[root.size()] == '/');
}

}  // namespace

std::string FileKindName(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a file";
}

absl::StatusOr<int64_t> CheckRegularFile(const std::string& path, int64_t max_bytes,
                                         absl::string_view context) {
  if (path.empty()) return Refuse(context, "''", "is empty; give the path of a file");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return StatError(errno, context, path);
  return CheckStatRegular(st, path, max_bytes, context);
}

absl::Status CheckFolder(const std::string& path, absl::string_view context) {
  if (path.empty()) return Refuse(context, "''", "is empty; give the path of a folder");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return StatError(errno, context, path);
  if (!S_ISDIR(st.st_mode)) {
    return Refuse(context, path, absl::StrCat("is ", FileKindName(st.st_mode), ", not a folder"));
  }
  return absl::OkStatus();
}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<ReadOnlyFile> OpenRegularFile(const std::string& path, int64_t max_bytes,
                                             absl::string_view context) {
  // The stat first gives the clearer message; the fstat below is what is trusted.
  RETURN_IF_ERROR(CheckRegularFile(path, max_bytes, context).status());
  // O_NONBLOCK: a FIFO swapped in after the stat opens at once instead of waiting for a
  // writer; O_NOCTTY: a terminal swapped in never becomes the controlling one.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return StatError(errno, context, path);
  ReadOnlyFile file(fd, 0);
  struct stat st;
  if (::fstat(fd, &st) != 0) return StatError(errno, context, path);
  ASSIGN_OR_RETURN(file.size_, CheckStatRegular(st, path, max_bytes, context));
  // Regular files ignore O_NONBLOCK, but clear it so that nothing downstream sees EAGAIN.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return StatError(errno, context, path);
  }
  return file;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, int64_t max_bytes,
                                            absl::string_view context) {
  ASSIGN_OR_RETURN(ReadOnlyFile file, OpenRegularFile(path, max_bytes, context));
  std::string out;
  // Read to the end rather than trusting the size: a file may grow or shrink meanwhile,
  // but never past the bound.
  out.resize(static_cast<size_t>(file.size()));
  size_t have = 0;
  while (true) {
    if (have == out.size()) {
      if (static_cast<int64_t>(out.size()) >= max_bytes) {
        char probe;
        const ssize_t n = ::read(file.fd(), &probe, 1);
        if (n == 0) break;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return StatError(errno, context, path);
        return Refuse(context, path,
                      absl::StrCat("grew past the ", FormatBytes(max_bytes), " allowed for it"));
      }
      out.resize(static_cast<size_t>(
          std::min<int64_t>(max_bytes, static_cast<int64_t>(out.size()) * 2 + 4096)));
    }
    const ssize_t n = ::read(file.fd(), out.data() + have, out.size() - have);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatError(errno, context, path);
    }
    have += static_cast<size_t>(n);
  }
  out.resize(have);
  return out;
}

absl::StatusOr<std::string> ResolvePath(const std::string& path, absl::string_view context) {
  if (path.empty()) return Refuse(context, "''", "is empty");
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) return Refuse(context, path, absl::StrCat("cannot be resolved: ", ec.message()));
  std::vector<fs::path> missing;  // components below the nearest existing folder, reversed
  while (true) {
    absl::StatusOr<std::string> real = RealPath(p.string());
    if (real.ok()) {
      fs::path out(*real);
      for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
        if (*it == "..") {
          return Refuse(context, path,
                        "has '..' below a folder that does not exist; name it without '..'");
        }
        if (*it != "." && !it->empty()) out /= *it;
      }
      return out.string();
    }
    if (!absl::IsNotFound(real.status()) || !p.has_parent_path() || p.parent_path() == p) {
      return Refuse(context, path,
                    absl::StrCat("cannot be resolved: ", real.status().message()));
    }
    missing.push_back(p.filename());
    p = p.parent_path();
  }
}

absl::StatusOr<DataRoots> DataRoots::Make(const std::vector<std::string>& roots) {
  DataRoots out;
  for (const std::string& root : roots) {
    RETURN_IF_ERROR(CheckFolder(root, "--data-root"));
    ASSIGN_OR_RETURN(std::string real, ResolvePath(root, "--data-root"));
    out.roots_.push_back(std::move(real));
  }
  return out;
}

absl::StatusOr<DataRoots> DataRoots::Default(const std::string& working_dir,
                                             const std::string& state_dir) {
  ASSIGN_OR_RETURN(DataRoots out, Make({working_dir}));
  RETURN_IF_ERROR(out.Allow(state_dir));
  out.by_default_ = true;
  return out;
}

bool DataRoots::allows_everything() const {
  return std::find(roots_.begin(), roots_.end(), "/") != roots_.end();
}

absl::Status DataRoots::Allow(const std::string& folder) {
  if (!confining()) return absl::OkStatus();
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create ", folder, ": ", ec.message()));
  }
  ASSIGN_OR_RETURN(std::string real, ResolvePath(folder, ""));
  roots_.push_back(std::move(real));
  return absl::OkStatus();
}

absl::Status DataRoots::Check(const std::string& path, absl::string_view context) const {
  if (!confining()) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::string real, ResolvePath(path, context));
  for (const std::string& root : roots_) {
    if (Inside(real, root)) return absl::OkStatus();
  }
  const std::string where = real == path ? "is" : absl::StrCat("resolves to ", real, ",");
  if (by_default_) {
    return Refuse(context, path,
                  absl::StrCat(where, " outside the folders this coordinator lets jobs read (",
                               absl::StrJoin(roots_, ", "),
                               ": its working folder and its --state-dir, as it was started "
                               "without --data-root); put the file under one of them, or "
                               "start the coordinator with --data-root DIR for the folder "
                               "that holds it (--data-root / allows any file)"));
  }
  return Refuse(context, path,
                absl::StrCat(where, " outside the coordinator's --data-root folders (",
                             absl::StrJoin(roots_, ", "),
                             "); put the file under one of them or start the coordinator "
                             "with another --data-root"));
}

}  // namespace pipetrain::common
