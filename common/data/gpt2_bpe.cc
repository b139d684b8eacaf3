#include "common/data/gpt2_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <limits>
#include <queue>
#include <sstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/user_path.h"
#include "nlohmann/json.hpp"

namespace pipetrain::data {
namespace {

constexpr char kEndOfText[] = "<|endoftext|>";
// Words longer than this (in bytes) merge with the heap: the rounds of OpenAI's loop cost
// O(n^2), which a megabyte of letters without a space would turn into hours. Shorter
// ones, nearly all, are faster with the plain loop.
constexpr size_t kHeapFromSymbols = 64;
// The per-thread cache of pre-token -> ids is dropped when it reaches this many entries
// (tens of MB), so a long stream of new words cannot grow it without bound.
constexpr size_t kMaxCacheEntries = size_t{1} << 18;
constexpr size_t kMaxCachedPieceBytes = 128;  // longer pieces are rare; not worth keeping
// PCRE2's JIT stack: long runs of one class need more than its 32 KiB default. Reserved
// address space, touched only as far as a match needs.
constexpr size_t kJitStackStart = size_t{32} << 10;
constexpr size_t kJitStackMax = size_t{8} << 20;

std::string Utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// The code points of a UTF-8 string; nullopt when it is not valid UTF-8.
std::optional<std::vector<char32_t>> CodePoints(absl::string_view s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    int extra = 0;
    char32_t c = 0;
    if (b < 0x80) {
      c = b;
    } else if ((b & 0xE0) == 0xC0) {
      c = b & 0x1F, extra = 1;
    } else if ((b & 0xF0) == 0xE0) {
      c = b & 0x0F, extra = 2;
    } else if ((b & 0xF8) == 0xF0) {
      c = b & 0x07, extra = 3;
    } else {
      return std::nullopt;
    }
    if (i + extra >= s.size()) return std::nullopt;
    for (int k = 1; k <= extra; ++k) {
      const auto cont = static_cast<uint8_t>(s[i + k]);
      if ((cont & 0xC0) != 0x80) return std::nullopt;
      c = (c << 6) | (cont & 0x3F);
    }
    out.push_back(c);
    i += 1 + extra;
  }
  return out;
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  absl::StatusOr<std::string> text =
      common::ReadRegularFile(path, common::kMaxJsonFileBytes, "GPT-2 vocabulary:");
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat(text.status().message(),
                     "; the GPT-2 vocabulary (encoder.json, vocab.bpe) is installed by "
                     "deploy/install-deps.sh; or pass --tokenizer-dir DIR (or set "
                     "PIPETRAIN_TOKENIZER_DIR)"));
  }
  return text;
}

// Line and column (from 1) of a byte offset, for parse errors.
std::pair<size_t, size_t> LineAndColumn(absl::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  const absl::string_view before = text.substr(0, offset);
  const size_t line = 1 + std::count(before.begin(), before.end(), '\n');
  const size_t last_newline = before.rfind('\n');
  const size_t column =
      last_newline == absl::string_view::npos ? offset + 1 : offset - last_newline;
  return {line, column};
}

// Reads encoder.json ({"symbol": id, ...}) straight into a map, without a JSON tree, and
// keeps the position of a syntax error (the DOM parser without exceptions loses it).
class EncoderSax {
 public:
  using json = nlohmann::json;
  explicit EncoderSax(absl::flat_hash_map<std::string, int32_t>* out) : out_(out) {}

  bool null() { return Wrong("null"); }
  bool boolean(bool) { return Wrong("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (v < 0) return Wrong(absl::StrCat("the negative id ", v));
    return number_unsigned(static_cast<json::number_unsigned_t>(v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (depth_ != 1 || !has_key_) return Wrong("a number outside the top-level object");
    if (v > static_cast<json::number_unsigned_t>(std::numeric_limits<int32_t>::max())) {
      return Wrong(absl::StrCat("the id ", v, ", more than 2^31 - 1"));
    }
    if (!out_->emplace(key_, static_cast<int32_t>(v)).second) {
      return Wrong(absl::StrCat("the symbol '", key_, "' a second time"));
    }
    has_key_ = false;
    return true;
  }
  bool number_float(json::number_float_t, const json::string_t&) { return Wrong("a fraction"); }
  bool string(json::string_t&) { return Wrong("a string where an id belongs"); }
  bool binary(json::binary_t&) { return Wrong("binary data"); }
  bool start_object(size_t) { return ++depth_ == 1 || Wrong("a nested object"); }
  bool end_object() {
    --depth_;
    return true;
  }
  bool start_array(size_t) { return Wrong("an array"); }
  bool end_array() { return true; }
  bool key(json::string_t& k) {
    key_ = k;
    has_key_ = true;
    return true;
  }
  bool parse_error(size_t position, const std::string&, const nlohmann::detail::exception& e) {
    error_position_ = position;
    error_ = e.what();
    return false;
  }

  const std::string& error() const { return error_; }
  size_t error_position() const { return error_position_; }

 private:
  bool Wrong(const std::string& what) {
    error_ = absl::StrCat("expected one object of \"symbol\": id pairs; found ", what,
                          has_key_ ? absl::StrCat(" (at symbol '", key_, "')") : "");
    return false;
  }

  absl::flat_hash_map<std::string, int32_t>* out_;
  int depth_ = 0;
  std::string key_;
  bool has_key_ = false;
  std::string error_;
  size_t error_position_ = std::string::npos;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

const std::array<char32_t, 256>& BytesToUnicode() {
  static const std::array<char32_t, 256> map = [] {
    std::array<char32_t, 256> m{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      m[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return m;
  }();
  return map;
}

std::optional<uint8_t> UnicodeToByte(char32_t c) {
  static const std::array<int16_t, 512> inverse = [] {
    std::array<int16_t, 512> inv;
    inv.fill(-1);
    for (int b = 0; b < 256; ++b) inv[BytesToUnicode()[b]] = static_cast<int16_t>(b);
    return inv;
  }();
  if (c >= inverse.size() || inverse[c] < 0) return std::nullopt;
  return static_cast<uint8_t>(inverse[c]);
}

struct Gpt2Bpe::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Regex() { pcre2_code_free(code); }
};

struct Gpt2Bpe::Worker {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache;
  std::vector<int32_t> word;  // scratch for one pre-token's symbols

  ~Worker() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

Gpt2Bpe::~Gpt2Bpe() = default;

absl::StatusOr<std::unique_ptr<Gpt2Bpe>> Gpt2Bpe::Load(const std::string& dir) {
  std::unique_ptr<Gpt2Bpe> bpe(new Gpt2Bpe());
  const std::string folder = dir.empty() ? "." : dir;
  RETURN_IF_ERROR(bpe->LoadEncoder(folder + "/encoder.json"));
  RETURN_IF_ERROR(bpe->LoadMerges(folder + "/vocab.bpe"));
  bpe->encoder_.clear();  // only loading needs symbols by name

  int error = 0;
  PCRE2_SIZE error_offset = 0;
  auto regex = std::make_unique<Regex>();
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                              &error_offset, nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InternalError(absl::StrCat("cannot compile the GPT-2 pattern at offset ",
                                            error_offset, ": ",
                                            reinterpret_cast<const char*>(message)));
  }
  // Without a JIT (a platform PCRE2 has none for) the interpreter gives the same matches.
  regex->jit = pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE) == 0;
  bpe->regex_ = std::move(regex);
  return bpe;
}

absl::Status Gpt2Bpe::LoadEncoder(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  EncoderSax sax(&encoder_);
  if (!nlohmann::json::sax_parse(text, &sax) || !sax.error().empty()) {
    if (sax.error_position() != std::string::npos) {
      const auto [line, column] = LineAndColumn(text, sax.error_position());
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line, ":", column, ": ", sax.error()));
    }
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", sax.error()));
  }
  if (encoder_.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no symbols"));
  int32_t max_id = 0;
  for (const auto& [symbol, id] : encoder_) max_id = std::max(max_id, id);
  if (max_id == std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": id ", max_id, " is too large"));
  }
  vocab_size_ = max_id + 1;
  id_bytes_.assign(vocab_size_, "");
  id_known_.assign(vocab_size_, false);
  for (const auto& [symbol, id] : encoder_) {
    if (id_known_[id]) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": id ", id, " is given to two symbols, one of them '", symbol, "'"));
    }
    id_known_[id] = true;
    auto code_points = CodePoints(symbol);
    if (!code_points.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": the symbol of id ", id, " is not valid UTF-8"));
    }
    std::string& bytes = id_bytes_[id];
    for (char32_t c : *code_points) {
      const std::optional<uint8_t> b = UnicodeToByte(c);
      if (!b.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: the symbol '%s' (id %d) has U+%04X, which stands for no byte",
                            path, symbol, id, static_cast<uint32_t>(c)));
      }
      bytes += static_cast<char>(*b);
    }
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = encoder_.find(Utf8(BytesToUnicode()[b]));
    if (it == encoder_.end()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: no symbol for the byte 0x%02X ('%s'); a byte-level vocabulary has all 256", path, b,
          Utf8(BytesToUnicode()[b])));
    }
    byte_id_[b] = it->second;
  }
  if (const auto it = encoder_.find(kEndOfText); it != encoder_.end()) eot_id_ = it->second;
  return absl::OkStatus();
}

absl::Status Gpt2Bpe::LoadMerges(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  constexpr int32_t kUnmade = std::numeric_limits<int32_t>::max();
  // The rank of the merge that makes each symbol; the single bytes exist from the start.
  std::vector<int32_t> made_at(vocab_size_, kUnmade);
  for (int32_t id : byte_id_) made_at[id] = -1;
  heap_exact_ = true;
  int32_t rank = 0;
  const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  for (size_t i = 0; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    const size_t number = i + 1;
    if (i == 0 && absl::StartsWith(line, "#version")) continue;
    if (line.empty() && i + 1 == lines.size()) break;  // the newline that ends the file
    const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
    if (parts.size() != 2 || parts[0].empty() || parts[1].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", number, ": expected two symbols separated by one space, got '", line, "'"));
    }
    int32_t ids[2];
    for (int k = 0; k < 2; ++k) {
      const auto it = encoder_.find(parts[k]);
      if (it == encoder_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": the symbol '",
                                                       parts[k], "' is not in encoder.json"));
      }
      ids[k] = it->second;
    }
    const std::string merged = absl::StrCat(parts[0], parts[1]);
    const auto it = encoder_.find(merged);
    if (it == encoder_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": the merged symbol '",
                                                     merged, "' is not in encoder.json"));
    }
    // A pair listed twice keeps its last rank, as OpenAI's dict(zip(merges, ranks)) does.
    auto [slot, inserted] =
        merges_.insert_or_assign(PairKey(ids[0], ids[1]), Merge{rank, it->second});
    if (!inserted || made_at[ids[0]] >= rank || made_at[ids[1]] >= rank ||
        made_at[it->second] != kUnmade) {
      heap_exact_ = false;
    } else {
      made_at[it->second] = rank;
    }
    ++rank;
  }
  return absl::OkStatus();
}

const Gpt2Bpe::Merge* Gpt2Bpe::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::unique_ptr<Gpt2Bpe::Worker> Gpt2Bpe::TakeWorker() const {
  {
    absl::MutexLock lock(&workers_mu_);
    if (!idle_workers_.empty()) {
      std::unique_ptr<Worker> w = std::move(idle_workers_.back());
      idle_workers_.pop_back();
      return w;
    }
  }
  auto w = std::make_unique<Worker>();
  w->match_data = pcre2_match_data_create_from_pattern(regex_->code, nullptr);
  if (regex_->jit) {
    w->context = pcre2_match_context_create(nullptr);
    w->jit_stack = pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr);
    pcre2_jit_stack_assign(w->context, nullptr, w->jit_stack);
  }
  return w;
}

void Gpt2Bpe::ReturnWorker(std::unique_ptr<Worker> worker) const {
  absl::MutexLock lock(&workers_mu_);
  idle_workers_.push_back(std::move(worker));
}

namespace {

// Calls piece(view) for every pre-token of `text` in order: the pattern's matches and
// the runs of invalid UTF-8 it leaves between them.
template <typename Piece>
absl::Status ForEachPreToken(pcre2_code* code, bool jit, pcre2_match_data* match_data,
                             pcre2_match_context* context, absl::string_view text, Piece piece) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t offset = 0;
  while (offset < n) {
    const int rc = jit ? pcre2_jit_match(code, subject, n, offset, 0, match_data, context)
                       : pcre2_match(code, subject, n, offset, 0, match_data, context);
    if (rc == PCRE2_ERROR_NOMATCH) {
      piece(text.substr(offset));
      break;
    }
    if (rc < 0) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(rc, message, sizeof(message));
      return absl::InternalError(absl::StrCat("the GPT-2 pre-tokenizer failed at byte ", offset,
                                              ": ", reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end <= begin) {
      return absl::InternalError(
          absl::StrCat("the GPT-2 pre-tokenizer matched nothing at byte ", begin));
    }
    if (begin > offset) piece(text.substr(offset, begin - offset));
    piece(text.substr(begin, end - begin));
    offset = end;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<absl::string_view>> Gpt2Bpe::PreTokenize(absl::string_view text) const {
  std::unique_ptr<Worker> worker = TakeWorker();
  absl::Cleanup give_back = [&] { ReturnWorker(std::move(worker)); };
  std::vector<absl::string_view> pieces;
  RETURN_IF_ERROR(ForEachPreToken(regex_->code, regex_->jit, worker->match_data, worker->context,
                                  text, [&](absl::string_view p) { pieces.push_back(p); }));
  return pieces;
}

absl::Status Gpt2Bpe::EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const {
  std::unique_ptr<Worker> worker = TakeWorker();
  absl::Cleanup give_back = [&] { ReturnWorker(std::move(worker)); };
  return ForEachPreToken(regex_->code, regex_->jit, worker->match_data, worker->context, text,
                         [&](absl::string_view p) { EncodePiece(p, *worker, ids); });
}

void Gpt2Bpe::EncodePiece(absl::string_view piece, Worker& worker,
                          std::vector<int32_t>* ids) const {
  if (piece.size() == 1) {
    ids->push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  const bool cacheable = piece.size() <= kMaxCachedPieceBytes;
  if (cacheable) {
    if (const auto it = worker.cache.find(piece); it != worker.cache.end()) {
      ids->insert(ids->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int32_t>& word = worker.word;
  word.clear();
  for (char c : piece) word.push_back(byte_id_[static_cast<uint8_t>(c)]);
  if (heap_exact_ && word.size() >= kHeapFromSymbols) {
    MergeWithHeap(word);
  } else {
    MergeSimple(word);
  }
  ids->insert(ids->end(), word.begin(), word.end());
  if (cacheable) {
    if (worker.cache.size() >= kMaxCacheEntries) worker.cache.clear();
    worker.cache.emplace(std::string(piece), word);
  }
}

// OpenAI's loop: while some adjacent pair has a rank, merge every occurrence of the
// lowest-ranked one, left to right.
void Gpt2Bpe::MergeSimple(std::vector<int32_t>& word) const {
  size_t size = word.size();
  while (size > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = size;
    int32_t merged = 0;
    for (size_t i = 0; i + 1 < size; ++i) {
      const Merge* m = FindMerge(word[i], word[i + 1]);
      if (m != nullptr && m->rank < best_rank) {
        best_rank = m->rank;
        best = i;
        merged = m->id;
      }
    }
    if (best == size) break;
    // Ranks are unique per pair, so `best` is the pair's first occurrence.
    const int32_t left = word[best], right = word[best + 1];
    size_t out = best;
    for (size_t i = best; i < size;) {
      if (i + 1 < size && word[i] == left && word[i + 1] == right) {
        word[out++] = merged;
        i += 2;
      } else {
        word[out++] = word[i++];
      }
    }
    size = out;
  }
  word.resize(size);
}

// The same result in O(n log n): symbols in a linked list, candidate pairs in a heap
// ordered by (rank, position); a candidate whose symbols have changed is skipped.
void Gpt2Bpe::MergeWithHeap(std::vector<int32_t>& word) const {
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int32_t prev, next;
  };
  struct Candidate {
    int32_t rank, pos, left, right, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int32_t n = static_cast<int32_t>(word.size());
  std::vector<Symbol> symbols(n);
  for (int32_t i = 0; i < n; ++i) symbols[i] = {word[i], i - 1, i + 1 < n ? i + 1 : -1};
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto consider = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    if (const Merge* m = FindMerge(symbols[pos].id, symbols[next].id)) {
      heap.push({m->rank, pos, symbols[pos].id, symbols[next].id, m->id});
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& s = symbols[c.pos];
    if (s.id != c.left || s.next < 0 || symbols[s.next].id != c.right) continue;
    Symbol& gone = symbols[s.next];
    gone.id = -1;
    s.id = c.merged;
    s.next = gone.next;
    if (s.next >= 0) symbols[s.next].prev = c.pos;
    if (s.prev >= 0) consider(s.prev);
    consider(c.pos);
  }
  word.clear();
  for (int32_t i = 0; i >= 0; i = symbols[i].next) word.push_back(symbols[i].id);
}

absl::StatusOr<std::string> Gpt2Bpe::Decode(absl::Span<const int32_t> ids) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size_ || !id_known_[id]) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " (at position ", i,
                                                     ") is not in the gpt2 vocabulary (ids 0..",
                                                     vocab_size_ - 1, ")"));
    }
    bytes += id_bytes_[id];
  }
  return bytes;
}

size_t Gpt2Bpe::NextSafeSplit(absl::string_view text, size_t pos) const {
  auto graphic = [](char c) { return c > ' ' && c < 0x7F; };
  const size_t n = text.size();
  if (pos == 0) return 0;
  for (size_t p = pos; p < n; ++p) {
    if (text[p - 1] == '\n' && p >= 2 && graphic(text[p - 2]) && graphic(text[p])) return p;
    if (text[p] == ' ' && p + 1 < n && absl::ascii_isalnum(text[p - 1]) &&
        absl::ascii_isalnum(text[p + 1])) {
      return p;
    }
  }
  return n;
}

}  // namespace pipetrain::data
