// Our Llama 3 tokenizer against npm's llama3-tokenizer-js: every text under
// testdata/tokenizer/ must get exactly the same ids from both, and the same again when
// encoded in parallel. The vocabulary is exported afresh from the package
// (deploy/export-llama3-vocab.js, as install-deps.sh does), so that only the two
// encoders differ; node runs bench/llama3_js_encode.js. Skips, saying why, without node
// or the package (deploy/install-deps.sh installs both).
#include <chrono>
#include <string>
#include <vector>

#include "common/data/tokenizer.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/js_crosscheck.h"
#include "tests/testing/llama3_vocab.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::data {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::NodeLines;

constexpr std::chrono::seconds kNodeTimeout(120);

TEST(Llama3JsCrossCheckTest, IdsEqualTheJavaScriptEncoders) {
  const std::string node = pipetrain::testing::FindNode();
  if (node.empty()) GTEST_SKIP() << "node is not on PATH (deploy/install-deps.sh installs it)";
  const std::string package = pipetrain::testing::Llama3JsPackage();
  if (!pipetrain::testing::Readable(pipetrain::testing::Llama3JsBundle(package))) {
    GTEST_SKIP() << "npm's llama3-tokenizer-js is not in " << package
                 << " (run deploy/install-deps.sh, or set PIPETRAIN_LLAMA3_JS_PACKAGE)";
  }
  pipetrain::testing::TempDir vocab;
  NodeLines({node, PIPETRAIN_SOURCE_DIR "/deploy/export-llama3-vocab.js", package, vocab.path()},
            kNodeTimeout);
  auto tokenizer = MakeTokenizer("llama3", vocab.path());
  ASSERT_THAT(tokenizer, IsOk());
  EXPECT_EQ((*tokenizer)->vocab_size(), 128256);

  const std::vector<std::string> files =
      pipetrain::testing::TextFiles(PIPETRAIN_TESTDATA_DIR "/tokenizer");
  ASSERT_GE(files.size(), 12u);
  std::vector<std::string> argv = {node, PIPETRAIN_SOURCE_DIR "/bench/llama3_js_encode.js", package,
                                   "ids"};
  argv.insert(argv.end(), files.begin(), files.end());
  pipetrain::testing::ExpectIdsEqualJs(**tokenizer, files, NodeLines(argv, kNodeTimeout));

  // Parallel encoding (cut at safe splits every few bytes) gives the same ids.
  for (const std::string& file : files) {
    const std::string text = pipetrain::testing::ReadFileOrDie(file);
    auto serial = (*tokenizer)->Encode(text);
    auto parallel = EncodeParallel(**tokenizer, text, 4, 16);
    ASSERT_THAT(serial, IsOk());
    ASSERT_THAT(parallel, IsOk());
    EXPECT_EQ(*parallel, *serial) << file;
  }
}

}  // namespace
}  // namespace pipetrain::data
