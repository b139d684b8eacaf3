// Fuzzes GPT-2's byte-level BPE (common/data/gpt2_bpe) with the vocabulary
// deploy/install-deps.sh installs (DefaultTokenizerDir(); without it every input is
// skipped, and tests/fuzz/run.sh does not run this target). Properties that must hold,
// as gpt2_bpe.h and tokenizer.h promise them for any bytes: Decode(Encode(text)) ==
// text; a cut at NextSafeSplit changes no token; EncodeParallel equals Encode. The
// input's bytes read as little-endian 16-bit ids are also decoded (errors are fine).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include "absl/strings/string_view.h"
#include <vector>

#include "common/data/gpt2_bpe.h"
#include "common/data/tokenizer.h"

namespace data = pipetrain::data;

namespace {

const data::Gpt2Bpe* Tokenizer() {
  static const data::Gpt2Bpe* const bpe = []() -> const data::Gpt2Bpe* {
    auto loaded = data::Gpt2Bpe::Load(data::DefaultTokenizerDir());
    if (!loaded.ok()) {
      std::fprintf(stderr, "gpt2_bpe_fuzz: no GPT-2 vocabulary, every input skipped: %s\n",
                   std::string(loaded.status().message()).c_str());
      return nullptr;
    }
    return loaded->release();
  }();
  return bpe;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const data::Gpt2Bpe* bpe = Tokenizer();
  if (bpe == nullptr) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  auto ids = bpe->Encode(text);
  if (!ids.ok()) __builtin_trap();  // any bytes encode
  for (int32_t id : *ids) {
    if (id < 0 || id >= bpe->vocab_size()) __builtin_trap();
  }
  auto decoded = bpe->Decode(*ids);
  if (!decoded.ok() || *decoded != text) __builtin_trap();

  // A cut at the first safe split at or after a position the input picks.
  const size_t pos = size == 0 ? 0 : data[0] % (size + 1);
  const size_t cut = bpe->NextSafeSplit(text, pos);
  if (cut < pos || cut > size) __builtin_trap();
  auto head = bpe->Encode(text.substr(0, cut));
  auto tail = bpe->Encode(text.substr(cut));
  if (!head.ok() || !tail.ok()) __builtin_trap();
  head->insert(head->end(), tail->begin(), tail->end());
  if (*head != *ids) __builtin_trap();

  auto parallel = data::EncodeParallel(*bpe, text, /*threads=*/2, /*min_part_bytes=*/16);
  if (!parallel.ok() || *parallel != *ids) __builtin_trap();

  std::vector<int32_t> raw(size / 2);
  for (size_t i = 0; i < raw.size(); ++i) raw[i] = data[2 * i] | (data[2 * i + 1] << 8);
  (void)bpe->Decode(raw);
  return 0;
}
