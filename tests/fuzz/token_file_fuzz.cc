// Fuzzes the token-file reader (common/data/token_file): the bytes, written to a file,
// are opened as llm.c's and as nanoGPT's layout; whatever opens has its vocabulary
// checked and its tokens read back through a TokenDataset of it twice (rows spanning
// the two files). What must hold: the tokens read are the file's, and the dataset's
// size is the files' sum.
#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "common/data/token_file.h"
#include "tests/fuzz/fuzz_temp_file.h"

namespace data = pipetrain::data;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(bytes), size);
  const std::string path = pipetrain::fuzz::WriteTempFile("tokens.bin", input);
  for (data::TokenFormat format : {data::TokenFormat::kLlmc, data::TokenFormat::kNanoGpt}) {
    auto first = data::TokenFile::Open(path, format);
    if (!first.ok()) continue;
    (void)first->CheckVocabulary(50257);
    (void)first->CheckVocabulary(256);
    std::vector<int32_t> tokens(first->size());
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(first->token(i));
    auto second = data::TokenFile::Open(path, format);
    if (!second.ok()) __builtin_trap();
    std::vector<data::TokenFile> files;
    files.push_back(*std::move(first));
    files.push_back(*std::move(second));
    const data::TokenDataset dataset(std::move(files));
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (dataset.size() != 2 * n) __builtin_trap();
    if (n == 0) continue;
    // A row from the middle of the first file into the second.
    const int64_t start = n / 2, len = n;
    std::vector<int32_t> row(len);
    dataset.CopyTokens(start, len, row.data());
    for (int64_t i = 0; i < len; ++i) {
      if (row[i] != tokens[(start + i) % n]) __builtin_trap();
    }
    (void)dataset.CheckVocabulary(50257);
    (void)dataset.Describe();
  }
  return 0;
}
