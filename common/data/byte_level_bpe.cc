// Encoding and decoding with a loaded byte-level BPE (byte_level_bpe_load.cc reads it).
#include "common/data/byte_level_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <functional>
#include <limits>
#include <queue>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::data {
namespace {

// Words longer than this (in bytes) merge with the heap: the plain loops cost O(n^2),
// which a megabyte of letters without a space would turn into hours. Shorter ones,
// nearly all, are faster with the plain loops.
constexpr size_t kHeapFromSymbols = 64;
// The per-thread cache of pre-token -> ids is dropped when it reaches this many entries
// (tens of MB), so a long stream of new words cannot grow it without bound.
constexpr size_t kMaxCacheEntries = size_t{1} << 18;
constexpr size_t kMaxCachedPieceBytes = 128;  // longer pieces are rare; not worth keeping
// PCRE2's JIT stack: long runs of one class need more than its 32 KiB default. Reserved
// address space, touched only as far as a match needs.
constexpr size_t kJitStackStart = size_t{32} << 10;
constexpr size_t kJitStackMax = size_t{8} << 20;

}  // namespace

struct ByteLevelBpe::Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Regex() { pcre2_code_free(code); }
};

struct ByteLevelBpe::Worker {
  pcre2_match_data* match_data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache;
  std::vector<int32_t> word;  // scratch for one pre-token's symbols
  std::vector<Merge> pairs;   // scratch for MergeLowestFirst

  ~Worker() {
    pcre2_match_data_free(match_data);
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
  }
};

ByteLevelBpe::ByteLevelBpe(const ByteLevelBpeConfig& config) : config_(config) {}

ByteLevelBpe::~ByteLevelBpe() = default;

absl::Status ByteLevelBpe::CompilePattern() {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  auto regex = std::make_unique<Regex>();
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(config_.pattern), PCRE2_ZERO_TERMINATED,
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error,
                              &error_offset, nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::InternalError(absl::StrCat("cannot compile the ", config_.title,
                                            " pattern at offset ", error_offset, ": ",
                                            reinterpret_cast<const char*>(message)));
  }
  // Without a JIT (a platform PCRE2 has none for) the interpreter gives the same matches.
  regex->jit = pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE) == 0;
  regex_ = std::move(regex);
  return absl::OkStatus();
}

const ByteLevelBpe::Merge* ByteLevelBpe::FindMerge(int32_t left, int32_t right) const {
  const auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::unique_ptr<ByteLevelBpe::Worker> ByteLevelBpe::TakeWorker() const {
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

void ByteLevelBpe::ReturnWorker(std::unique_ptr<Worker> worker) const {
  absl::MutexLock lock(&workers_mu_);
  idle_workers_.push_back(std::move(worker));
}

namespace {

// Calls piece(view) for every pre-token of `text` in order: the pattern's matches and
// the runs of invalid UTF-8 it leaves between them.
template <typename Piece>
absl::Status ForEachPreToken(const char* title, pcre2_code* code, bool jit,
                             pcre2_match_data* match_data, pcre2_match_context* context,
                             absl::string_view text, Piece piece) {
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
      return absl::InternalError(absl::StrCat("the ", title, " pre-tokenizer failed at byte ",
                                              offset, ": ",
                                              reinterpret_cast<const char*>(message)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    const size_t begin = ovector[0], end = ovector[1];
    if (end <= begin) {
      return absl::InternalError(
          absl::StrCat("the ", title, " pre-tokenizer matched nothing at byte ", begin));
    }
    if (begin > offset) piece(text.substr(offset, begin - offset));
    piece(text.substr(begin, end - begin));
    offset = end;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<absl::string_view>> ByteLevelBpe::PreTokenize(
    absl::string_view text) const {
  std::unique_ptr<Worker> worker = TakeWorker();
  absl::Cleanup give_back = [&] { ReturnWorker(std::move(worker)); };
  std::vector<absl::string_view> pieces;
  RETURN_IF_ERROR(ForEachPreToken(config_.title, regex_->code, regex_->jit, worker->match_data,
                                  worker->context, text,
                                  [&](absl::string_view p) { pieces.push_back(p); }));
  return pieces;
}

absl::Status ByteLevelBpe::EncodeTo(absl::string_view text, std::vector<int32_t>* ids) const {
  std::unique_ptr<Worker> worker = TakeWorker();
  absl::Cleanup give_back = [&] { ReturnWorker(std::move(worker)); };
  return ForEachPreToken(config_.title, regex_->code, regex_->jit, worker->match_data,
                         worker->context, text,
                         [&](absl::string_view p) { EncodePiece(p, *worker, ids); });
}

void ByteLevelBpe::EncodePiece(absl::string_view piece, Worker& worker,
                               std::vector<int32_t>* ids) const {
  if (piece.size() == 1) {
    ids->push_back(byte_id_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (config_.whole_pre_token_first) {
    if (const auto it = byte_symbols_.find(piece); it != byte_symbols_.end()) {
      ids->push_back(it->second);
      return;
    }
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
  MergeWord(word, worker);
  ids->insert(ids->end(), word.begin(), word.end());
  if (cacheable) {
    if (worker.cache.size() >= kMaxCacheEntries) worker.cache.clear();
    worker.cache.emplace(std::string(piece), word);
  }
}

void ByteLevelBpe::MergeWord(std::vector<int32_t>& word, Worker& worker) const {
  const bool lowest_first = config_.merge_order == MergeOrder::kLowestRankLeftmost;
  if (word.size() >= kHeapFromSymbols && (lowest_first || heap_exact_)) {
    MergeWithHeap(word);
  } else if (lowest_first) {
    MergeLowestFirst(word, worker.pairs);
  } else {
    MergeRounds(word);
  }
}

// OpenAI's loop: while some adjacent pair has a rank, merge every occurrence of the
// lowest-ranked one, left to right.
void ByteLevelBpe::MergeRounds(std::vector<int32_t>& word) const {
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

// One merge at a time: the lowest-ranked pair, the leftmost of equals (what the heap
// does, in O(n^2) without its allocations). pairs[i] is the merge of word[i] and
// word[i + 1], rank kNoRank where there is none.
void ByteLevelBpe::MergeLowestFirst(std::vector<int32_t>& word, std::vector<Merge>& pairs) const {
  constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();
  auto pair_at = [&](size_t i) {
    const Merge* m = FindMerge(word[i], word[i + 1]);
    return m != nullptr ? *m : Merge{kNoRank, 0};
  };
  pairs.clear();
  for (size_t i = 0; i + 1 < word.size(); ++i) pairs.push_back(pair_at(i));
  while (!pairs.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < pairs.size(); ++i) {
      if (pairs[i].rank < pairs[best].rank) best = i;
    }
    if (pairs[best].rank == kNoRank) break;
    word[best] = pairs[best].id;
    word.erase(word.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(best));
    if (best > 0) pairs[best - 1] = pair_at(best - 1);
    if (best < pairs.size()) pairs[best] = pair_at(best);
  }
}

// Lowest rank first, leftmost first, in O(n log n): symbols in a linked list, candidate
// pairs in a heap ordered by (rank, position); a candidate whose symbols have changed is
// skipped. OpenAI's rounds give the same result where heap_exact_.
void ByteLevelBpe::MergeWithHeap(std::vector<int32_t>& word) const {
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

absl::StatusOr<std::string> ByteLevelBpe::Decode(absl::Span<const int32_t> ids) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab_size_ || !id_known_[id]) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " (at position ", i,
                                                     ") is not in the ", config_.name,
                                                     " vocabulary (ids 0..",
                                                     vocab_size_ - 1, ")"));
    }
    bytes += id_bytes_[id];
  }
  return bytes;
}

size_t ByteLevelBpe::NextSafeSplit(absl::string_view text, size_t pos) const {
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
