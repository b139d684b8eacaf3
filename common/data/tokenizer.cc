#include "common/data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/data/gpt2_bpe.h"
#include "common/status_macros.h"

namespace pipetrain::data {
namespace {

constexpr char kDefaultTokenizerDir[] = "/usr/local/share/pipetrain/gpt2";
constexpr int kPartsPerThread = 4;

// A token is a byte: the model's vocabulary is 256 and any text encodes.
class ByteTokenizer final : public Tokenizer {
 public:
  absl::string_view name() const override { return "bytes"; }
  int32_t vocab_size() const override { return 256; }
  std::optional<int32_t> eot_id() const override { return std::nullopt; }

  absl::Status EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const override {
    ids->reserve(ids->size() + text.size());
    for (char c : text) ids->push_back(static_cast<uint8_t>(c));
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids) const override {
    std::string bytes;
    bytes.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] > 255) {
        return absl::InvalidArgumentError(
            absl::StrCat("token id ", ids[i], " (at position ", i,
                         ") is not a byte (the bytes tokenizer has ids 0..255)"));
      }
      bytes += static_cast<char>(ids[i]);
    }
    return bytes;
  }

  size_t NextSafeSplit(absl::string_view text, size_t pos) const override {
    return std::min(pos, text.size());
  }
};

}  // namespace

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  RETURN_IF_ERROR(EncodeTo(text, &ids));
  return ids;
}

std::string DefaultTokenizerDir() {
  const char* env = std::getenv("PIPETRAIN_TOKENIZER_DIR");
  return env != nullptr && *env != '\0' ? env : kDefaultTokenizerDir;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(absl::string_view name,
                                                         const std::string& dir) {
  if (name == "bytes") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2") {
    ASSIGN_OR_RETURN(std::unique_ptr<Gpt2Bpe> bpe,
                     Gpt2Bpe::Load(dir.empty() ? DefaultTokenizerDir() : dir));
    return std::unique_ptr<Tokenizer>(std::move(bpe));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tokenizer '", name, "' (known: bytes, gpt2)"));
}

absl::StatusOr<std::vector<int32_t>> EncodeParallel(const Tokenizer& tokenizer,
                                                    absl::string_view text, int threads,
                                                    size_t min_part_bytes) {
  min_part_bytes = std::max<size_t>(min_part_bytes, 1);
  const size_t wanted_parts = std::min<size_t>(
      static_cast<size_t>(std::max(threads, 1)) * kPartsPerThread, text.size() / min_part_bytes);
  if (threads <= 1 || wanted_parts < 2) return tokenizer.Encode(text);

  // Cut points: each part ends at the first safe split after its share of the text.
  std::vector<size_t> cuts = {0};
  const size_t target = text.size() / wanted_parts;
  while (cuts.back() < text.size()) {
    const size_t from = cuts.back() + std::max(target, min_part_bytes);
    cuts.push_back(from >= text.size() ? text.size() : tokenizer.NextSafeSplit(text, from));
  }
  const size_t parts = cuts.size() - 1;
  if (parts < 2) return tokenizer.Encode(text);

  std::vector<std::vector<int32_t>> results(parts);
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  absl::Status first_error;
  auto work = [&] {
    for (size_t i = next++; i < parts; i = next++) {
      absl::Status s = tokenizer.EncodeTo(text.substr(cuts[i], cuts[i + 1] - cuts[i]), &results[i]);
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first_error.ok()) first_error = std::move(s);
      }
    }
  };
  std::vector<std::thread> pool;
  const int workers = static_cast<int>(std::min<size_t>(threads, parts));
  for (int t = 1; t < workers; ++t) pool.emplace_back(work);
  work();  // this thread is one of them
  for (std::thread& t : pool) t.join();
  RETURN_IF_ERROR(first_error);

  size_t total = 0;
  for (const auto& r : results) total += r.size();
  std::vector<int32_t> ids;
  ids.reserve(total);
  for (auto& r : results) {
    ids.insert(ids.end(), r.begin(), r.end());
    std::vector<int32_t>().swap(r);  // free as we go: the peak is ~2x the ids, not more
  }
  return ids;
}

}  // namespace pipetrain::data
