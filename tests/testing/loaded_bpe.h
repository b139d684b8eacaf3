// A test fixture for a tokenizer's real vocabulary, loaded once for the whole suite from
// where deploy/install-deps.sh puts it; every test of the suite skips, saying what is
// missing, where the files are absent (a machine that has not run the script).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/data/tokenizer.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::testing {

// Bpe: the tokenizer class (static Load(dir) -> StatusOr<unique_ptr<Bpe>>); kTokenizer:
// its name, whose DefaultTokenizerDir is read; Missing(): empty when the files are
// there, else why the tests skip. A suite is `class Gpt2BpeTest : public
// LoadedBpeTest<Gpt2Bpe, kGpt2, Gpt2VocabMissing> {};`.
template <typename Bpe, const char* kTokenizer, std::string (*Missing)()>
class LoadedBpeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!Missing().empty()) return;
    auto loaded = Bpe::Load(data::DefaultTokenizerDir(kTokenizer));
    ASSERT_THAT(loaded, IsOk());
    bpe_ = loaded->release();
  }
  static void TearDownTestSuite() {
    delete bpe_;
    bpe_ = nullptr;
  }
  void SetUp() override {
    if (bpe_ == nullptr) GTEST_SKIP() << Missing();
  }

  // The ids of `text`; an encoding error fails the test (and gives no ids).
  static std::vector<int32_t> Ids(absl::string_view text) {
    auto ids = bpe_->Encode(text);
    EXPECT_THAT(ids, IsOk());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  inline static Bpe* bpe_ = nullptr;
};

}  // namespace pipetrain::testing
