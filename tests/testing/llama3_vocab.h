// Where the tests find Llama 3's vocabulary and npm's llama3-tokenizer-js, which
// deploy/install-deps.sh installs; tests that need them skip, saying what is missing,
// where they are absent (a machine that has not run the script).
#pragma once

#include <cstdlib>
#include <string>

#include "common/data/tokenizer.h"
#include "tests/testing/gpt2_vocab.h"

namespace pipetrain::testing {

// Empty when DefaultTokenizerDir("llama3") has encoder.json and vocab.bpe, else why a
// test skips.
inline std::string Llama3VocabMissing() {
  const std::string dir = data::DefaultTokenizerDir("llama3");
  if (Readable(dir + "/encoder.json") && Readable(dir + "/vocab.bpe")) return "";
  return "the Llama 3 vocabulary is not in " + dir +
         " (run deploy/install-deps.sh, or set PIPETRAIN_LLAMA3_TOKENIZER_DIR)";
}

// npm's llama3-tokenizer-js: $PIPETRAIN_LLAMA3_JS_PACKAGE, else where install-deps.sh
// puts it.
inline std::string Llama3JsPackage() {
  const char* env = std::getenv("PIPETRAIN_LLAMA3_JS_PACKAGE");
  return env != nullptr && *env != '\0'
             ? env
             : "/usr/local/share/pipetrain/node/node_modules/llama3-tokenizer-js";
}

// The package's CommonJS bundle, which bench/llama3_js_encode.js and
// deploy/export-llama3-vocab.js load.
inline std::string Llama3JsBundle(const std::string& package) {
  return package + "/bundle/commonjs-llama3-tokenizer-with-baked-data.cjs";
}

}  // namespace pipetrain::testing
