#include "common/data/token_file.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/user_path.h"

namespace pipetrain::data {
namespace {

// The files are little-endian and read in place; a big-endian host would need a copy.
static_assert(std::endian::native == std::endian::little,
              "token files are read in place as little-endian integers");

absl::Status Invalid(const std::string& path, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("'", path, "': ", problem));
}

// What a file of `bytes` bytes would hold as raw uint16 tokens, as a hint for a file
// that is not in the format asked for.
std::string NanoGptHint(int64_t bytes) {
  if (bytes % 2 != 0) return "";
  return absl::StrCat("; if it holds raw uint16 tokens (nanoGPT's train.bin, ", bytes / 2,
                      " tokens), set data.format: \"nanogpt\"");
}

// Where a file's tokens are in its mapping and how wide they are.
struct Tokens {
  const char* first;
  int64_t count;
  int token_bytes;
};

// The layout whose magic a header has, nullptr for none.
const LlmcLayout* LayoutOfMagic(int32_t magic) {
  for (const LlmcLayout* layout : {&kLlmcGpt2, &kLlmcLlama3}) {
    if (layout->magic == magic) return layout;
  }
  return nullptr;
}

// The tokens of a mapped file of `bytes` bytes at `base`, after its header.
absl::StatusOr<Tokens> LlmcTokens(const std::string& path, const char* base, int64_t bytes) {
  if (bytes < kLlmcHeaderBytes) {
    return Invalid(path,
                   absl::StrCat("truncated: ", bytes, " bytes, shorter than the ", kLlmcHeaderBytes,
                                "-byte header of an llm.c token file", NanoGptHint(bytes)));
  }
  int32_t header[3];
  std::memcpy(header, base, sizeof(header));
  const LlmcLayout* layout = LayoutOfMagic(header[0]);
  if (layout == nullptr) {
    return Invalid(path, absl::StrCat("wrong magic ", header[0], ": an llm.c token file starts ",
                                      "with ", kLlmcGpt2.magic, " (", kLlmcGpt2.contents, ") or ",
                                      kLlmcLlama3.magic, " (", kLlmcLlama3.contents, ")",
                                      NanoGptHint(bytes)));
  }
  if (header[1] != layout->version) {
    return Invalid(path, absl::StrCat("llm.c header version ", header[1], ", expected ",
                                      layout->version, " (magic ", layout->magic, ": ",
                                      layout->contents, ")"));
  }
  const int64_t count = header[2], width = layout->token_bytes;
  const int64_t room = (bytes - kLlmcHeaderBytes) / width;  // whole tokens after the header
  const int64_t left_over = (bytes - kLlmcHeaderBytes) % width;
  const int64_t expected = kLlmcHeaderBytes + width * count;
  if (count < 0) {
    return Invalid(path, absl::StrCat("the header's token count is ", count, " (negative)"));
  }
  if (bytes < expected) {
    return Invalid(path, absl::StrCat("truncated: the header says ", count, " tokens (", expected,
                                      " bytes with the header) but the file has ", bytes,
                                      " bytes, room for ", room, " tokens"));
  }
  if (bytes > expected) {
    return Invalid(path, absl::StrCat("the header says ", count, " tokens but the file's ", bytes,
                                      " bytes hold ", room, " tokens",
                                      left_over == 1   ? " and an odd byte"
                                      : left_over > 1 ? absl::StrCat(" and ", left_over, " bytes")
                                                      : "",
                                      " after the header (", layout->contents, ")"));
  }
  return Tokens{base + kLlmcHeaderBytes, count, layout->token_bytes};
}

absl::StatusOr<Tokens> NanoGptTokens(const std::string& path, const char* base, int64_t bytes) {
  if (bytes % 2 != 0) {
    return Invalid(path, absl::StrCat(bytes, " bytes, an odd number: a nanoGPT token file is ",
                                      "uint16 tokens of 2 bytes each (truncated?)"));
  }
  int32_t header[2] = {0, 0};
  if (bytes >= 8) std::memcpy(header, base, sizeof(header));
  const LlmcLayout* layout = LayoutOfMagic(header[0]);
  if (layout != nullptr && header[1] == layout->version) {
    // Read raw, an llm.c file would train on its header: refuse rather than guess (raw
    // tokens begin with these two ids by chance once in 2^32 files).
    return Invalid(path, absl::StrCat("starts with llm.c's magic ", layout->magic,
                                      ": it is an llm.c token file; set data.format: \"llmc\""));
  }
  return Tokens{base, bytes / 2, 2};
}

bool HasWildcard(absl::string_view pattern) {
  return pattern.find_first_of("*?[") != absl::string_view::npos;
}

}  // namespace

const LlmcLayout& LlmcLayoutFor(int64_t vocab_size) {
  return vocab_size <= int64_t{0xffff} + 1 ? kLlmcGpt2 : kLlmcLlama3;
}

absl::StatusOr<TokenFormat> ParseTokenFormat(absl::string_view name) {
  if (name == "llmc") return TokenFormat::kLlmc;
  if (name == "nanogpt") return TokenFormat::kNanoGpt;
  return absl::InvalidArgumentError(absl::StrCat(
      "data.format: unknown token file format '", name,
      "'; the formats are \"llmc\" (llm.c's shards with a 1024-byte header, the default) and "
      "\"nanogpt\" (raw uint16, nanoGPT's train.bin)"));
}

absl::string_view TokenFormatName(TokenFormat format) {
  return format == TokenFormat::kLlmc ? "llmc" : "nanogpt";
}

absl::StatusOr<TokenFile> TokenFile::Open(const std::string& path, TokenFormat format) {
  // Stats before opening (a FIFO is never opened) and again on the open descriptor: the
  // size is the file's as opened, not as stat saw it a moment before.
  absl::StatusOr<common::ReadOnlyFile> opened =
      common::OpenRegularFile(path, common::kMaxTokenFileBytes, "token file");
  // A missing file is a bad spec like any other: INVALID_ARGUMENT, naming it.
  if (!opened.ok()) return absl::InvalidArgumentError(opened.status().message());
  const int64_t bytes = opened->size();
  void* mapping = nullptr;
  if (bytes > 0) {
    mapping = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ, MAP_PRIVATE, opened->fd(), 0);
    if (mapping == MAP_FAILED) {
      return Invalid(path, absl::StrCat("cannot map it: ", std::strerror(errno)));
    }
  }
  *opened = common::ReadOnlyFile();  // closed: the mapping keeps the file
  // Owns the mapping from here on, so every error below unmaps it.
  TokenFile file(path, mapping, static_cast<size_t>(bytes));
  static const char kEmpty[1] = {0};
  const char* base = mapping != nullptr ? static_cast<const char*>(mapping) : kEmpty;
  ASSIGN_OR_RETURN(const Tokens tokens, format == TokenFormat::kLlmc
                                            ? LlmcTokens(path, base, bytes)
                                            : NanoGptTokens(path, base, bytes));
  file.tokens_ = tokens.first;
  file.size_ = tokens.count;
  file.token_bytes_ = tokens.token_bytes;
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      token_bytes_(other.token_bytes_) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    size_ = std::exchange(other.size_, 0);
    token_bytes_ = other.token_bytes_;
  }
  return *this;
}

TokenFile::~TokenFile() { Unmap(); }

void TokenFile::Unmap() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
  mapping_ = nullptr;
  mapped_bytes_ = 0;
  tokens_ = nullptr;
  size_ = 0;
}

uint32_t TokenFile::token(int64_t i) const {
  if (token_bytes_ == 2) {
    uint16_t id;
    std::memcpy(&id, tokens_ + 2 * i, 2);
    return id;
  }
  uint32_t id;
  std::memcpy(&id, tokens_ + 4 * i, 4);
  return id;
}

void TokenFile::CopyTokens(int64_t start, int64_t n, int32_t* out) const {
  // Typed copies of the whole range: the compiler widens these loops in vector registers.
  if (token_bytes_ == 2) {
    const auto* ids = reinterpret_cast<const uint16_t*>(tokens_) + start;
    std::copy(ids, ids + n, out);
  } else {
    const auto* ids = reinterpret_cast<const uint32_t*>(tokens_) + start;
    std::transform(ids, ids + n, out, [](uint32_t id) { return static_cast<int32_t>(id); });
  }
}

absl::Status TokenFile::CheckVocabulary(int vocab_size) const {
  // Every uint16 id is below a vocabulary of more than 65535.
  if (token_bytes_ == 2 && vocab_size > 0xffff) return absl::OkStatus();
  for (int64_t i = 0; i < size_; ++i) {
    const uint32_t id = token(i);
    if (id < static_cast<uint32_t>(vocab_size)) continue;
    return Invalid(path_, absl::StrCat("token ", i, " is ", id,
                                       ", at or above model.vocab_size = ", vocab_size,
                                       " (GPT-2's BPE has 50257 ids, Llama 3's 128256)"));
  }
  return absl::OkStatus();
}

TokenDataset::TokenDataset(std::vector<TokenFile> files) : files_(std::move(files)) {
  for (const TokenFile& f : files_) starts_.push_back(starts_.back() + f.size());
}

absl::StatusOr<TokenDataset> TokenDataset::Open(const std::vector<std::string>& paths,
                                                TokenFormat format) {
  std::vector<TokenFile> files;
  files.reserve(paths.size());
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(path, format));
    files.push_back(std::move(file));
  }
  return TokenDataset(std::move(files));
}

void TokenDataset::CopyTokens(int64_t start, int64_t n, int32_t* out) const {
  // The file holding `start`: the last one that starts at or before it (empty files
  // start where the next does and are passed over).
  size_t f = std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1;
  while (n > 0) {
    const int64_t at = start - starts_[f];
    const int64_t take = std::min<int64_t>(n, files_[f].size() - at);
    files_[f].CopyTokens(at, take, out);
    out += take;
    start += take;
    n -= take;
    ++f;
  }
}

absl::Status TokenDataset::CheckVocabulary(int vocab_size) const {
  for (const TokenFile& f : files_) RETURN_IF_ERROR(f.CheckVocabulary(vocab_size));
  return absl::OkStatus();
}

std::string TokenDataset::Describe() const {
  if (files_.empty()) return "no files";
  if (files_.size() == 1) return absl::StrCat("'", files_[0].path(), "'");
  return absl::StrCat("the ", files_.size(), " files '", files_.front().path(), "' ... '",
                      files_.back().path(), "'");
}

absl::StatusOr<std::vector<std::string>> ExpandTokenPaths(
    const std::vector<std::string>& patterns) {
  std::vector<std::string> paths;
  for (const std::string& pattern : patterns) {
    if (!HasWildcard(pattern)) {
      paths.push_back(pattern);
      continue;
    }
    glob_t matches;
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &matches);
    std::vector<std::string> found;
    if (rc == 0) found.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
    ::globfree(&matches);
    if (rc == GLOB_NOMATCH || (rc == 0 && found.empty())) {
      return absl::InvalidArgumentError(
          absl::StrCat("pattern '", pattern, "' matches no file on the coordinator's machine"));
    }
    if (rc != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pattern '", pattern,
          "': ", rc == GLOB_ABORTED ? "a folder of it cannot be read" : "glob(3) failed"));
    }
    // glob(3) sorts by the locale's collation; byte order is the same on every machine.
    std::sort(found.begin(), found.end());
    paths.insert(paths.end(), found.begin(), found.end());
  }
  return paths;
}

}  // namespace pipetrain::data
