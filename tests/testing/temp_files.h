// File helpers for tests that write files: a fresh temp folder removed on destruction,
// whole-file read and write, and a sorted folder listing (to prove no temp file is left).
#pragma once

#include <string>
#include <vector>

namespace pipetrain::testing {

// A new folder under GoogleTest's TempDir(); removed with its contents when destroyed.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, const std::string& contents);
std::vector<std::string> ListFolder(const std::string& path);  // names, sorted

}  // namespace pipetrain::testing
