#include "coordinator/metrics/tensorboard_writer.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = pipetrain::v1;

constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

// Protobuf wire format: a field's key is (number << 3) | wire type.
constexpr int kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutKey(std::string* out, int field, int wire_type) {
  PutVarint(out, static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire_type));
}

// Little-endian, as protobuf's fixed32/fixed64 and TFRecord's length are.
template <typename T>
void PutLittleEndian(std::string* out, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void PutDouble(std::string* out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutKey(out, field, kFixed64);
  PutLittleEndian(out, bits);
}

void PutFloat(std::string* out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutKey(out, field, kFixed32);
  PutLittleEndian(out, bits);
}

void PutBytes(std::string* out, int field, std::string_view bytes) {
  PutKey(out, field, kLengthDelimited);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

// Event's and Summary's field numbers (tensorflow/core/util/event.proto, summary.proto).
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1, kValueSimpleValue = 2;

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrc32cTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(std::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string TfRecordFrame(std::string_view data) {
  std::string length;
  PutLittleEndian(&length, static_cast<uint64_t>(data.size()));
  std::string out = length;
  PutLittleEndian(&out, MaskedCrc32c(length));
  out.append(data);
  PutLittleEndian(&out, MaskedCrc32c(data));
  return out;
}

std::string VersionEvent(double wall_time) {
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutBytes(&event, kEventFileVersion, "brain.Event:2");
  return event;
}

std::string ScalarsEvent(double wall_time, int64_t step,
                         const std::vector<TensorBoardScalar>& scalars) {
  std::string summary;
  for (const TensorBoardScalar& s : scalars) {
    std::string value;
    PutBytes(&value, kValueTag, s.tag);
    PutFloat(&value, kValueSimpleValue, s.value);
    PutBytes(&summary, kSummaryValue, value);
  }
  std::string event;
  PutDouble(&event, kEventWallTime, wall_time);
  PutKey(&event, kEventStep, kVarint);
  PutVarint(&event, static_cast<uint64_t>(step));  // int64: two's complement, as protobuf
  PutBytes(&event, kEventSummary, summary);
  return event;
}

std::vector<TensorBoardScalar> StepScalars(const pb::StepRecord& record) {
  auto f = [](double v) { return static_cast<float>(v); };
  std::vector<TensorBoardScalar> out;
  out.push_back({"train/loss", f(record.loss())});
  if (record.has_val_loss()) out.push_back({"val/loss", f(record.val_loss())});
  out.push_back({"perf/tokens_per_s", f(record.tokens_per_s())});
  out.push_back({"pipeline/bubble_measured", f(record.bubble_measured())});
  out.push_back({"pipeline/bubble_predicted", f(record.bubble_predicted())});
  out.push_back({"train/lr", f(record.lr())});
  out.push_back({"train/grad_norm", f(record.grad_norm())});
  for (const pb::StageStepStats& s : record.stages()) {
    out.push_back({absl::StrCat("stage_", s.stage(), "/peak_memory_bytes"),
                   f(static_cast<double>(s.peak_memory_bytes()))});
  }
  return out;
}

std::string EventFileName(absl::Time now, std::string_view host) {
  return absl::StrCat("events.out.tfevents.", absl::ToUnixSeconds(now), ".", std::string(host));
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(
    const std::string& dir, absl::Time now) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("creating the TensorBoard folder ", dir, ": ", ec.message()));
  }
  const std::string base = absl::StrCat(dir, "/", EventFileName(now, Hostname()));
  std::string path = base;
  std::FILE* file = nullptr;
  for (int n = 1;; ++n) {
    // "x": never append to another run's file, even one created a moment ago.
    file = std::fopen(path.c_str(), "wbx");
    if (file != nullptr || errno != EEXIST || n > 1000) break;
    path = absl::StrCat(base, ".", n);
  }
  if (file == nullptr) {
    return absl::InternalError(
        absl::StrCat("creating the TensorBoard event file ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, file));
  if (absl::Status s = writer->Append(VersionEvent(absl::ToDoubleSeconds(now - absl::UnixEpoch())),
                                      "the version record");
      !s.ok()) {
    return s;
  }
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() { std::fclose(file_); }

absl::Status TensorBoardWriter::WriteStep(const pb::StepRecord& record, absl::Time now) {
  return WriteScalars(record.step(), StepScalars(record), now);
}

absl::Status TensorBoardWriter::WriteScalars(int64_t step,
                                             const std::vector<TensorBoardScalar>& scalars,
                                             absl::Time now) {
  return Append(ScalarsEvent(absl::ToDoubleSeconds(now - absl::UnixEpoch()), step, scalars),
                absl::StrCat("step ", step));
}

absl::Status TensorBoardWriter::Append(std::string_view event, std::string_view what) {
  const std::string record = TfRecordFrame(event);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() ||
      std::fflush(file_) != 0) {
    return absl::InternalError(absl::StrCat("writing ", std::string(what), " to the TensorBoard event file ",
                                            path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void TensorBoardJobLog::Step(const pb::StepRecord& record, absl::Time now) {
  if (failed_) return;
  absl::Status status = absl::OkStatus();
  if (writer_ == nullptr) {
    absl::StatusOr<std::unique_ptr<TensorBoardWriter>> opened = TensorBoardWriter::Open(dir_, now);
    if (opened.ok()) {
      writer_ = *std::move(opened);
    } else {
      status = opened.status();
    }
  }
  if (status.ok()) status = writer_->WriteStep(record, now);
  if (!status.ok()) {
    failed_ = true;
    writer_.reset();
    warn_(status);
  }
}

}  // namespace pipetrain::coordinator
