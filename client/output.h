// Text the remote verbs print: messages as snake_case JSON, column-aligned tables, and
// numbers, sizes, durations and times in the units a person reads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"

namespace pipetrain::client {

// JSON with the proto field names (snake_case) and zero values printed, so that scripts
// find every field; pretty, or on one line (for streams of events). Ends with a newline.
std::string ProtoToJson(const google::protobuf::Message& message, bool pretty = true);

// Rows of cells under a header, each column as wide as its widest cell, two spaces apart.
std::string RenderTable(const std::vector<std::string>& header,
                        const std::vector<std::vector<std::string>>& rows);

std::string WithThousands(int64_t n);      // 4210 -> "4,210"
std::string HumanDuration(double seconds); // 80 -> "1m20s", 7500 -> "2h05m", 4.2 -> "4s"

bool IsSet(const google::protobuf::Timestamp& t);
absl::Time ToTime(const google::protobuf::Timestamp& t);
// RFC 3339 in UTC, to the second ("2024-05-01T12:00:03Z"), or "-" when unset.
std::string TimeText(const google::protobuf::Timestamp& t);
// With milliseconds, for log lines ("2024-05-01T12:00:03.250Z").
std::string TimeTextMillis(const google::protobuf::Timestamp& t);
// "12s ago", "3m05s ago", or "never" when unset.
std::string AgeText(const google::protobuf::Timestamp& t, absl::Time now);

}  // namespace pipetrain::client
