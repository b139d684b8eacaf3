// The GPT-2 BPE tokenizer: the byte map, merging by rank against an independent
// reference of OpenAI's loop (on small made-up vocabularies, through both merge paths),
// loading errors that name the file and line, and on the real vocabulary (skipped where
// deploy/install-deps.sh has not put it): known ids, round trips of any bytes, and
// parallel encoding equal to serial on a long text of many line shapes.
#include "common/data/gpt2_bpe.h"

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/bpe_checks.h"
#include "tests/testing/gpt2_vocab.h"
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
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

namespace pt = ::pipetrain::testing;  // the helpers of tests/testing/

TEST(BytesToUnicodeTest, IsABijectionOntoPrintableCharacters) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    const char32_t c = BytesToUnicode()[b];
    EXPECT_TRUE(seen.insert(c).second) << "byte " << b;
    EXPECT_EQ(UnicodeToByte(c), static_cast<uint8_t>(b)) << "byte " << b;
    EXPECT_GT(c, U' ') << "byte " << b << " must not map to a space or control character";
  }
  // Printable ASCII stands for itself; space, newline and NUL move above U+0100.
  EXPECT_EQ(BytesToUnicode()['A'], U'A');
  EXPECT_EQ(BytesToUnicode()['~'], U'~');
  EXPECT_EQ(BytesToUnicode()[' '], U'\u0120');   // Ġ
  EXPECT_EQ(BytesToUnicode()['\n'], U'\u010A');  // Ċ
  EXPECT_EQ(BytesToUnicode()[0], U'\u0100');
  EXPECT_EQ(BytesToUnicode()[0xAD], U'\u0143');  // the soft hyphen, the last one moved
  EXPECT_EQ(UnicodeToByte(U'\u0144'), std::nullopt);
  EXPECT_EQ(UnicodeToByte(U' '), std::nullopt);
}

// OpenAI's bpe() on strings, written independently: while a pair has a rank, merge every
// occurrence of the lowest-ranked one, left to right.
std::vector<std::string> ReferenceBpe(const std::string& word, const pt::MergeRanks& ranks) {
  std::vector<std::string> symbols;
  for (char c : word) symbols.emplace_back(1, c);
  while (symbols.size() > 1) {
    int best = -1;
    std::pair<std::string, std::string> pair;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = ranks.find({symbols[i], symbols[i + 1]});
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        pair = it->first;
      }
    }
    if (best < 0) break;
    std::vector<std::string> merged;
    for (size_t i = 0; i < symbols.size();) {
      if (i + 1 < symbols.size() && symbols[i] == pair.first && symbols[i + 1] == pair.second) {
        merged.push_back(pair.first + pair.second);
        i += 2;
      } else {
        merged.push_back(symbols[i++]);
      }
    }
    symbols = std::move(merged);
  }
  return symbols;
}

TEST(Gpt2BpeMadeUpTest, MergesByRankAndDecodesBack) {
  TempDir dir;
  pt::MadeUpVocab vocab;
  vocab.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}};
  vocab.specials = {"<|endoftext|>"};
  vocab.Write(dir.path());
  auto bpe = Gpt2Bpe::Load(dir.path());
  ASSERT_THAT(bpe, IsOk());
  EXPECT_EQ((*bpe)->vocab_size(), 262);
  EXPECT_EQ((*bpe)->eot_id(), 261);
  // "hello" -> he ll o -> hell o -> hello; " world" -> Ġw o r l d.
  EXPECT_THAT((*bpe)->Encode("hello world"),
              IsOkAndHolds(ElementsAre(259, 260, 'o', 'r', 'l', 'd')));
  EXPECT_THAT((*bpe)->Encode(""), IsOkAndHolds(ElementsAre()));
  EXPECT_THAT((*bpe)->Decode({259, 260, 'o', 'r', 'l', 'd', 261}),
              IsOkAndHolds(std::string("hello world<|endoftext|>")));
  EXPECT_THAT((*bpe)->Decode({259, 262}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id 262")));
  EXPECT_THAT((*bpe)->Decode({-1}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token id -1")));
}

// Random vocabularies made as BPE training makes them (each merge joins two symbols that
// exist already), so both the plain loop (short words) and the heap (64 bytes or more)
// run; every word's ids must equal the reference's.
TEST(Gpt2BpeMadeUpTest, EqualsTheReferenceOnShortAndLongWords) {
  std::mt19937 rng(7);
  for (int v = 0; v < 8; ++v) {
    pt::MadeUpVocab vocab;
    vocab.merges = pt::RandomMerges(rng, 40, pt::MergesPerSymbol::kOne);
    const pt::MergeRanks ranks = pt::RanksOf(vocab.merges);
    TempDir dir;
    vocab.Write(dir.path());
    auto bpe = Gpt2Bpe::Load(dir.path());
    ASSERT_THAT(bpe, IsOk());
    const auto ids = vocab.Ids();
    for (int w = 0; w < 300; ++w) {
      const std::string word = pt::RandomAbcWord(rng, w % 2 == 0 ? 20 : 400);
      std::vector<int32_t> expected;
      for (const std::string& s : ReferenceBpe(word, ranks)) expected.push_back(ids.at(s));
      ASSERT_THAT((*bpe)->Encode(word), IsOkAndHolds(ElementsAreArray(expected)))
          << "vocabulary " << v << ", word " << word;
    }
  }
}

TEST(Gpt2BpeLoadTest, MissingFilesNameThePathAndTheWayToGetThem) {
  TempDir dir;
  EXPECT_THAT(Gpt2Bpe::Load(dir.File("nowhere")),
              StatusIs(absl::StatusCode::kNotFound,
                       ::testing::AllOf(HasSubstr(dir.File("nowhere/encoder.json")),
                                        HasSubstr("deploy/install-deps.sh"),
                                        HasSubstr("--tokenizer-dir"))));
  pt::MadeUpVocab().Write(dir.path());
  std::remove(dir.File("vocab.bpe").c_str());
  EXPECT_THAT(Gpt2Bpe::Load(dir.path()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(dir.File("vocab.bpe"))));
}

TEST(Gpt2BpeLoadTest, MalformedFilesNameTheFileAndLine) {
  struct Case {
    std::string encoder_json;  // empty: a good one
    std::string vocab_bpe;     // empty: a good one
    std::string message;
  };
  TempDir dir;
  const std::string encoder = dir.File("encoder.json"), merges = dir.File("vocab.bpe");
  const std::vector<Case> cases = {
      {"{\n\"a\": 1,,\n}", "", encoder + ":2:"},
      {"{\"a\": [1]}", "", "found an array"},
      {"{\"a\": 1, \"b\": 1}", "", "id 1 is given to two symbols"},
      {"{\"a\": 0}", "", "no symbol for the byte 0x00"},
      {"{\"a b\": 0}", "", "U+0020, which stands for no byte"},
      {"", "#version: 0.2\nh e\nbad\n", merges + ":3: expected two symbols"},
      {"", "#version: 0.2\nh zz\n", merges + ":2: the symbol 'zz' is not in encoder.json"},
      {"", "#version: 0.2\nx y\n", merges + ":2: the merged symbol 'xy' is not in encoder.json"},
  };
  for (const Case& c : cases) {
    pt::MadeUpVocab good;
    good.merges = {{"h", "e"}};
    good.Write(dir.path());
    if (!c.encoder_json.empty()) WriteFileOrDie(encoder, c.encoder_json);
    if (!c.vocab_bpe.empty()) WriteFileOrDie(merges, c.vocab_bpe);
    EXPECT_THAT(Gpt2Bpe::Load(dir.path()),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message)))
        << c.encoder_json << c.vocab_bpe;
  }
}

// The real vocabulary, loaded once.
constexpr char kGpt2[] = "gpt2";
class Gpt2BpeTest : public pt::LoadedBpeTest<Gpt2Bpe, kGpt2, pt::Gpt2VocabMissing> {};

TEST_F(Gpt2BpeTest, VocabularyFigures) {
  EXPECT_EQ(bpe_->name(), "gpt2");
  EXPECT_EQ(bpe_->vocab_size(), 50257);
  EXPECT_EQ(bpe_->eot_id(), 50256);
}

// Ids as npm's gpt-3-encoder@1.1.4 gives them (node, encode()).
TEST_F(Gpt2BpeTest, KnownEncodings) {
  EXPECT_THAT(Ids("Hello world"), ElementsAre(15496, 995));
  EXPECT_THAT(Ids(" the"), ElementsAre(262));
  EXPECT_THAT(Ids("the"), ElementsAre(1169));
  EXPECT_THAT(Ids("Hello, world!"), ElementsAre(15496, 11, 995, 0));
  EXPECT_THAT(Ids("It's"), ElementsAre(1026, 338));
  EXPECT_THAT(Ids("  spaces"), ElementsAre(220, 9029));
  EXPECT_THAT(Ids("a\n\nb"), ElementsAre(64, 198, 198, 65));
  EXPECT_THAT(Ids("12345"), ElementsAre(10163, 2231));
  EXPECT_THAT(Ids("h\xC3\xA9llo"), ElementsAre(71, 2634, 18798));  // héllo
  EXPECT_THAT(Ids("\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E"),         // 日本語
              ElementsAre(33768, 98, 17312, 105, 45739, 252));
  EXPECT_THAT(Ids("\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD"),  // 👍🏽
              ElementsAre(41840, 235, 8582, 237, 121));
  // The end-of-text text is not the end-of-text token.
  EXPECT_THAT(Ids("<|endoftext|>"), ElementsAre(27, 91, 437, 1659, 5239, 91, 29));
  EXPECT_THAT(Ids(" \t\n"), ElementsAre(220, 197, 198));
}

TEST_F(Gpt2BpeTest, DecodeOfEncodeGivesTheBytesBack) {
  pt::ExpectDecodeOfEncodeGivesTheBytesBack(*bpe_, pt::AnyBytesTexts(), 50256);
}

TEST_F(Gpt2BpeTest, PreTokensCoverTheText) {
  auto pieces = bpe_->PreTokenize("Hello, world! It's  3.14\xFF\xFEok \n\n");
  ASSERT_THAT(pieces, IsOk());
  EXPECT_THAT(*pieces, ElementsAre("Hello", ",", " world", "!", " It", "'s", " ", " 3", ".", "14",
                                   "\xFF\xFE", "ok", " \n\n"));
}

TEST_F(Gpt2BpeTest, DecodeRefusesUnknownIds) {
  EXPECT_THAT(bpe_->Decode({15496, 50257}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("token id 50257"), HasSubstr("position 1"))));
  EXPECT_THAT(bpe_->Decode({50256}), IsOkAndHolds(std::string("<|endoftext|>")));
}

// A text of many line shapes: prose, indentation, blank and whitespace-only lines,
// trailing spaces and tabs, CRLF, digits, punctuation runs, other scripts, emoji.
std::string ManyLineShapes(size_t bytes, uint32_t seed) {
  const std::vector<std::string> pieces = {"the",
                                           "The",
                                           "pipeline",
                                           " ",
                                           "  ",
                                           "   ",
                                           "\t",
                                           "\n",
                                           "\n\n",
                                           " \n",
                                           "\t\n",
                                           "\r\n",
                                           "It's",
                                           "'ll",
                                           "'S",
                                           "123",
                                           "4.5",
                                           "1,000",
                                           ",",
                                           ".",
                                           "...",
                                           "!?",
                                           "--",
                                           "(x)",
                                           "{",
                                           "}",
                                           "//",
                                           "#",
                                           "caf\xC3\xA9",
                                           "\xE6\x97\xA5\xE6\x9C\xAC",
                                           "\xD0\x9C\xD0\xBE\xD1\x81",
                                           "\xF0\x9F\x91\x8D",
                                           "\xC2\xA0",
                                           "\xE3\x80\x80",
                                           "    ",
                                           "        return x;",
                                           "a",
                                           "I",
                                           "x_1",
                                           "\xFF"};
  return pt::MixOfPieces(pieces, bytes, seed);
}

TEST_F(Gpt2BpeTest, SafeSplitsLeaveEveryPreTokenUnchanged) {
  pt::ExpectSafeSplitsLeaveEveryPreTokenUnchanged(*bpe_, ManyLineShapes(6000, 1), 50);
  EXPECT_EQ(bpe_->NextSafeSplit("\n\n\n   \t\t", 1), 8u);  // none: the end
  EXPECT_EQ(bpe_->NextSafeSplit("ab\ncd", 1), 3u);         // after the newline
  EXPECT_EQ(bpe_->NextSafeSplit("ab cd", 1), 2u);          // before the space
  EXPECT_EQ(bpe_->NextSafeSplit("ab  cd", 1), 6u);         // two spaces: no
}

TEST_F(Gpt2BpeTest, ParallelEqualsSerial) {
  pt::ExpectParallelEqualsSerial(*bpe_, ManyLineShapes(2 << 20, 2));
}

}  // namespace
}  // namespace pipetrain::data
