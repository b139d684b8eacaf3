// For fuzz targets whose entry point takes a path: one private temporary folder per
// process (removed at exit), in which a target writes the fuzzer's bytes as files.
#pragma once

#include <string>
#include "absl/strings/string_view.h"

namespace pipetrain::fuzz {

// The process's folder under $TMPDIR (or /tmp), made on first use.
const std::string& TempFolder();

// Writes `bytes` to TempFolder()/name (replacing it) and returns the path; aborts if
// the write fails, since a target that cannot write its input tests nothing.
std::string WriteTempFile(const std::string& name, absl::string_view bytes);

// Removes TempFolder()/name if it exists.
void RemoveTempFile(const std::string& name);

}  // namespace pipetrain::fuzz
