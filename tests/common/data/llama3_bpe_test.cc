// The Llama 3 tokenizer: merging one pair at a time, lowest rank first, against an
// independent reference (on small made-up vocabularies whose merges make the same
// symbol in several ways, as Llama 3's do, through both merge paths), a pre-token that
// is a symbol taken whole, special tokens; and on the real vocabulary (skipped where
// deploy/install-deps.sh has not put it): known ids, special ids, round trips of any
// bytes, pre-tokens, safe splits and parallel encoding equal to serial.
#include "common/data/llama3_bpe.h"

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/data/gpt2_bpe.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/bpe_checks.h"
#include "tests/testing/llama3_vocab.h"
#include "tests/testing/loaded_bpe.h"
#include "tests/testing/made_up_vocab.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::data {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::IsOkAndHolds;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

namespace pt = ::pipetrain::testing;  // the helpers of tests/testing/

// Hugging Face's BPE on strings, written independently: the whole word when it is a
// symbol; else, while a pair has a rank, merge the lowest-ranked pair, the leftmost one
// of equal rank, and only that one.
std::vector<std::string> ReferenceBpe(const std::string& word, const pt::MergeRanks& ranks,
                                      const std::map<std::string, int32_t>& ids) {
  if (ids.count(word) > 0) return {word};
  std::vector<std::string> symbols;
  for (char c : word) symbols.emplace_back(1, c);
  while (symbols.size() > 1) {
    int best = -1;
    size_t at = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = ranks.find({symbols[i], symbols[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        at = i;
      }
    }
    if (best < 0) break;
    symbols[at] += symbols[at + 1];
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(at) + 1);
  }
  return symbols;
}

// "abc" is a symbol, but merging "abc" gives "ab" "c": Llama 3 takes the word whole,
// GPT-2's OpenAI loop (same files) merges. And "aaa": one merge at a time gives "aa" "a"
// where OpenAI's rounds merge every occurrence too (the same here; the heap test below
// covers where they differ).
TEST(Llama3BpeMadeUpTest, AWordThatIsASymbolIsTakenWhole) {
  TempDir dir;
  pt::MadeUpVocab vocab;
  vocab.merges = {{"a", "b"}, {"b", "c"}, {"a", "bc"}, {"a", "a"}};
  vocab.specials = {"<|begin_of_text|>", "<|end_of_text|>"};
  vocab.Write(dir.path());
  auto llama = Llama3Bpe::Load(dir.path());
  ASSERT_THAT(llama, IsOk());
  auto gpt2 = Gpt2Bpe::Load(dir.path());
  ASSERT_THAT(gpt2, IsOk());
  const int32_t ab = 256, bc = 257, abc = 258, aa = 259;
  EXPECT_THAT((*llama)->Encode("abc"), IsOkAndHolds(ElementsAre(abc)));
  EXPECT_THAT((*gpt2)->Encode("abc"), IsOkAndHolds(ElementsAre(ab, 'c')));
  EXPECT_THAT((*llama)->Encode("abcc"), IsOkAndHolds(ElementsAre(ab, 'c', 'c')));
  EXPECT_THAT((*llama)->Encode("aaa"), IsOkAndHolds(ElementsAre(aa, 'a')));
  EXPECT_THAT((*llama)->Encode(" bc"), IsOkAndHolds(ElementsAre(' ', bc)));
  // The special tokens: ids from encoder.json, their text ordinary text.
  EXPECT_EQ((*llama)->name(), "llama3");
  EXPECT_EQ((*llama)->vocab_size(), 262);
  EXPECT_EQ((*llama)->bos_id(), 260);
  EXPECT_EQ((*llama)->eot_id(), 261);
  EXPECT_EQ((*gpt2)->bos_id(), std::nullopt);
  auto special_text = (*llama)->Encode("<|end_of_text|>");
  ASSERT_THAT(special_text, IsOk());
  EXPECT_EQ(special_text->size(), 15u);  // no merges of these bytes: one id a byte
  EXPECT_THAT((*llama)->Decode({260, abc, 261}),
              IsOkAndHolds(std::string("<|begin_of_text|>abc<|end_of_text|>")));
  EXPECT_THAT((*llama)->Decode({262}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("token id 262"), HasSubstr("llama3 vocabulary"))));
}

// Random vocabularies where several merges make the same symbol (Llama 3's file lists a
// merge for every way to cut a token into two), so that OpenAI's rounds and one merge
// at a time can differ; short words (the plain loop) and long ones (the heap, 64 bytes
// or more) must equal the reference.
TEST(Llama3BpeMadeUpTest, EqualsTheReferenceOnShortAndLongWords) {
  std::mt19937 rng(11);
  int differs_from_rounds = 0;
  for (int v = 0; v < 8; ++v) {
    pt::MadeUpVocab vocab;
    vocab.merges = pt::RandomMerges(rng, 60, pt::MergesPerSymbol::kSeveral);
    const pt::MergeRanks ranks = pt::RanksOf(vocab.merges);
    TempDir dir;
    vocab.Write(dir.path());
    auto llama = Llama3Bpe::Load(dir.path());
    ASSERT_THAT(llama, IsOk());
    auto gpt2 = Gpt2Bpe::Load(dir.path());
    ASSERT_THAT(gpt2, IsOk());
    const auto ids = vocab.Ids();
    for (int w = 0; w < 300; ++w) {
      const std::string word = pt::RandomAbcWord(rng, w % 2 == 0 ? 20 : 400);
      std::vector<int32_t> expected;
      for (const std::string& s : ReferenceBpe(word, ranks, ids)) expected.push_back(ids.at(s));
      ASSERT_THAT((*llama)->Encode(word), IsOkAndHolds(ElementsAreArray(expected)))
          << "vocabulary " << v << ", word " << word;
      if (*(*gpt2)->Encode(word) != expected) ++differs_from_rounds;
    }
  }
  EXPECT_GT(differs_from_rounds, 0) << "no word told the two merge orders apart";
}

TEST(Llama3BpeMadeUpTest, MissingFilesNameThePathAndTheWayToGetThem) {
  TempDir dir;
  EXPECT_THAT(Llama3Bpe::Load(dir.File("nowhere")),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr(dir.File("nowhere/encoder.json")), HasSubstr("Llama 3"),
                             HasSubstr("deploy/install-deps.sh"), HasSubstr("--tokenizer-dir"),
                             HasSubstr("PIPETRAIN_LLAMA3_TOKENIZER_DIR"))));
  pt::MadeUpVocab vocab;
  vocab.merges = {{"a", "b"}};
  vocab.Write(dir.path());
  WriteFileOrDie(dir.File("vocab.bpe"), "#version: made up\na b\nab zz\n");
  EXPECT_THAT(Llama3Bpe::Load(dir.path()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(dir.File("vocab.bpe") + ":3: the symbol 'zz' is not in")));
}

TEST(TokenizerNamesTest, Llama3IsKnownWithItsOwnDefaultFolder) {
  EXPECT_EQ(TokenizerNames(), "bytes, gpt2, llama3");
  EXPECT_TRUE(IsTokenizerName("llama3"));
  EXPECT_FALSE(IsTokenizerName("llama"));
  const char* saved = std::getenv("PIPETRAIN_LLAMA3_TOKENIZER_DIR");
  const std::string restore = saved == nullptr ? "" : saved;
  setenv("PIPETRAIN_LLAMA3_TOKENIZER_DIR", "/somewhere/llama3", 1);
  EXPECT_EQ(DefaultTokenizerDir("llama3"), "/somewhere/llama3");
  unsetenv("PIPETRAIN_LLAMA3_TOKENIZER_DIR");
  EXPECT_EQ(DefaultTokenizerDir("llama3"), "/usr/local/share/pipetrain/llama3");
  EXPECT_EQ(DefaultTokenizerDir("bytes"), "");
  if (saved != nullptr) setenv("PIPETRAIN_LLAMA3_TOKENIZER_DIR", restore.c_str(), 1);
}

// The real vocabulary, loaded once.
constexpr char kLlama3[] = "llama3";
class Llama3BpeTest : public pt::LoadedBpeTest<Llama3Bpe, kLlama3, pt::Llama3VocabMissing> {};

TEST_F(Llama3BpeTest, VocabularyFigures) {
  EXPECT_EQ(bpe_->name(), "llama3");
  EXPECT_EQ(bpe_->vocab_size(), 128256);
  EXPECT_EQ(bpe_->bos_id(), 128000);
  EXPECT_EQ(bpe_->eot_id(), 128001);
}

// Ids as npm's llama3-tokenizer-js@1.2.0 gives them (node, encode(text, {bos: false,
// eos: false, specialTokenRegex: /(?!)/g})).
TEST_F(Llama3BpeTest, KnownEncodings) {
  EXPECT_THAT(Ids("Hello world"), ElementsAre(9906, 1917));
  EXPECT_THAT(Ids(" the"), ElementsAre(279));
  EXPECT_THAT(Ids("the"), ElementsAre(1820));
  EXPECT_THAT(Ids("Hello, world!"), ElementsAre(9906, 11, 1917, 0));
  EXPECT_THAT(Ids("It's"), ElementsAre(2181, 596));
  EXPECT_THAT(Ids("I'LL DO IT"), ElementsAre(40, 6, 4178, 9503, 8871));
  EXPECT_THAT(Ids("they're"), ElementsAre(20670, 2351));
  EXPECT_THAT(Ids("12345"), ElementsAre(4513, 1774));  // digits in threes
  EXPECT_THAT(Ids("1234567"), ElementsAre(4513, 10961, 22));
  EXPECT_THAT(Ids("1,000,000"), ElementsAre(16, 11, 931, 11, 931));
  EXPECT_THAT(Ids("  spaces"), ElementsAre(220, 12908));
  EXPECT_THAT(Ids("   indented"), ElementsAre(256, 1280, 16243));
  EXPECT_THAT(Ids("a\n\nb"), ElementsAre(64, 271, 65));
  EXPECT_THAT(Ids("foo.\nbar"), ElementsAre(8134, 627, 2308));  // ".\n" is one pre-token
  EXPECT_THAT(Ids("x = 1;\n\n"), ElementsAre(87, 284, 220, 16, 401));
  EXPECT_THAT(Ids(" \t\n"), ElementsAre(17934));
  EXPECT_THAT(Ids("h\xC3\xA9llo"), ElementsAre(71, 19010, 385));                        // héllo
  EXPECT_THAT(Ids("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"),  // 日本語
              ElementsAre(102433, 102158));
  EXPECT_THAT(Ids("\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD"),                                  // 👍🏽
              ElementsAre(9468, 239, 235, 9468, 237, 121));
  EXPECT_THAT(Ids("\xD9\xA3\xD9\xA4\xD9\xA5\xD9\xA6"),  // Arabic-Indic ٣٤٥٦
              ElementsAre(117413, 124079, 124043, 149, 99));
  // Special tokens' text is ordinary text.
  EXPECT_THAT(Ids("<|begin_of_text|>"), ElementsAre(27, 91, 7413, 3659, 4424, 91, 29));
  EXPECT_THAT(Ids("<|eot_id|>"), ElementsAre(27, 91, 68, 354, 851, 91, 29));
}

TEST_F(Llama3BpeTest, SpecialIdsDecodeToTheirText) {
  EXPECT_THAT(bpe_->Decode({128000}), IsOkAndHolds(std::string("<|begin_of_text|>")));
  EXPECT_THAT(bpe_->Decode({128001}), IsOkAndHolds(std::string("<|end_of_text|>")));
  EXPECT_THAT(bpe_->Decode({128006, 128007, 128009}),
              IsOkAndHolds(std::string("<|start_header_id|><|end_header_id|><|eot_id|>")));
  EXPECT_THAT(bpe_->Decode({128255}), IsOkAndHolds(std::string("<|reserved_special_token_247|>")));
  // From the package's own tests: "<|begin_of_text|>This is a test sentence.<|end_of_text|>".
  EXPECT_THAT(bpe_->Decode({128000, 2028, 374, 264, 1296, 11914, 13, 128001}),
              IsOkAndHolds(
                  std::string("<|begin_of_text|>This is a test sentence.<|end_of_text|>")));
  EXPECT_THAT(bpe_->Decode({9906, 128256}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("token id 128256"), HasSubstr("position 1"),
                             HasSubstr("llama3 vocabulary (ids 0..128255)"))));
  EXPECT_THAT(bpe_->Decode({-1}), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(Llama3BpeTest, DecodeOfEncodeGivesTheBytesBack) {
  std::vector<std::string> texts = pt::AnyBytesTexts();
  texts.push_back("<|begin_of_text|><|end_of_text|><|eot_id|>");
  texts.push_back(std::string(100000, '7'));              // digits in threes
  texts.push_back(std::string(30000, '!') + "\r\n\r\n");  // punctuation with its newlines
  // Never a special id among the ids.
  pt::ExpectDecodeOfEncodeGivesTheBytesBack(*bpe_, texts, 128000);
}

TEST_F(Llama3BpeTest, PreTokensFollowLlama3sPattern) {
  auto pieces = bpe_->PreTokenize("Hello, world! It's  3.14159\xFF\xFEok \n\nfoo.\nbar\r\n\r\n  x");
  ASSERT_THAT(pieces, IsOk());
  // As JavaScript's matchAll of the same pattern splits the valid parts.
  EXPECT_THAT(*pieces, ElementsAre("Hello", ",", " world", "!", " It", "'s", " ", " ", "3", ".",
                                   "141", "59", "\xFF\xFE", "ok", " \n\n", "foo", ".\n", "bar",
                                   "\r\n\r\n", " ", " x"));
}

// A text of many line shapes: prose, indentation, blank and whitespace-only lines,
// trailing spaces and tabs, CRLF, digit runs, punctuation runs before newlines,
// contractions in any case, other scripts, emoji, special tokens' text, invalid bytes.
std::string ManyLineShapes(size_t bytes, uint32_t seed) {
  const std::vector<std::string> pieces = {
      "the", "The", "pipeline", " ", "  ", "   ", "\t", "\n", "\n\n", " \n", "\t\n", "\r\n",
      "\r", "It's", "'ll", "'S", "'RE", "123", "4.5", "1,000", "1234567", ",", ".", "...", "!?",
      ".\n", "!\n\n", "--", "(x)", "{", "}", "//", "#", "caf\xC3\xA9", "\xE6\x97\xA5\xE6\x9C\xAC",
      "\xD0\x9C\xD0\xBE\xD1\x81", "\xF0\x9F\x91\x8D", "\xC2\xA0", "\xE3\x80\x80", "    ",
      "        return x;", "a", "I", "x_1", "<|eot_id|>", "\xD9\xA3\xD9\xA4", "\xFF"};
  return pt::MixOfPieces(pieces, bytes, seed);
}

TEST_F(Llama3BpeTest, SafeSplitsLeaveEveryPreTokenUnchanged) {
  pt::ExpectSafeSplitsLeaveEveryPreTokenUnchanged(*bpe_, ManyLineShapes(6000, 1), 50);
  EXPECT_EQ(bpe_->NextSafeSplit("ab.\ncd", 1), 4u);  // after the newline of ".\n"
  EXPECT_EQ(bpe_->NextSafeSplit("ab cd", 1), 2u);    // before the space
  EXPECT_EQ(bpe_->NextSafeSplit("12 34", 1), 2u);
  EXPECT_EQ(bpe_->NextSafeSplit("ab\n\ncd", 1), 6u);  // a newline run: no
}

TEST_F(Llama3BpeTest, ParallelEqualsSerial) {
  pt::ExpectParallelEqualsSerial(*bpe_, ManyLineShapes(2 << 20, 2));
}

}  // namespace
}  // namespace pipetrain::data
