// What the cross-checks of our tokenizers against npm's JavaScript encoders share: the
// texts they encode, running node on a script, and comparing the ids text by text,
// naming the first difference with the text around it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "common/data/tokenizer.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::testing {

// The paths of the *.txt files in `dir`, sorted.
inline std::vector<std::string> TextFiles(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".txt") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// The non-empty lines `argv` (node, its script and the script's arguments) prints; fails
// the test when it does not run to exit status 0 within `timeout`.
inline std::vector<std::string> NodeLines(const std::vector<std::string>& argv,
                                          std::chrono::seconds timeout) {
  auto run = RunCommand(argv, timeout);
  EXPECT_THAT(run, IsOk());
  if (!run.ok()) return {};
  EXPECT_EQ(run->exit_code, 0) << run->err;
  return absl::StrSplit(run->out, '\n', absl::SkipEmpty());
}

// Every file's ids from `tokenizer` equal the JavaScript encoder's, js_lines holding one
// JSON array of ids per file, in the order of `files`. A difference names the file, the
// first token that differs and the text around it.
inline void ExpectIdsEqualJs(const data::Tokenizer& tokenizer,
                             const std::vector<std::string>& files,
                             const std::vector<std::string>& js_lines) {
  ASSERT_EQ(js_lines.size(), files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string text = ReadFileOrDie(files[i]);
    const nlohmann::json js = nlohmann::json::parse(js_lines[i], nullptr, false);
    ASSERT_TRUE(js.is_array()) << js_lines[i];
    const std::vector<int32_t> expected = js.get<std::vector<int32_t>>();
    auto ours = tokenizer.Encode(text);
    ASSERT_THAT(ours, IsOk());
    if (*ours == expected) continue;
    size_t at = 0;
    while (at < ours->size() && at < expected.size() && (*ours)[at] == expected[at]) ++at;
    auto context =
        tokenizer.Decode(absl::Span<const int32_t>(expected).subspan(at >= 5 ? at - 5 : 0, 10));
    ADD_FAILURE() << files[i] << ": ids differ from token " << at << " (ours "
                  << (at < ours->size() ? std::to_string((*ours)[at]) : "none") << ", js "
                  << (at < expected.size() ? std::to_string(expected[at]) : "none") << "), around '"
                  << (context.ok() ? *context : "?") << "'";
  }
}

}  // namespace pipetrain::testing
