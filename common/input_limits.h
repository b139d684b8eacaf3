// The bounds on every string and list a client controls, in one place, so that no
// request can make the coordinator or a stage store, list or echo an unbounded amount
// (a 100 MB job name was once stored, and every later ListJobs exceeded clients'
// receive limit). Each limit is far above any real use; a request past one gets
// INVALID_ARGUMENT naming the field, the limit and the size (CheckLength).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pipetrain::common {

// Free text shown in listings (`pipetrain list` prints one line a job).
inline constexpr int64_t kMaxJobNameBytes = 256;
// Ids the coordinator issues ("job-12", "stage-3") and prefixes derived from them; a
// longer one cannot name anything, so it is refused before any lookup.
inline constexpr int64_t kMaxIdBytes = 128;
// A file or folder path: Linux's PATH_MAX.
inline constexpr int64_t kMaxPathBytes = 4096;
// Token files of one job (data.tokens, data.validation_tokens), before globs expand:
// llm.c's FineWeb-10B is about a hundred shards.
inline constexpr int64_t kMaxTokenFiles = 4096;
// Enumerated spec strings (pipeline.schedule, pipeline.recompute, data.format).
inline constexpr int64_t kMaxKeywordBytes = 64;
// A whole job spec as the wire carries it: the fields above and numbers fit in far less.
inline constexpr int64_t kMaxJobSpecBytes = 1 << 20;
// "HOST:PORT": a DNS name is at most 253 bytes, an IPv6 literal with brackets 47.
inline constexpr int64_t kMaxAddressBytes = 512;
// A device's name as a stage reports it ("NVIDIA H200", "emulated:h100").
inline constexpr int64_t kMaxDeviceNameBytes = 256;
// Secrets the coordinator issues are 32 hex digits; tokens a little more.
inline constexpr int64_t kMaxSecretBytes = 256;
// A heartbeat's peer links (a stage has two; a V schedule's may wrap) and each
// direction's path text.
inline constexpr int64_t kMaxReportedLinks = 8;
inline constexpr int64_t kMaxLinkPathBytes = 512;
// CPU compute threads a stage may report: more than any machine has cores.
inline constexpr int64_t kMaxThreads = 4096;
// A FLOP rate a stage may report: 1e18 FLOP/s, a thousand of today's largest GPUs.
inline constexpr double kMaxPeakFlops = 1e18;
// ListJobs' limit and GetTimeline's last_steps need no upper bound: they ask for "at
// most N", and an answer is bounded by what is stored (names bounded as above, 20
// timeline steps a job); only negative values are refused.

// OK when value.size() <= limit, else INVALID_ARGUMENT "FIELD is N bytes; the limit is
// LIMIT" (the value itself is not echoed: it is the thing too large to send back).
absl::Status CheckLength(absl::string_view field, absl::string_view value, int64_t limit);
// The same for a list's number of entries.
absl::Status CheckCount(absl::string_view field, int64_t count, int64_t limit);

// `value` for an error message: at most 64 bytes of it, then "... (N bytes)".
std::string Truncated(absl::string_view value);

}  // namespace pipetrain::common
