#include "tests/fuzz/fuzz_temp_file.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace pipetrain::fuzz {

const std::string& TempFolder() {
  static const std::string* const folder = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/pipetrain-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("pipetrain fuzz: mkdtemp");
      std::abort();
    }
    auto* made = new std::string(pattern);
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(TempFolder(), ignored);
    });
    return made;
  }();
  return *folder;
}

std::string WriteTempFile(const std::string& name, absl::string_view bytes) {
  const std::string path = TempFolder() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "pipetrain fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

void RemoveTempFile(const std::string& name) {
  std::error_code ignored;
  std::filesystem::remove(TempFolder() + "/" + name, ignored);
}

}  // namespace pipetrain::fuzz
