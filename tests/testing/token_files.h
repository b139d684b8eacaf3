// Token files for tests, laid out byte by byte here (little-endian, as llm.c and nanoGPT
// write them) rather than by any writer of the project, so that a reader and a writer
// that agree on a wrong layout cannot both pass; and seeded random token ids.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace pipetrain::testing {

inline void AppendLe(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

// The tokens alone, two bytes each: nanoGPT's train.bin.
inline std::string NanoGptBytes(const std::vector<uint16_t>& tokens) {
  std::string out;
  for (uint16_t t : tokens) AppendLe(out, t, 2);
  return out;
}

// llm.c's layout: 256 int32 (magic, version, count, zeros), then the tokens. The header
// fields can be given wrong on purpose; count < 0 means tokens.size().
inline std::string LlmcBytes(const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                             int32_t version = 1, int64_t count = -1) {
  std::string out;
  AppendLe(out, static_cast<uint32_t>(magic), 4);
  AppendLe(out, static_cast<uint32_t>(version), 4);
  AppendLe(out, static_cast<uint32_t>(count < 0 ? tokens.size() : count), 4);
  for (int i = 3; i < 256; ++i) AppendLe(out, 0, 4);
  return out + NanoGptBytes(tokens);
}

// llm.c's Llama 3 layout: the same header (magic 20240801, version 7 unless given),
// then the tokens as uint32.
inline std::string LlmcBytes32(const std::vector<uint32_t>& tokens, int32_t magic = 20240801,
                               int32_t version = 7, int64_t count = -1) {
  std::string out = LlmcBytes({}, magic, version, count < 0 ? tokens.size() : count);
  for (uint32_t t : tokens) AppendLe(out, t, 4);
  return out;
}

// `n` ids uniform in [0, vocab), the same for the same seed on every machine (the
// engine's sequence is fixed by the standard; the modulo keeps it so).
inline std::vector<uint16_t> RandomTokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint16_t> out(n);
  for (uint16_t& t : out) t = static_cast<uint16_t>(gen() % static_cast<uint32_t>(vocab));
  return out;
}

}  // namespace pipetrain::testing
