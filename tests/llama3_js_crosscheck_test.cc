// Our Llama 3 tokenizer against npm's llama3-tokenizer-js: every text under
// testdata/tokenizer/ must get exactly the same ids from both. The vocabulary is
// exported afresh from the package (deploy/export-llama3-vocab.js, as install-deps.sh
// does), so that only the two encoders differ; node runs bench/llama3_js_encode.js.
// Skips, saying why, without node or the package (deploy/install-deps.sh installs both).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/data/tokenizer.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/llama3_vocab.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::data {
namespace {

using ::pipetrain::testing::IsOk;

std::vector<std::string> TestTexts() {
  std::vector<std::string> files;
  for (const auto& entry :
       std::filesystem::directory_iterator(PIPETRAIN_TESTDATA_DIR "/tokenizer")) {
    if (entry.path().extension() == ".txt") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The lines `node ARGS...` prints; fails the test when it does not exit 0.
std::vector<std::string> NodeLines(const std::vector<std::string>& argv) {
  auto run = pipetrain::testing::RunCommand(argv, std::chrono::seconds(120));
  EXPECT_THAT(run, IsOk());
  if (!run.ok()) return {};
  EXPECT_EQ(run->exit_code, 0) << run->err;
  return absl::StrSplit(run->out, '\n', absl::SkipEmpty());
}

TEST(Llama3JsCrossCheckTest, IdsEqualTheJavaScriptEncoders) {
  const std::string node = pipetrain::testing::FindNode();
  if (node.empty()) GTEST_SKIP() << "node is not on PATH (deploy/install-deps.sh installs it)";
  const std::string package = pipetrain::testing::Llama3JsPackage();
  if (!pipetrain::testing::Readable(pipetrain::testing::Llama3JsBundle(package))) {
    GTEST_SKIP() << "npm's llama3-tokenizer-js is not in " << package
                 << " (run deploy/install-deps.sh, or set PIPETRAIN_LLAMA3_JS_PACKAGE)";
  }
  pipetrain::testing::TempDir vocab;
  NodeLines({node, PIPETRAIN_SOURCE_DIR "/deploy/export-llama3-vocab.js", package, vocab.path()});
  auto tokenizer = MakeTokenizer("llama3", vocab.path());
  ASSERT_THAT(tokenizer, IsOk());
  EXPECT_EQ((*tokenizer)->vocab_size(), 128256);

  const std::vector<std::string> files = TestTexts();
  ASSERT_GE(files.size(), 12u);
  std::vector<std::string> argv = {node, PIPETRAIN_SOURCE_DIR "/bench/llama3_js_encode.js",
                                   package, "ids"};
  argv.insert(argv.end(), files.begin(), files.end());
  const std::vector<std::string> lines = NodeLines(argv);
  ASSERT_EQ(lines.size(), files.size());

  for (size_t i = 0; i < files.size(); ++i) {
    const std::string text = pipetrain::testing::ReadFileOrDie(files[i]);
    const nlohmann::json js = nlohmann::json::parse(lines[i], nullptr, false);
    ASSERT_TRUE(js.is_array()) << lines[i];
    const std::vector<int32_t> expected = js.get<std::vector<int32_t>>();
    auto ours = (*tokenizer)->Encode(text);
    ASSERT_THAT(ours, IsOk());
    // Parallel encoding (cut at safe splits every few bytes) gives the same ids.
    auto parallel = EncodeParallel(**tokenizer, text, 4, 16);
    ASSERT_THAT(parallel, IsOk());
    EXPECT_EQ(*parallel, *ours) << files[i];
    if (*ours == expected) continue;
    // Name the first difference, with the text around it.
    size_t at = 0;
    while (at < ours->size() && at < expected.size() && (*ours)[at] == expected[at]) ++at;
    auto context =
        (*tokenizer)->Decode(absl::Span<const int32_t>(expected).subspan(at >= 5 ? at - 5 : 0, 10));
    ADD_FAILURE() << files[i] << ": ids differ from token " << at << " (ours "
                  << (at < ours->size() ? std::to_string((*ours)[at]) : "none") << ", js "
                  << (at < expected.size() ? std::to_string(expected[at]) : "none") << "), around '"
                  << (context.ok() ? *context : "?") << "'";
  }
}

}  // namespace
}  // namespace pipetrain::data
