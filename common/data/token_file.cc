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
              "token files are read in place as little-endian uint16");

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

// The tokens of a mapped file of `bytes` bytes at `base`, after its header.
absl::StatusOr<absl::Span<const uint16_t>> LlmcTokens(const std::string& path, const char* base,
                                                      int64_t bytes) {
  if (bytes < kLlmcHeaderBytes) {
    return Invalid(path,
                   absl::StrCat("truncated: ", bytes, " bytes, shorter than the ", kLlmcHeaderBytes,
                                "-byte header of an llm.c token file", NanoGptHint(bytes)));
  }
  int32_t header[3];
  std::memcpy(header, base, sizeof(header));
  if (header[0] != kLlmcMagic) {
    return Invalid(path, absl::StrCat("wrong magic ", header[0], ": an llm.c token file starts ",
                                      "with ", kLlmcMagic, NanoGptHint(bytes)));
  }
  if (header[1] != kLlmcVersion) {
    return Invalid(path, absl::StrCat("llm.c header version ", header[1], ", expected ",
                                      kLlmcVersion, " (uint16 GPT-2 tokens)"));
  }
  const int64_t count = header[2];
  const int64_t room = (bytes - kLlmcHeaderBytes) / 2;  // whole tokens after the header
  const int64_t expected = kLlmcHeaderBytes + 2 * count;
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
                                      " bytes hold ", room,
                                      bytes % 2 != 0 ? " tokens and an odd byte" : " tokens",
                                      " after the header"));
  }
  return absl::Span<const uint16_t>(reinterpret_cast<const uint16_t*>(base + kLlmcHeaderBytes),
                                    static_cast<size_t>(count));
}

absl::StatusOr<absl::Span<const uint16_t>> NanoGptTokens(const std::string& path, const char* base,
                                                         int64_t bytes) {
  if (bytes % 2 != 0) {
    return Invalid(path, absl::StrCat(bytes, " bytes, an odd number: a nanoGPT token file is ",
                                      "uint16 tokens of 2 bytes each (truncated?)"));
  }
  int32_t header[2] = {0, 0};
  if (bytes >= 8) std::memcpy(header, base, sizeof(header));
  if (header[0] == kLlmcMagic && header[1] == kLlmcVersion) {
    // Read raw, an llm.c file would train on its header: refuse rather than guess (raw
    // tokens begin with these two ids by chance once in 2^32 files).
    return Invalid(path, absl::StrCat("starts with llm.c's magic ", kLlmcMagic,
                                      ": it is an llm.c token file; set data.format: \"llmc\""));
  }
  return absl::Span<const uint16_t>(reinterpret_cast<const uint16_t*>(base),
                                    static_cast<size_t>(bytes / 2));
}

bool HasWildcard(absl::string_view pattern) {
  return pattern.find_first_of("*?[") != absl::string_view::npos;
}

}  // namespace

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
  TokenFile file(path, mapping, static_cast<size_t>(bytes), {});
  static const char kEmpty[1] = {0};
  const char* base = mapping != nullptr ? static_cast<const char*>(mapping) : kEmpty;
  ASSIGN_OR_RETURN(file.tokens_, format == TokenFormat::kLlmc ? LlmcTokens(path, base, bytes)
                                                              : NanoGptTokens(path, base, bytes));
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, {})) {}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, {});
  }
  return *this;
}

TokenFile::~TokenFile() { Unmap(); }

void TokenFile::Unmap() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
  mapping_ = nullptr;
  mapped_bytes_ = 0;
  tokens_ = {};
}

absl::Status TokenFile::CheckVocabulary(int vocab_size) const {
  if (vocab_size > 0xffff) return absl::OkStatus();  // every uint16 id is below it
  const auto bad = std::find_if(tokens_.begin(), tokens_.end(),
                                [vocab_size](uint16_t id) { return id >= vocab_size; });
  if (bad == tokens_.end()) return absl::OkStatus();
  return Invalid(path_, absl::StrCat("token ", bad - tokens_.begin(), " is ", *bad,
                                     ", at or above model.vocab_size = ", vocab_size,
                                     " (GPT-2's BPE has 50257 ids)"));
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
    const absl::Span<const uint16_t> tokens = files_[f].tokens();
    const int64_t at = start - starts_[f];
    const int64_t take = std::min<int64_t>(n, static_cast<int64_t>(tokens.size()) - at);
    std::copy(tokens.begin() + at, tokens.begin() + at + take, out);
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
