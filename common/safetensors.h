// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N
// bytes of JSON {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}} padded
// with spaces to 8-byte alignment, then the raw little-endian tensor bytes. Checkpoints
// are written and read with it, as files or as byte strings streamed over gRPC.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tensor.h"

namespace pipetrain::common {

// Headers above this are refused before anything is allocated for them (the reference
// implementation's limit, 100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

using SafetensorsMetadata = std::map<std::string, std::string>;

// "F32", "BF16", "F16", "I32", "I64", "U8" (the format's spelling).
std::string SafetensorsDTypeName(DType dtype);
// The reverse; std::nullopt for any other name (F64, BOOL, ... are not supported).
std::optional<DType> DTypeFromSafetensorsName(absl::string_view name);

// A tensor to write: nothing is copied, so `bytes` must outlive the write.
struct SafetensorsView {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
};
SafetensorsView ViewOf(std::string name, const Tensor& tensor);

// One tensor as the header describes it. Offsets are relative to the data section.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A validated header: entries sorted by offset (they tile the data section exactly).
struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;
  SafetensorsMetadata metadata;
  uint64_t data_offset = 0;  // 8 + N: where the data section starts in the file
  uint64_t data_size = 0;
  const SafetensorsEntry* Find(absl::string_view name) const;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

// What a reader returns: tensors in the order of their data, and the metadata.
struct SafetensorsContents {
  std::vector<NamedTensor> tensors;
  SafetensorsMetadata metadata;
  const Tensor* Find(absl::string_view name) const;
};

// Writing. Tensors are laid out in the order given. Fails (InvalidArgument, naming the
// tensor) on an empty, duplicate or reserved ("__metadata__") name, an invalid dtype, or
// bytes that do not match dtype and shape.
absl::StatusOr<std::string> SerializeSafetensors(std::span<const SafetensorsView> tensors,
                                                 const SafetensorsMetadata& metadata = {});
// Atomic: see common/atomic_file.h. Streams the tensors without an extra copy.
absl::Status WriteSafetensorsFile(const std::string& path,
                                  std::span<const SafetensorsView> tensors,
                                  const SafetensorsMetadata& metadata = {});

// Reading. Every error is InvalidArgument (malformed content), DataLoss (a file that
// shrank while being read) or the I/O error (NotFound, ...), with a message that starts
// with `source` (the file name, or what the bytes are) and names the tensor and field at
// fault. Checked: the length prefix and the header length against
// the data, the JSON, each entry's fields (dtype, shape, data_offsets and nothing else),
// that each tensor's byte range matches its dtype and shape, that the ranges tile the
// data section with no gap, overlap or trailing bytes, and that no name repeats.
absl::StatusOr<SafetensorsContents> ParseSafetensors(absl::string_view bytes,
                                                     const std::string& source = "<memory>");
// A predicate that selects which tensors to load (all when empty); the whole header is
// validated either way.
using TensorFilter = std::function<bool(const std::string& name)>;
absl::StatusOr<SafetensorsContents> ReadSafetensorsFile(const std::string& path,
                                                        const TensorFilter& select = {});
// Only the header (for metadata, names and sizes without reading the data).
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);
// The header of bytes in memory, checked as ParseSafetensors checks it; the tensors'
// bytes are at bytes.substr(data_offset + begin, end - begin).
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view bytes,
                                                         const std::string& source = "<memory>");

}  // namespace pipetrain::common
