#include "tests/testing/tfrecord_reader.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pipetrain::testing {
namespace {

uint64_t LittleEndian(std::string_view bytes) {
  uint64_t v = 0;
  for (size_t i = bytes.size(); i-- > 0;) v = v << 8 | static_cast<unsigned char>(bytes[i]);
  return v;
}

uint32_t Unmask(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

// A protobuf message's fields, one at a time.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : rest_(bytes) {}
  bool done() const { return rest_.empty(); }

  absl::StatusOr<uint64_t> Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (rest_.empty()) return absl::DataLossError("varint runs past the message's end");
      const auto b = static_cast<unsigned char>(rest_[0]);
      rest_.remove_prefix(1);
      v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return v;
    }
    return absl::DataLossError("varint longer than 10 bytes");
  }
  absl::StatusOr<std::string_view> Take(size_t n) {
    if (rest_.size() < n) {
      return absl::DataLossError(absl::StrCat("field of ", n, " bytes runs past the end"));
    }
    std::string_view out = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return out;
  }

  struct Field {
    int number = 0;
    int wire_type = 0;
    uint64_t varint = 0;      // wire type 0
    std::string_view bytes;   // types 1, 2, 5 (the raw little-endian bytes for 1 and 5)
  };
  absl::StatusOr<Field> Next() {
    absl::StatusOr<uint64_t> key = Varint();
    if (!key.ok()) return key.status();
    Field f;
    f.number = static_cast<int>(*key >> 3);
    f.wire_type = static_cast<int>(*key & 7);
    absl::StatusOr<std::string_view> b;
    switch (f.wire_type) {
      case 0: {
        absl::StatusOr<uint64_t> v = Varint();
        if (!v.ok()) return v.status();
        f.varint = *v;
        return f;
      }
      case 1: b = Take(8); break;
      case 5: b = Take(4); break;
      case 2: {
        absl::StatusOr<uint64_t> n = Varint();
        if (!n.ok()) return n.status();
        b = Take(*n);
        break;
      }
      default:
        return absl::DataLossError(absl::StrCat("field ", f.number, " has wire type ",
                                                f.wire_type, ", which no Event field uses"));
    }
    if (!b.ok()) return b.status();
    f.bytes = *b;
    return f;
  }

 private:
  std::string_view rest_;
};

absl::Status ExpectType(const WireReader::Field& f, int type, const char* message) {
  if (f.wire_type == type) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(message, " field ", f.number, " has wire type ",
                                          f.wire_type, ", expected ", type));
}

absl::Status ParseValue(std::string_view bytes, ReadEvent& event) {
  WireReader r(bytes);
  std::string tag;
  bool has_value = false;
  float value = 0;
  while (!r.done()) {
    absl::StatusOr<WireReader::Field> f = r.Next();
    if (!f.ok()) return f.status();
    if (f->number == 1) {
      if (absl::Status s = ExpectType(*f, 2, "Summary.Value"); !s.ok()) return s;
      tag = std::string(f->bytes);
    } else if (f->number == 2) {
      if (absl::Status s = ExpectType(*f, 5, "Summary.Value"); !s.ok()) return s;
      const auto bits = static_cast<uint32_t>(LittleEndian(f->bytes));
      std::memcpy(&value, &bits, sizeof value);
      has_value = true;
    }
  }
  if (tag.empty() || !has_value) {
    return absl::DataLossError("a Summary.Value without a tag or a simple_value");
  }
  if (!event.scalars.emplace(tag, value).second) {
    return absl::DataLossError(absl::StrCat("tag ", tag, " twice in one event"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReadEvent> ParseEvent(std::string_view bytes) {
  ReadEvent event;
  WireReader r(bytes);
  while (!r.done()) {
    absl::StatusOr<WireReader::Field> f = r.Next();
    if (!f.ok()) return f.status();
    absl::Status s;
    switch (f->number) {
      case 1: {
        if (s = ExpectType(*f, 1, "Event"); !s.ok()) return s;
        const uint64_t bits = LittleEndian(f->bytes);
        std::memcpy(&event.wall_time, &bits, sizeof event.wall_time);
        break;
      }
      case 2:
        if (s = ExpectType(*f, 0, "Event"); !s.ok()) return s;
        event.step = static_cast<int64_t>(f->varint);
        break;
      case 3:
        if (s = ExpectType(*f, 2, "Event"); !s.ok()) return s;
        event.file_version = std::string(f->bytes);
        break;
      case 5: {
        if (s = ExpectType(*f, 2, "Event"); !s.ok()) return s;
        event.has_summary = true;
        WireReader summary(f->bytes);
        while (!summary.done()) {
          absl::StatusOr<WireReader::Field> v = summary.Next();
          if (!v.ok()) return v.status();
          if (v->number != 1) continue;
          if (s = ExpectType(*v, 2, "Summary"); !s.ok()) return s;
          if (s = ParseValue(v->bytes, event); !s.ok()) return s;
        }
        break;
      }
      default:
        break;  // fields a reader may ignore
    }
  }
  return event;
}

}  // namespace

uint32_t BitwiseCrc32c(std::string_view data) {
  uint32_t crc = ~0u;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

absl::StatusOr<std::vector<ReadEvent>> ParseEventFile(std::string_view bytes) {
  std::vector<ReadEvent> out;
  size_t at = 0;
  while (at < bytes.size()) {
    const std::string where = absl::StrCat("record ", out.size(), " at byte ", at);
    if (bytes.size() - at < 12) return absl::DataLossError(where + ": truncated header");
    const std::string_view length_bytes = bytes.substr(at, 8);
    const uint64_t length = LittleEndian(length_bytes);
    const auto length_crc = static_cast<uint32_t>(LittleEndian(bytes.substr(at + 8, 4)));
    if (Unmask(length_crc) != BitwiseCrc32c(length_bytes)) {
      return absl::DataLossError(where + ": the length's CRC does not match");
    }
    if (bytes.size() - at - 12 < length + 4) {
      return absl::DataLossError(absl::StrCat(where, ": ", length, " bytes of data announced, ",
                                              bytes.size() - at - 12, " left"));
    }
    const std::string_view data = bytes.substr(at + 12, length);
    const auto data_crc = static_cast<uint32_t>(LittleEndian(bytes.substr(at + 12 + length, 4)));
    if (Unmask(data_crc) != BitwiseCrc32c(data)) {
      return absl::DataLossError(where + ": the data's CRC does not match");
    }
    absl::StatusOr<ReadEvent> event = ParseEvent(data);
    if (!event.ok()) {
      return absl::DataLossError(absl::StrCat(where, ": ", event.status().message()));
    }
    out.push_back(*std::move(event));
    at += 12 + length + 4;
  }
  return out;
}

absl::StatusOr<std::vector<ReadEvent>> ReadEventFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open the event file ", path));
  std::stringstream bytes;
  bytes << in.rdbuf();
  absl::StatusOr<std::vector<ReadEvent>> events = ParseEventFile(bytes.str());
  if (!events.ok()) {
    return absl::DataLossError(absl::StrCat(path, ": ", events.status().message()));
  }
  return events;
}

}  // namespace pipetrain::testing
