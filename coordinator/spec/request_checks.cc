#include "coordinator/spec/request_checks.h"

#include <cctype>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/address.h"
#include "common/checked_math.h"
#include "common/input_limits.h"
#include "common/status_macros.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using common::CheckCount;
using common::CheckLength;
using common::Truncated;

absl::Status Invalid(absl::string_view field, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " '", Truncated(value), "' ", why));
}

// Characters a host name, IPv4 or bracketed IPv6 address (with a zone) and a port use;
// anything else (spaces, control bytes, slashes) cannot be dialled and would only be
// echoed into logs and listings.
bool IsAddressText(const std::string& text) {
  for (unsigned char ch : text) {
    if (!(std::isalnum(ch) || ch == '.' || ch == '-' || ch == '_' || ch == ':' || ch == '[' ||
          ch == ']' || ch == '%')) {
      return false;
    }
  }
  return true;
}

absl::Status CheckStageAddress(const std::string& address) {
  RETURN_IF_ERROR(CheckLength("address", address, common::kMaxAddressBytes));
  if (!IsAddressText(address)) {
    return Invalid("address", address, "has characters no HOST:PORT has");
  }
  ASSIGN_OR_RETURN(common::HostPort hp, common::ParseHostPort(address, 0, "address"));
  if (hp.port < 1 || hp.port > 65535) {
    return Invalid("address", address,
                   "needs the port its Stage service listens on, from 1 to 65535");
  }
  return absl::OkStatus();
}

absl::Status CheckKeyword(absl::string_view field, const std::string& value) {
  return CheckLength(field, value, common::kMaxKeywordBytes);
}

absl::Status CheckPaths(absl::string_view field,
                        const google::protobuf::RepeatedPtrField<std::string>& paths) {
  RETURN_IF_ERROR(CheckCount(field, paths.size(), common::kMaxTokenFiles));
  for (int i = 0; i < paths.size(); ++i) {
    RETURN_IF_ERROR(
        CheckLength(absl::StrCat(field, "[", i, "]"), paths[i], common::kMaxPathBytes));
  }
  return absl::OkStatus();
}

}  // namespace

bool IsKnownDeviceKind(const std::string& kind) {
  return kind == "cpu" || kind == "cuda" || kind == "emulated";
}

absl::Status CheckRegisterStageRequest(const pb::RegisterStageRequest& request) {
  RETURN_IF_ERROR(CheckStageAddress(request.address()));
  RETURN_IF_ERROR(CheckLength("registration_secret", request.registration_secret(),
                              common::kMaxSecretBytes));
  const pb::DeviceInfo& d = request.device();
  if (!IsKnownDeviceKind(d.kind())) {
    return Invalid("device.kind", d.kind(), "is not a device kind: use cpu, cuda or emulated");
  }
  RETURN_IF_ERROR(CheckLength("device.name", d.name(), common::kMaxDeviceNameBytes));
  if (d.threads() < 0 || d.threads() > common::kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device.threads must be in [0, ", common::kMaxThreads, "] (got ", d.threads(), ")"));
  }
  if (d.memory_bytes() == 0) {
    return absl::InvalidArgumentError(
        "device.memory_bytes is 0 (unknown): the planner cannot place a model on a stage "
        "whose memory it does not know; report the memory the stage may use (pipetrain-stage "
        "reports --memory-limit, the GPU's memory or the host's)");
  }
  // `!(x >= 0)` is true for NaN too.
  if (!(d.peak_flops() >= 0) || !std::isfinite(d.peak_flops()) ||
      d.peak_flops() > common::kMaxPeakFlops) {
    return absl::InvalidArgumentError(
        absl::StrCat("device.peak_flops must be a finite FLOP rate in [0, ",
                     common::kMaxPeakFlops, "] (got ", d.peak_flops(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckHeartbeatRequest(const pb::HeartbeatRequest& request) {
  RETURN_IF_ERROR(CheckLength("stage_id", request.stage_id(), common::kMaxIdBytes));
  RETURN_IF_ERROR(CheckLength("job_id", request.job_id(), common::kMaxIdBytes));
  if (request.links_size() > common::kMaxReportedLinks) {
    return absl::InvalidArgumentError(absl::StrCat("links: ", request.links_size(),
                                                   " reported, at most ",
                                                   common::kMaxReportedLinks));
  }
  for (const pb::LinkPath& link : request.links()) {
    RETURN_IF_ERROR(CheckLength("links.sending", link.sending(), common::kMaxLinkPathBytes));
    RETURN_IF_ERROR(CheckLength("links.receiving", link.receiving(), common::kMaxLinkPathBytes));
  }
  return CheckLength("registration_secret", request.registration_secret(),
                     common::kMaxSecretBytes);
}

absl::Status CheckJobSpecBounds(const pb::JobSpec& spec) {
  const int64_t bytes = static_cast<int64_t>(spec.ByteSizeLong());
  if (bytes > common::kMaxJobSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec is ", bytes, " bytes; the limit is ",
                                                   common::kMaxJobSpecBytes));
  }
  RETURN_IF_ERROR(CheckLength("name", spec.name(), common::kMaxJobNameBytes));
  RETURN_IF_ERROR(CheckLength("init_from", spec.init_from(), common::kMaxPathBytes));
  RETURN_IF_ERROR(CheckLength("data.corpus", spec.data().corpus(), common::kMaxPathBytes));
  RETURN_IF_ERROR(CheckPaths("data.tokens", spec.data().tokens()));
  RETURN_IF_ERROR(CheckPaths("data.validation_tokens", spec.data().validation_tokens()));
  RETURN_IF_ERROR(CheckKeyword("data.format", spec.data().format()));
  RETURN_IF_ERROR(CheckKeyword("pipeline.schedule", spec.pipeline().schedule()));
  RETURN_IF_ERROR(CheckKeyword("pipeline.recompute", spec.pipeline().recompute()));
  // Both are int32, so the product fits 64 bits; a negative one is ValidateJobSpec's.
  ASSIGN_OR_RETURN(int64_t tokens,
                   common::CheckedMul(spec.training().batch_size(), spec.model().seq_len(),
                                      "training.batch_size x model.seq_len"));
  if (tokens > kMaxBatchTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.batch_size x model.seq_len is ", tokens, " tokens a step; the limit is ",
        kMaxBatchTokens, " (the coordinator holds a step's tokens and targets in memory)"));
  }
  return absl::OkStatus();
}

absl::Status CheckJobId(const std::string& job_id) {
  return CheckLength("job_id", job_id, common::kMaxIdBytes);
}

absl::Status CheckListJobsRequest(const pb::ListJobsRequest& request) {
  if (request.limit() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit must be >= 0 (0 = all; got ", request.limit(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckWatchJobRequest(const pb::WatchJobRequest& request) {
  RETURN_IF_ERROR(CheckJobId(request.job_id()));
  if (request.from_step() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("from_step must be >= 0 (got ", request.from_step(), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckGetTimelineRequest(const pb::GetTimelineRequest& request) {
  RETURN_IF_ERROR(CheckJobId(request.job_id()));
  if (request.last_steps() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "last_steps must be >= 0 (0 = the latest step; got ", request.last_steps(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::coordinator
