// The GPT-2 BPE tokenizer: the byte map, merging by rank against an independent
// reference of OpenAI's loop (on small made-up vocabularies, through both merge paths),
// loading errors that name the file and line, and on the real vocabulary (skipped where
// deploy/install-deps.sh has not put it): known ids, round trips of any bytes, and
// parallel encoding equal to serial on a long text of many line shapes.
#include "common/data/gpt2_bpe.h"

#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/gpt2_vocab.h"
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

std::string Utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else {  // the byte map's code points are all below U+0800
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// A byte string as the vocabulary spells it.
std::string Symbol(absl::string_view bytes) {
  std::string s;
  for (char b : bytes) s += Utf8(BytesToUnicode()[static_cast<uint8_t>(b)]);
  return s;
}

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

// A made-up vocabulary: the 256 bytes (id = the byte), then one symbol per merge, ranked
// in order; eot, when asked for, after them.
struct MadeUpVocab {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes
  bool with_eot = false;

  std::map<std::string, int32_t> Ids() const {  // raw bytes -> id
    std::map<std::string, int32_t> ids;
    for (int b = 0; b < 256; ++b) ids[std::string(1, static_cast<char>(b))] = b;
    for (const auto& [l, r] : merges) ids.emplace(l + r, static_cast<int32_t>(ids.size()));
    return ids;
  }

  void Write(const std::string& dir) const {
    nlohmann::ordered_json encoder = nlohmann::ordered_json::object();
    for (const auto& [bytes, id] : Ids()) encoder[Symbol(bytes)] = id;
    if (with_eot) encoder["<|endoftext|>"] = Ids().size();
    WriteFileOrDie(dir + "/encoder.json", encoder.dump());
    std::string bpe = "#version: 0.2\n";
    for (const auto& [l, r] : merges) absl::StrAppend(&bpe, Symbol(l), " ", Symbol(r), "\n");
    WriteFileOrDie(dir + "/vocab.bpe", bpe);
  }
};

// OpenAI's bpe() on strings, written independently: while a pair has a rank, merge every
// occurrence of the lowest-ranked one, left to right.
std::vector<std::string> ReferenceBpe(
    const std::string& word, const std::map<std::pair<std::string, std::string>, int>& ranks) {
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
  MadeUpVocab vocab;
  vocab.merges = {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}, {" ", "w"}};
  vocab.with_eot = true;
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
    MadeUpVocab vocab;
    std::vector<std::string> symbols = {"a", "b", "c"};
    std::set<std::string> known(symbols.begin(), symbols.end());
    std::map<std::pair<std::string, std::string>, int> ranks;
    while (vocab.merges.size() < 40) {
      const std::string& l = symbols[rng() % symbols.size()];
      const std::string& r = symbols[rng() % symbols.size()];
      if (l.size() + r.size() > 10 || known.count(l + r) > 0) continue;
      ranks[{l, r}] = static_cast<int>(vocab.merges.size());
      vocab.merges.emplace_back(l, r);
      known.insert(l + r);
      symbols.push_back(l + r);
    }
    TempDir dir;
    vocab.Write(dir.path());
    auto bpe = Gpt2Bpe::Load(dir.path());
    ASSERT_THAT(bpe, IsOk());
    const auto ids = vocab.Ids();
    for (int w = 0; w < 300; ++w) {
      const size_t length = 1 + rng() % (w % 2 == 0 ? 20 : 400);
      std::string word;
      for (size_t i = 0; i < length; ++i) word += "abc"[rng() % 3];
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
  MadeUpVocab().Write(dir.path());
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
    MadeUpVocab good;
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
class Gpt2BpeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!pipetrain::testing::Gpt2VocabMissing().empty()) return;
    auto loaded = Gpt2Bpe::Load(DefaultTokenizerDir());
    ASSERT_THAT(loaded, IsOk());
    bpe_ = loaded->release();
  }
  static void TearDownTestSuite() {
    delete bpe_;
    bpe_ = nullptr;
  }
  void SetUp() override {
    if (bpe_ == nullptr) GTEST_SKIP() << pipetrain::testing::Gpt2VocabMissing();
  }
  static std::vector<int32_t> Ids(absl::string_view text) {
    auto ids = bpe_->Encode(text);
    EXPECT_THAT(ids, IsOk());
    return ids.ok() ? *ids : std::vector<int32_t>{};
  }

  static Gpt2Bpe* bpe_;
};
Gpt2Bpe* Gpt2BpeTest::bpe_ = nullptr;

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
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  const std::vector<std::string> texts = {
      "",
      "Hello world",
      "  leading and trailing  \n\n\t",
      "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC "
      "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
      std::string("nul\0byte", 8),
      all_bytes,
      "\xFF\xFE invalid \xC3 utf-8 \xE6\x97 cut \xF0\x9F\x91",  // invalid sequences kept
      "\xED\xA0\x80 a surrogate, \xC0\xAF an overlong slash",
      std::string(100000, ' '),  // one whitespace pre-token
      std::string(100000, 'x'),  // one letter pre-token: the heap merge
      std::string(50000, '\n') + "end",
  };
  for (const std::string& text : texts) {
    auto ids = bpe_->Encode(text);
    ASSERT_THAT(ids, IsOk()) << text.substr(0, 40);
    EXPECT_THAT(bpe_->Decode(*ids), IsOkAndHolds(text)) << text.substr(0, 40);
    for (int32_t id : *ids) ASSERT_TRUE(id >= 0 && id < 50256) << id;
  }
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
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) text += pieces[rng() % pieces.size()];
  return text;
}

TEST_F(Gpt2BpeTest, SafeSplitsLeaveEveryPreTokenUnchanged) {
  const std::string text = ManyLineShapes(6000, 1);
  auto whole = bpe_->PreTokenize(text);
  ASSERT_THAT(whole, IsOk());
  auto strings = [](const std::vector<absl::string_view>& views) {
    std::vector<std::string> out;
    for (absl::string_view v : views) out.emplace_back(v);
    return out;
  };
  const std::vector<std::string> expected = strings(*whole);
  int splits = 0;
  for (size_t p = bpe_->NextSafeSplit(text, 1); p < text.size();
       p = bpe_->NextSafeSplit(text, p + 1)) {
    ++splits;
    auto left = bpe_->PreTokenize(absl::string_view(text).substr(0, p));
    auto right = bpe_->PreTokenize(absl::string_view(text).substr(p));
    ASSERT_THAT(left, IsOk());
    ASSERT_THAT(right, IsOk());
    std::vector<std::string> joined = strings(*left);
    for (std::string& s : strings(*right)) joined.push_back(std::move(s));
    ASSERT_EQ(joined, expected) << "split at " << p << ": ..."
                                << text.substr(p >= 10 ? p - 10 : 0, 20) << "...";
  }
  EXPECT_GT(splits, 50);
  EXPECT_EQ(bpe_->NextSafeSplit("\n\n\n   \t\t", 1), 8u);  // none: the end
  EXPECT_EQ(bpe_->NextSafeSplit("ab\ncd", 1), 3u);         // after the newline
  EXPECT_EQ(bpe_->NextSafeSplit("ab cd", 1), 2u);          // before the space
  EXPECT_EQ(bpe_->NextSafeSplit("ab  cd", 1), 6u);         // two spaces: no
}

TEST_F(Gpt2BpeTest, ParallelEqualsSerial) {
  const std::string text = ManyLineShapes(2 << 20, 2);
  auto serial = bpe_->Encode(text);
  ASSERT_THAT(serial, IsOk());
  for (int threads : {2, 3, 4, 8}) {
    for (size_t min_part : {size_t{1} << 10, kDefaultMinPartBytes}) {
      auto parallel = EncodeParallel(*bpe_, text, threads, min_part);
      ASSERT_THAT(parallel, IsOk());
      ASSERT_EQ(*parallel, *serial) << threads << " threads, parts of " << min_part;
    }
  }
}

}  // namespace
}  // namespace pipetrain::data
