// A fresh folder under $TMPDIR (else /tmp) for a benchmark's files (specs, corpora, a
// cluster's state), removed with its contents when the benchmark is done.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::bench {

class ScratchDir {
 public:
  // `name` labels the folder: $TMPDIR/pipetrain_NAME.XXXXXX.
  static absl::StatusOr<ScratchDir> Make(const std::string& name) {
    const char* tmp = getenv("TMPDIR");
    std::string pattern = absl::StrCat(tmp && *tmp ? tmp : "/tmp", "/pipetrain_", name, ".XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat(name, ": cannot make a folder like ", pattern));
    }
    return ScratchDir(std::move(pattern));
  }
  ScratchDir(ScratchDir&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  ScratchDir& operator=(ScratchDir&&) = delete;
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  explicit ScratchDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace pipetrain::bench
