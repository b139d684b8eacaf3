#include "common/data/tokenizer.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_join.h"
#include "common/data/gpt2_bpe.h"
#include "common/data/llama3_bpe.h"
#include "common/status_macros.h"

namespace pipetrain::data {
namespace {

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

template <typename Bpe>
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpe(const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<Bpe> bpe, Bpe::Load(dir));
  return std::unique_ptr<Tokenizer>(std::move(bpe));
}

// Every tokenizer: a new one is a row here and its own file.
struct TokenizerEntry {
  const char* name;
  const char* env_var;      // overrides default_dir; nullptr for none
  const char* default_dir;  // where deploy/install-deps.sh puts its files; "" for none
  absl::StatusOr<std::unique_ptr<Tokenizer>> (*load)(const std::string& dir);
};

constexpr TokenizerEntry kTokenizers[] = {
    {"bytes", nullptr, "",
     [](const std::string&) -> absl::StatusOr<std::unique_ptr<Tokenizer>> {
       return std::make_unique<ByteTokenizer>();
     }},
    {"gpt2", "PIPETRAIN_TOKENIZER_DIR", "/usr/local/share/pipetrain/gpt2", LoadBpe<Gpt2Bpe>},
    {"llama3", "PIPETRAIN_LLAMA3_TOKENIZER_DIR", "/usr/local/share/pipetrain/llama3",
     LoadBpe<Llama3Bpe>},
};

const TokenizerEntry* FindTokenizer(absl::string_view name) {
  for (const TokenizerEntry& e : kTokenizers) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text) const {
  std::vector<int32_t> ids;
  RETURN_IF_ERROR(EncodeTo(text, &ids));
  return ids;
}

std::string TokenizerNames() {
  return absl::StrJoin(kTokenizers, ", ",
                       [](std::string* out, const TokenizerEntry& e) { out->append(e.name); });
}

bool IsTokenizerName(absl::string_view name) { return FindTokenizer(name) != nullptr; }

std::string DefaultTokenizerDir(absl::string_view name) {
  const TokenizerEntry* e = FindTokenizer(name);
  if (e == nullptr || e->env_var == nullptr) return "";
  const char* env = std::getenv(e->env_var);
  return env != nullptr && *env != '\0' ? env : e->default_dir;
}

std::string DefaultTokenizerDir() { return DefaultTokenizerDir("gpt2"); }

absl::StatusOr<std::unique_ptr<Tokenizer>> MakeTokenizer(absl::string_view name,
                                                         const std::string& dir) {
  const TokenizerEntry* e = FindTokenizer(name);
  if (e == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown tokenizer '", name, "' (known: ", TokenizerNames(), ")"));
  }
  return e->load(dir.empty() ? DefaultTokenizerDir(name) : dir);
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
