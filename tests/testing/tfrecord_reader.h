// An independent reader of TensorBoard event files for tests: parses the TFRecord
// framing checking every length and data CRC (its own bit-by-bit CRC-32C), and decodes
// Event / Summary / Summary.Value from the protobuf wire format by hand, so that what
// coordinator/metrics/tensorboard_writer.h writes is checked by code that shares nothing with it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pipetrain::testing {

// CRC-32C computed one bit at a time (not the writer's table).
uint32_t BitwiseCrc32c(std::string_view data);

struct ReadEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;  // set on the version record only
  bool has_summary = false;
  // tag -> simple_value; a tag twice in one event is an error.
  std::map<std::string, float> scalars;
};

// The records of an event file's bytes, in order; an error names the record (and
// byte offset) whose framing, CRC or message does not parse.
absl::StatusOr<std::vector<ReadEvent>> ParseEventFile(std::string_view bytes);
// The same for a file on disk.
absl::StatusOr<std::vector<ReadEvent>> ReadEventFile(const std::string& path);

}  // namespace pipetrain::testing
