// Loading a byte-level BPE vocabulary: encoder.json read without a JSON tree (keeping the
// line of a syntax error) and vocab.bpe, whose merges are checked against it.
#include "common/data/byte_level_bpe.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/user_path.h"
#include "nlohmann/json.hpp"

namespace pipetrain::data {
namespace {

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

absl::StatusOr<std::string> ReadVocabularyFile(const std::string& path,
                                               const ByteLevelBpeConfig& config) {
  absl::StatusOr<std::string> text = common::ReadRegularFile(
      path, common::kMaxJsonFileBytes, absl::StrCat(config.title, " vocabulary:"));
  if (!text.ok()) {
    return absl::Status(
        text.status().code(),
        absl::StrCat(text.status().message(), "; the ", config.title,
                     " vocabulary (encoder.json, vocab.bpe) is installed by "
                     "deploy/install-deps.sh; or pass --tokenizer-dir DIR (or set ",
                     config.env_var, ")"));
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

absl::Status ByteLevelBpe::LoadFiles(const std::string& dir) {
  const std::string folder = dir.empty() ? "." : dir;
  RETURN_IF_ERROR(LoadEncoder(folder + "/encoder.json"));
  RETURN_IF_ERROR(LoadMerges(folder + "/vocab.bpe"));
  if (config_.whole_pre_token_first) {
    for (int32_t id = 0; id < vocab_size_; ++id) {
      if (id_known_[id]) byte_symbols_.emplace(id_bytes_[id], id);
    }
  }
  encoder_.clear();  // only loading needs symbols by name
  return CompilePattern();
}

absl::Status ByteLevelBpe::LoadEncoder(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadVocabularyFile(path, config_));
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
  auto special = [&](absl::string_view symbol) -> std::optional<int32_t> {
    const auto it = symbol.empty() ? encoder_.end() : encoder_.find(symbol);
    return it == encoder_.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  eot_id_ = special(config_.eot_symbol);
  bos_id_ = special(config_.bos_symbol);
  return absl::OkStatus();
}

absl::Status ByteLevelBpe::LoadMerges(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadVocabularyFile(path, config_));
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

}  // namespace pipetrain::data
