// The tokenizer interface without a vocabulary file: the bytes tokenizer, MakeTokenizer's
// names and default folder, and EncodeParallel's cutting (the GPT-2 side of it is in
// gpt2_bpe_test).
#include "common/data/tokenizer.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::data {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::IsOkAndHolds;
using ::pipetrain::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(TokenizerTest, BytesTokenizerIsTheIdentityOnBytes) {
  auto tokenizer = MakeTokenizer("bytes", "/ignored");
  ASSERT_THAT(tokenizer, IsOk());
  const Tokenizer& t = **tokenizer;
  EXPECT_EQ(t.name(), "bytes");
  EXPECT_EQ(t.vocab_size(), 256);
  EXPECT_EQ(t.eot_id(), std::nullopt);
  EXPECT_THAT(t.Encode(std::string("a\0\xFF", 3)), IsOkAndHolds(ElementsAre(97, 0, 255)));
  EXPECT_THAT(t.Decode({104, 105, 0}), IsOkAndHolds(std::string("hi\0", 3)));
  EXPECT_THAT(t.Decode({104, 256}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("token id 256"), HasSubstr("position 1"))));
  EXPECT_EQ(t.NextSafeSplit("abc", 1), 1u);
}

TEST(TokenizerTest, UnknownNamesAreRefusedListingTheKnownOnes) {
  EXPECT_THAT(MakeTokenizer("gpt4", ""),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("'gpt4'"), HasSubstr("bytes, gpt2"))));
}

TEST(TokenizerTest, DefaultFolderComesFromTheEnvironmentElseTheInstallPath) {
  const char* saved = std::getenv("PIPETRAIN_TOKENIZER_DIR");
  const std::string restore = saved == nullptr ? "" : saved;
  setenv("PIPETRAIN_TOKENIZER_DIR", "/somewhere/gpt2", 1);
  EXPECT_EQ(DefaultTokenizerDir(), "/somewhere/gpt2");
  unsetenv("PIPETRAIN_TOKENIZER_DIR");
  EXPECT_EQ(DefaultTokenizerDir(), "/usr/local/share/pipetrain/gpt2");
  if (saved != nullptr) setenv("PIPETRAIN_TOKENIZER_DIR", restore.c_str(), 1);
}

TEST(TokenizerTest, ParallelBytesEqualSerialForAnyThreadsAndParts) {
  auto tokenizer = MakeTokenizer("bytes", "");
  ASSERT_THAT(tokenizer, IsOk());
  std::string text;
  for (int i = 0; i < 100000; ++i) text += static_cast<char>((i * 7919) % 256);
  auto serial = (*tokenizer)->Encode(text);
  ASSERT_THAT(serial, IsOk());
  for (int threads : {1, 2, 3, 16}) {
    for (size_t min_part : {size_t{1}, size_t{1000}, size_t{1} << 20}) {
      auto parallel = EncodeParallel(**tokenizer, text, threads, min_part);
      ASSERT_THAT(parallel, IsOk());
      EXPECT_EQ(*parallel, *serial) << threads << " threads, parts of " << min_part;
    }
  }
  EXPECT_THAT(EncodeParallel(**tokenizer, "", 4, 1), IsOkAndHolds(ElementsAre()));
}

}  // namespace
}  // namespace pipetrain::data
