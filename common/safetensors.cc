#include "common/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/atomic_file.h"
#include "common/error_context.h"
#include "common/status_macros.h"
#include "common/user_path.h"
#include "nlohmann/json.hpp"

namespace pipetrain::common {

// The format is little-endian and tensors are copied as raw bytes.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr uint64_t kLengthPrefixBytes = 8;
constexpr uint64_t kHeaderAlignment = 8;
constexpr char kMetadataKey[] = "__metadata__";

absl::Status Invalid(absl::string_view source, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", message));
}

std::string Quoted(absl::string_view name) { return absl::StrCat("'", name, "'"); }

// ----------------------------------------------------------------------------------
// Writing

// The padded JSON header for `tensors`, after checking that every view is well formed.
absl::StatusOr<std::string> BuildHeader(std::span<const SafetensorsView> tensors,
                                        const SafetensorsMetadata& metadata) {
  // Keys in layout order, metadata first, as the reference writer emits them.
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<absl::string_view> names;
  uint64_t offset = 0;
  for (const SafetensorsView& t : tensors) {
    if (t.name.empty()) return absl::InvalidArgumentError("safetensors: a tensor has an empty name");
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: ", Quoted(kMetadataKey), " is reserved and cannot name a tensor"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: tensor ", Quoted(t.name), " is given twice"));
    }
    const std::string dtype = SafetensorsDTypeName(t.dtype);
    if (dtype.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor ", Quoted(t.name),
                                                     ": dtype ", DTypeName(t.dtype),
                                                     " cannot be stored"));
    }
    auto elements = NumElements(t.shape, absl::StrCat("tensor ", Quoted(t.name), " shape"));
    if (!elements.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: ", elements.status().message()));
    }
    const uint64_t bytes = *elements * DTypeSize(t.dtype);
    if (bytes != t.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "safetensors: tensor ", Quoted(t.name), ": shape ", ShapeString(t.shape), " of ",
          dtype, " needs ", bytes, " bytes but ", t.bytes.size(), " were given"));
    }
    header[t.name] = {{"dtype", dtype},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string json = header.dump();
  // Pad with spaces so that the data section starts 8-byte aligned.
  const uint64_t extra = (kLengthPrefixBytes + json.size()) % kHeaderAlignment;
  if (extra != 0) json.append(kHeaderAlignment - extra, ' ');
  return json;
}

std::string LengthPrefix(uint64_t n) {
  std::string out(kLengthPrefixBytes, '\0');
  std::memcpy(out.data(), &n, kLengthPrefixBytes);  // little-endian host
  return out;
}

// ----------------------------------------------------------------------------------
// Reading

// A SAX handler that builds the DOM like nlohmann's own, and in addition records
// duplicate keys (the DOM would silently keep one) and the parser's error message
// (so that no exception is thrown). It delegates to json_sax_dom_parser, which lives in
// nlohmann's detail namespace but has kept this interface throughout 3.x.
class HeaderSax {
 public:
  using Dom = nlohmann::detail::json_sax_dom_parser<Json>;

  explicit HeaderSax(Json& root) : dom_(root, /*allow_exceptions=*/false) {}

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& s) {
    return dom_.number_float(v, s);
  }
  bool string(Json::string_t& v) { return dom_.string(v); }
  bool binary(Json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(Json::string_t& k) {
    if (keys_.size() == 1) top_key_ = k;
    if (!keys_.back().insert(k).second && duplicate_.empty()) {
      duplicate_ = keys_.size() == 1
                       ? absl::StrCat("tensor ", Quoted(k), " appears twice in the header")
                       : absl::StrCat("field ", Quoted(k), " appears twice in header entry ",
                                      Quoted(top_key_));
    }
    return dom_.key(k);
  }
  bool end_object() {
    keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return dom_.start_array(n); }
  bool end_array() { return dom_.end_array(); }
  template <typename Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& ex) {
    error_ = ex.what();
    return dom_.parse_error(position, token, ex);
  }

  const std::string& error() const { return error_; }
  const std::string& duplicate() const { return duplicate_; }

 private:
  Dom dom_;
  std::vector<std::set<std::string>> keys_;
  std::string top_key_;
  std::string error_;
  std::string duplicate_;
};

// Reads a JSON array of non-negative integers (shape or data_offsets).
absl::Status ReadUnsignedArray(const Json& value, absl::string_view source,
                               absl::string_view name, absl::string_view field,
                               std::vector<uint64_t>& out) {
  if (!value.is_array()) {
    return Invalid(source, absl::StrCat("tensor ", Quoted(name), ": ", field,
                                        " is not an array (", value.dump(), ")"));
  }
  for (const Json& v : value) {
    if (!v.is_number_unsigned() ||
        v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Invalid(source, absl::StrCat("tensor ", Quoted(name), ": ", field,
                                          " holds ", v.dump(),
                                          ", not a non-negative integer"));
    }
    out.push_back(v.get<uint64_t>());
  }
  return absl::OkStatus();
}

absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& name, const Json& value,
                                            absl::string_view source) {
  if (!value.is_object()) {
    return Invalid(source, absl::StrCat("header entry ", Quoted(name),
                                        " is not an object (", value.dump(), ")"));
  }
  for (const auto& [field, unused] : value.items()) {
    if (field != "dtype" && field != "shape" && field != "data_offsets") {
      return Invalid(source, absl::StrCat("tensor ", Quoted(name), ": unknown field ",
                                          Quoted(field)));
    }
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) {
      return Invalid(source,
                     absl::StrCat("tensor ", Quoted(name), ": missing field ", Quoted(field)));
    }
  }
  SafetensorsEntry entry;
  entry.name = name;
  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) {
    return Invalid(source, absl::StrCat("tensor ", Quoted(name), ": dtype is not a string (",
                                        dtype.dump(), ")"));
  }
  const std::optional<DType> parsed = DTypeFromSafetensorsName(dtype.get<std::string>());
  if (!parsed) {
    return Invalid(source, absl::StrCat("tensor ", Quoted(name), ": unknown dtype ",
                                        dtype.dump(),
                                        " (supported: F32, BF16, F16, I32, I64, U8)"));
  }
  entry.dtype = *parsed;
  std::vector<uint64_t> shape;
  RETURN_IF_ERROR(ReadUnsignedArray(value["shape"], source, name, "shape", shape));
  entry.shape.assign(shape.begin(), shape.end());
  std::vector<uint64_t> offsets;
  RETURN_IF_ERROR(
      ReadUnsignedArray(value["data_offsets"], source, name, "data_offsets", offsets));
  if (offsets.size() != 2) {
    return Invalid(source, absl::StrCat("tensor ", Quoted(name),
                                        ": data_offsets must hold [begin, end], not ",
                                        value["data_offsets"].dump()));
  }
  entry.begin = offsets[0];
  entry.end = offsets[1];
  if (entry.begin > entry.end) {
    return Invalid(source, absl::StrCat("tensor ", Quoted(name), ": data_offsets [",
                                        entry.begin, ", ", entry.end, "] end before they begin"));
  }
  auto elements = NumElements(entry.shape, absl::StrCat("tensor ", Quoted(name), " shape"));
  if (!elements.ok()) return Invalid(source, elements.status().message());
  const uint64_t expected = *elements * DTypeSize(entry.dtype);
  if (entry.end - entry.begin != expected) {
    return Invalid(source, absl::StrCat("tensor ", Quoted(name), ": data_offsets [",
                                        entry.begin, ", ", entry.end, ") span ",
                                        entry.end - entry.begin, " bytes but ",
                                        dtype.get<std::string>(), " shape ",
                                        ShapeString(entry.shape), " needs ", expected));
  }
  return entry;
}

absl::StatusOr<SafetensorsMetadata> ParseMetadata(const Json& value, absl::string_view source) {
  if (!value.is_object()) {
    return Invalid(source, absl::StrCat(Quoted(kMetadataKey), " is not an object (",
                                        value.dump(), ")"));
  }
  SafetensorsMetadata metadata;
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      return Invalid(source, absl::StrCat(Quoted(kMetadataKey), " value of ", Quoted(key),
                                          " is not a string (", v.dump(), ")"));
    }
    metadata[key] = v.get<std::string>();
  }
  return metadata;
}

// Checks the 8-byte prefix against the size of the whole input; returns N.
absl::StatusOr<uint64_t> CheckLengthPrefix(absl::string_view prefix, uint64_t total_size,
                                           absl::string_view source) {
  if (total_size < kLengthPrefixBytes) {
    return Invalid(source, absl::StrCat("truncated: ", total_size,
                                        " bytes, shorter than the 8-byte header length"));
  }
  uint64_t n = 0;
  std::memcpy(&n, prefix.data(), kLengthPrefixBytes);
  if (n > kMaxSafetensorsHeaderBytes) {
    return Invalid(source, absl::StrCat("header length ", n, " exceeds the limit of ",
                                        kMaxSafetensorsHeaderBytes, " bytes"));
  }
  if (n > total_size - kLengthPrefixBytes) {
    return Invalid(source, absl::StrCat("truncated: header length ", n,
                                        " runs past the end of the data (",
                                        total_size - kLengthPrefixBytes,
                                        " bytes after the length)"));
  }
  if (n < 2) return Invalid(source, absl::StrCat("header length ", n, " is too short for JSON"));
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseHeader(absl::string_view text, uint64_t data_size,
                                              absl::string_view source) {
  Json root;
  HeaderSax sax(root);
  const bool ok = Json::sax_parse(text.begin(), text.end(), &sax);
  if (!ok) return Invalid(source, absl::StrCat("header is not valid JSON: ", sax.error()));
  if (!sax.duplicate().empty()) return Invalid(source, sax.duplicate());
  if (!root.is_object()) {
    return Invalid(source, absl::StrCat("header is not a JSON object but ", root.type_name()));
  }
  SafetensorsHeader header;
  header.data_offset = kLengthPrefixBytes + text.size();
  header.data_size = data_size;
  for (const auto& [name, value] : root.items()) {
    if (name == kMetadataKey) {
      ASSIGN_OR_RETURN(header.metadata, ParseMetadata(value, source));
      continue;
    }
    ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(name, value, source));
    if (entry.end > data_size) {
      return Invalid(source, absl::StrCat("tensor ", Quoted(name), ": data_offsets [",
                                          entry.begin, ", ", entry.end,
                                          ") lie outside the data section of ", data_size,
                                          " bytes (truncated file?)"));
    }
    header.entries.push_back(std::move(entry));
  }
  // The tensors must tile the data section: sorted by offset, each begins where the
  // previous one ended, and the last ends at the end of the data.
  std::sort(header.entries.begin(), header.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
            });
  uint64_t position = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : header.entries) {
    if (e.begin < position) {
      return Invalid(source, absl::StrCat("tensor ", Quoted(e.name), ": data_offsets [",
                                          e.begin, ", ", e.end, ") overlap tensor ",
                                          Quoted(previous->name), " which ends at ", position));
    }
    if (e.begin > position) {
      return Invalid(source, absl::StrCat("tensor ", Quoted(e.name), ": data_offsets [",
                                          e.begin, ", ", e.end, ") leave a gap of ",
                                          e.begin - position, " bytes after ",
                                          previous ? absl::StrCat("tensor ", Quoted(previous->name))
                                                   : std::string("the header")));
    }
    position = e.end;
    previous = &e;
  }
  if (position != data_size) {
    return Invalid(source, absl::StrCat(data_size - position, " bytes after ",
                                        previous ? absl::StrCat("the last tensor ",
                                                                Quoted(previous->name))
                                                 : std::string("the header"),
                                        " belong to no tensor"));
  }
  return header;
}

// A file descriptor closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

absl::Status PreadFully(int fd, std::byte* out, uint64_t size, uint64_t offset,
                        absl::string_view source, absl::string_view what) {
  while (size > 0) {
    const ssize_t n = pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(source, ": cannot read ", what));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(source, ": file ended while reading ", what, " (truncated?)"));
    }
    out += n;
    size -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

struct OpenFile {
  std::unique_ptr<Fd> fd;
  SafetensorsHeader header;
};

absl::StatusOr<OpenFile> OpenAndReadHeader(const std::string& path) {
  // Never opens a FIFO or device; the size is the open file's (fstat), bounded.
  ASSIGN_OR_RETURN(ReadOnlyFile opened,
                   OpenRegularFile(path, kMaxSafetensorsBytes, "safetensors file"));
  const uint64_t size = static_cast<uint64_t>(opened.size());
  auto fd = std::make_unique<Fd>(opened.Release());
  char prefix[kLengthPrefixBytes] = {};
  if (size >= kLengthPrefixBytes) {
    RETURN_IF_ERROR(PreadFully(fd->get(), reinterpret_cast<std::byte*>(prefix),
                               kLengthPrefixBytes, 0, path, "the header length"));
  }
  // Bounded by the limit and by the file size before anything is allocated.
  ASSIGN_OR_RETURN(const uint64_t n,
                   CheckLengthPrefix(absl::string_view(prefix, kLengthPrefixBytes), size, path));
  std::string text(n, '\0');
  RETURN_IF_ERROR(PreadFully(fd->get(), reinterpret_cast<std::byte*>(text.data()), n,
                             kLengthPrefixBytes, path, "the header"));
  ASSIGN_OR_RETURN(SafetensorsHeader header,
                   ParseHeader(text, size - kLengthPrefixBytes - n, path));
  return OpenFile{std::move(fd), std::move(header)};
}

}  // namespace

std::string SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    case DType::kUnspecified: return "";
  }
  return "";
}

std::optional<DType> DTypeFromSafetensorsName(absl::string_view name) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64,
                  DType::kU8}) {
    if (name == SafetensorsDTypeName(d)) return d;
  }
  return std::nullopt;
}

SafetensorsView ViewOf(std::string name, const Tensor& tensor) {
  return {std::move(name), tensor.dtype(), tensor.shape(), tensor.bytes()};
}

const SafetensorsEntry* SafetensorsHeader::Find(absl::string_view name) const {
  for (const SafetensorsEntry& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

const Tensor* SafetensorsContents::Find(absl::string_view name) const {
  for (const NamedTensor& t : tensors) {
    if (t.name == name) return &t.tensor;
  }
  return nullptr;
}

absl::StatusOr<std::string> SerializeSafetensors(std::span<const SafetensorsView> tensors,
                                                 const SafetensorsMetadata& metadata) {
  ASSIGN_OR_RETURN(std::string header, BuildHeader(tensors, metadata));
  size_t total = kLengthPrefixBytes + header.size();
  for (const SafetensorsView& t : tensors) total += t.bytes.size();
  std::string out;
  out.reserve(total);
  out += LengthPrefix(header.size());
  out += header;
  for (const SafetensorsView& t : tensors) {
    out.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  return out;
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  std::span<const SafetensorsView> tensors,
                                  const SafetensorsMetadata& metadata) {
  ASSIGN_OR_RETURN(std::string header,
                   ErrorContext(path).Wrap(BuildHeader(tensors, metadata)));
  ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Open(path));
  RETURN_IF_ERROR(writer.Write(LengthPrefix(header.size())));
  RETURN_IF_ERROR(writer.Write(header));
  for (const SafetensorsView& t : tensors) RETURN_IF_ERROR(writer.Write(t.bytes));
  return writer.Commit();
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view bytes,
                                                         const std::string& source) {
  ASSIGN_OR_RETURN(const uint64_t n, CheckLengthPrefix(bytes.substr(0, kLengthPrefixBytes),
                                                       bytes.size(), source));
  return ParseHeader(bytes.substr(kLengthPrefixBytes, n), bytes.size() - kLengthPrefixBytes - n,
                     source);
}

absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes,
                                                     const std::string& source) {
  ASSIGN_OR_RETURN(SafetensorsHeader header, ParseSafetensorsHeader(bytes, source));
  SafetensorsContents contents;
  contents.metadata = std::move(header.metadata);
  const char* data = bytes.data() + header.data_offset;
  for (SafetensorsEntry& e : header.entries) {
    ASSIGN_OR_RETURN(Tensor tensor, Tensor::Create(e.dtype, std::move(e.shape)));
    if (tensor.num_bytes()) std::memcpy(tensor.bytes().data(), data + e.begin, tensor.num_bytes());
    contents.tensors.push_back({std::move(e.name), std::move(tensor)});
  }
  return contents;
}

absl::StatusOr<SafetensorsContents> ReadSafetensorsFile(const std::string& path,
                                                        const TensorFilter& select) {
  ASSIGN_OR_RETURN(OpenFile file, OpenAndReadHeader(path));
  SafetensorsContents contents;
  contents.metadata = std::move(file.header.metadata);
  for (SafetensorsEntry& e : file.header.entries) {
    if (select && !select(e.name)) continue;
    // The size was checked against the file size in ParseHeader.
    ASSIGN_OR_RETURN(Tensor tensor, Tensor::Create(e.dtype, std::move(e.shape)));
    RETURN_IF_ERROR(PreadFully(file.fd->get(), tensor.bytes().data(), tensor.num_bytes(),
                               file.header.data_offset + e.begin, path,
                               absl::StrCat("tensor ", Quoted(e.name))));
    contents.tensors.push_back({std::move(e.name), std::move(tensor)});
  }
  return contents;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path) {
  ASSIGN_OR_RETURN(OpenFile file, OpenAndReadHeader(path));
  return std::move(file.header);
}

}  // namespace pipetrain::common
