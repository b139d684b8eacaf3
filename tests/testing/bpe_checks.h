// Checks that every byte-level BPE passes on its real vocabulary, whatever its pattern
// and merge order: decoding the ids of any bytes gives the bytes back, cutting a text at
// a safe split leaves every pre-token as it was, and parallel encoding equals serial;
// and the texts they run on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/data/byte_level_bpe.h"
#include "common/data/tokenizer.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::testing {

// Texts of any bytes: empty, ASCII, leading and trailing whitespace, other scripts and
// emoji, a NUL, all 256 bytes, invalid UTF-8 (cut sequences, a surrogate, an overlong
// slash), one whitespace and one letter pre-token of 100000 bytes (the letters take the
// heap merge), and a long run of newlines.
inline std::vector<std::string> AnyBytesTexts() {
  std::string all_bytes;
  for (int b = 0; b < 256; ++b) all_bytes += static_cast<char>(b);
  return {
      "",
      "Hello world",
      "  leading and trailing  \n\n\t",
      "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC "
      "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7",
      std::string("nul\0byte", 8),
      all_bytes,
      "\xFF\xFE invalid \xC3 utf-8 \xE6\x97 cut \xF0\x9F\x91",
      "\xED\xA0\x80 a surrogate, \xC0\xAF an overlong slash",
      std::string(100000, ' '),
      std::string(100000, 'x'),
      std::string(50000, '\n') + "end",
  };
}

// `pieces` drawn at random and joined until the text has at least `bytes` bytes; the
// same text for the same seed on every machine.
inline std::string MixOfPieces(const std::vector<std::string>& pieces, size_t bytes,
                               uint32_t seed) {
  std::mt19937 rng(seed);
  std::string text;
  while (text.size() < bytes) text += pieces[rng() % pieces.size()];
  return text;
}

// Decode(Encode(text)) gives every text back, through ids in [0, id_end): ordinary
// tokens only, never a special one.
inline void ExpectDecodeOfEncodeGivesTheBytesBack(const data::Tokenizer& bpe,
                                                  const std::vector<std::string>& texts,
                                                  int32_t id_end) {
  for (const std::string& text : texts) {
    auto ids = bpe.Encode(text);
    ASSERT_THAT(ids, IsOk()) << text.substr(0, 40);
    EXPECT_THAT(bpe.Decode(*ids), IsOkAndHolds(text)) << text.substr(0, 40);
    for (int32_t id : *ids) ASSERT_TRUE(id >= 0 && id < id_end) << id;
  }
}

// At every safe split p of `text` (NextSafeSplit from 1 on), the pre-tokens of
// text[0, p) then of text[p, end) are those of the whole text; there are more than
// `min_splits` such splits.
inline void ExpectSafeSplitsLeaveEveryPreTokenUnchanged(const data::ByteLevelBpe& bpe,
                                                        const std::string& text, int min_splits) {
  auto strings = [](const std::vector<absl::string_view>& views) {
    return std::vector<std::string>(views.begin(), views.end());
  };
  auto whole = bpe.PreTokenize(text);
  ASSERT_THAT(whole, IsOk());
  const std::vector<std::string> expected = strings(*whole);
  int splits = 0;
  for (size_t p = bpe.NextSafeSplit(text, 1); p < text.size(); p = bpe.NextSafeSplit(text, p + 1)) {
    ++splits;
    auto left = bpe.PreTokenize(absl::string_view(text).substr(0, p));
    auto right = bpe.PreTokenize(absl::string_view(text).substr(p));
    ASSERT_THAT(left, IsOk());
    ASSERT_THAT(right, IsOk());
    std::vector<std::string> joined = strings(*left);
    for (std::string& s : strings(*right)) joined.push_back(std::move(s));
    ASSERT_EQ(joined, expected) << "split at " << p << ": ..."
                                << text.substr(p >= 10 ? p - 10 : 0, 20) << "...";
  }
  EXPECT_GT(splits, min_splits);
}

// EncodeParallel on 2, 3, 4 and 8 threads, in parts of 1 KiB and of the default size,
// gives Encode's ids.
inline void ExpectParallelEqualsSerial(const data::Tokenizer& bpe, const std::string& text) {
  auto serial = bpe.Encode(text);
  ASSERT_THAT(serial, IsOk());
  for (int threads : {2, 3, 4, 8}) {
    for (size_t min_part : {size_t{1} << 10, data::kDefaultMinPartBytes}) {
      auto parallel = data::EncodeParallel(bpe, text, threads, min_part);
      ASSERT_THAT(parallel, IsOk());
      ASSERT_EQ(*parallel, *serial) << threads << " threads, parts of " << min_part;
    }
  }
}

}  // namespace pipetrain::testing
