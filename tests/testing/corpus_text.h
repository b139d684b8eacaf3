// A small deterministic English-like corpus for end-to-end jobs: the same text on every
// run, long enough for a few batches of short sequences and a held-out tail.
#pragma once

#include <cstdint>
#include <string>

namespace pipetrain::testing {

inline std::string EnglishLikeCorpus(size_t bytes = 60000) {
  const char* words[] = {"the ", "pipeline ", "stage ", "sends ", "a ", "tensor ", "to ",
                         "its ", "neighbour ", "and ", "waits ", "for ", "gradients. "};
  std::string text;
  uint64_t x = 12345;
  while (text.size() < bytes) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    text += words[(x >> 33) % 13];
  }
  return text;
}

}  // namespace pipetrain::testing
