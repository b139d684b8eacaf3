// Fuzzes the safetensors reader (common/safetensors): ParseSafetensors on the bytes in
// memory, and the file readers (ReadSafetensorsFile, ReadSafetensorsHeader) on the same
// bytes written to a file, which must agree with it. Round trip that must hold: what
// parses, serialized again, parses to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "common/safetensors.h"
#include "tests/fuzz/fuzz_temp_file.h"

namespace common = pipetrain::common;

namespace {

bool SameContents(const common::SafetensorsContents& a, const common::SafetensorsContents& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const common::Tensor& x = a.tensors[i].tensor;
    const common::Tensor& y = b.tensors[i].tensor;
    if (a.tensors[i].name != b.tensors[i].name || x.dtype() != y.dtype() ||
        x.shape() != y.shape() || x.num_bytes() != y.num_bytes() ||
        (x.num_bytes() > 0 && std::memcmp(x.bytes().data(), y.bytes().data(), x.num_bytes()))) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto parsed = common::ParseSafetensors(bytes, "fuzz input");

  const std::string path = pipetrain::fuzz::WriteTempFile("input.safetensors", bytes);
  auto from_file = common::ReadSafetensorsFile(path);
  auto header = common::ReadSafetensorsHeader(path);
  if (from_file.ok() != parsed.ok()) __builtin_trap();
  if (parsed.ok() && (!header.ok() || !SameContents(*parsed, *from_file))) __builtin_trap();
  // A filter that loads every other tensor sees the same header.
  size_t seen = 0;
  auto filtered = common::ReadSafetensorsFile(path, [&](const std::string&) { return ++seen % 2; });
  if (filtered.ok() != parsed.ok()) __builtin_trap();
  if (!parsed.ok()) return 0;

  std::vector<common::SafetensorsView> views;
  for (const common::NamedTensor& t : parsed->tensors) views.push_back(common::ViewOf(t.name, t.tensor));
  auto serialized = common::SerializeSafetensors(views, parsed->metadata);
  if (!serialized.ok()) __builtin_trap();
  auto again = common::ParseSafetensors(*serialized, "round trip");
  if (!again.ok() || !SameContents(*parsed, *again)) __builtin_trap();
  return 0;
}
