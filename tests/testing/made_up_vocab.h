// Small made-up byte-level BPE vocabularies, written as encoder.json and vocab.bpe in the
// layout of GPT-2's and Llama 3's files, for testing merging against an independent
// reference; and random merges and words of their alphabet "abc".
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/data/byte_level_bpe.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_files.h"

namespace pipetrain::testing {

// A byte string as the vocabulary files spell it: each byte as its code point of GPT-2's
// byte map, in UTF-8 (the map's code points are all below U+0800).
inline std::string VocabSymbol(absl::string_view bytes) {
  std::string s;
  for (char b : bytes) {
    const char32_t c = data::BytesToUnicode()[static_cast<uint8_t>(b)];
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
  }
  return s;
}

// The 256 bytes (id = the byte), then each merged symbol once, in the order its first
// merge comes, then the special tokens in order.
struct MadeUpVocab {
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes, by rank
  std::vector<std::string> specials;

  std::map<std::string, int32_t> Ids() const {  // raw bytes -> id, specials left out
    std::map<std::string, int32_t> ids;
    for (int b = 0; b < 256; ++b) ids[std::string(1, static_cast<char>(b))] = b;
    for (const auto& [l, r] : merges) ids.emplace(l + r, static_cast<int32_t>(ids.size()));
    return ids;
  }

  // DIR/encoder.json and DIR/vocab.bpe.
  void Write(const std::string& dir) const {
    nlohmann::ordered_json encoder = nlohmann::ordered_json::object();
    for (const auto& [bytes, id] : Ids()) encoder[VocabSymbol(bytes)] = id;
    for (const std::string& s : specials) {
      const auto id = static_cast<int32_t>(encoder.size());
      encoder[s] = id;
    }
    WriteFileOrDie(dir + "/encoder.json", encoder.dump());
    std::string bpe = "#version: 0.2\n";
    for (const auto& [l, r] : merges) {
      absl::StrAppend(&bpe, VocabSymbol(l), " ", VocabSymbol(r), "\n");
    }
    WriteFileOrDie(dir + "/vocab.bpe", bpe);
  }
};

// Merge ranks: a pair of symbols (raw bytes) -> its rank, the lower the sooner merged.
using MergeRanks = std::map<std::pair<std::string, std::string>, int>;

// Whether a random vocabulary makes each merged symbol once (as GPT-2's file does) or may
// make one in several ways (Llama 3's file lists a merge for every way to cut a token in
// two).
enum class MergesPerSymbol { kOne, kSeveral };

// `count` merges drawn from rng as BPE training makes them: each joins two symbols that
// exist already (the letters "a", "b", "c" at first), of at most 10 bytes together; a
// pair is merged once.
inline std::vector<std::pair<std::string, std::string>> RandomMerges(std::mt19937& rng,
                                                                     size_t count,
                                                                     MergesPerSymbol per_symbol) {
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<std::string> symbols = {"a", "b", "c"};
  std::set<std::string> known(symbols.begin(), symbols.end());
  std::set<std::pair<std::string, std::string>> pairs;
  while (merges.size() < count) {
    const std::string& l = symbols[rng() % symbols.size()];
    const std::string& r = symbols[rng() % symbols.size()];
    if (l.size() + r.size() > 10 || pairs.count({l, r}) > 0) continue;
    if (per_symbol == MergesPerSymbol::kOne && known.count(l + r) > 0) continue;
    pairs.insert({l, r});
    merges.emplace_back(l, r);
    if (known.insert(l + r).second) symbols.push_back(l + r);
  }
  return merges;
}

// Each merge's rank: its place in `merges`.
inline MergeRanks RanksOf(const std::vector<std::pair<std::string, std::string>>& merges) {
  MergeRanks ranks;
  for (size_t i = 0; i < merges.size(); ++i) ranks[merges[i]] = static_cast<int>(i);
  return ranks;
}

// A word of 1 to max_length letters of "abc", drawn from rng.
inline std::string RandomAbcWord(std::mt19937& rng, size_t max_length) {
  const size_t length = 1 + rng() % max_length;
  std::string word;
  for (size_t i = 0; i < length; ++i) word += "abc"[rng() % 3];
  return word;
}

}  // namespace pipetrain::testing
