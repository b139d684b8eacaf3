#include "stage_server/calibration/link_calibration.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "stage_server/calibration/calibration.h"

namespace pipetrain::stage_server {
namespace {

common::FrameTag Tag(const std::string& id, uint32_t message, common::TensorKind kind) {
  return {.job_id = id, .step = 0, .micro_batch = message, .chunk = 0, .kind = kind};
}

// A tensor of `bytes` / 4 fp32 values, a pattern (never zeros).
absl::StatusOr<std::shared_ptr<const common::Tensor>> Pattern(uint64_t bytes) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  ASSIGN_OR_RETURN(common::Tensor t, common::Tensor::Create(common::DType::kF32, {n}));
  std::span<float> values = t.data<float>();
  for (size_t i = 0; i < values.size(); ++i) values[i] = 1.0f + static_cast<float>(i % 7);
  return std::make_shared<const common::Tensor>(std::move(t));
}

struct Round {
  double send_s = 0;   // the Send call
  double round_s = 0;  // from the send to the answer
};

absl::StatusOr<Round> Exchange(TensorChannel& link, const std::string& id, uint32_t message,
                               std::shared_ptr<const common::Tensor> tensor,
                               absl::Time deadline) {
  Round r;
  const CalibrationClock::time_point start = CalibrationClock::now();
  RETURN_IF_ERROR(link.Send(Tag(id, message, common::TensorKind::kActivation),
                            std::move(tensor), deadline));
  r.send_s = SecondsSince(start);
  absl::StatusOr<common::PiecewiseTensor> answer =
      link.Receive(Tag(id, message, common::TensorKind::kGradient), deadline);
  r.round_s = SecondsSince(start);
  if (!answer.ok()) return answer.status();
  if (answer->num_bytes() != sizeof(float)) {
    return absl::DataLossError(absl::StrCat("calibrate link ", id, ": the answer to message ",
                                            message, " has ", answer->num_bytes(),
                                            " bytes, not one fp32 element"));
  }
  return r;
}

}  // namespace

int LinkCalibrationMessages(int repetitions) { return 1 + 2 * (repetitions + 1); }

absl::Status PingLink(TensorChannel& link, const std::string& calibration_id,
                      absl::Time deadline) {
  ASSIGN_OR_RETURN(auto tiny, Pattern(sizeof(float)));
  return Exchange(link, calibration_id, 0, std::move(tiny), deadline).status();
}

absl::StatusOr<LinkTimes> TimeLink(TensorChannel& link, const std::string& calibration_id,
                                   uint64_t bytes, int repetitions, absl::Time deadline) {
  if (bytes == 0 || bytes % sizeof(float) != 0 || repetitions < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calibrate link ", calibration_id, ": a transfer of ", bytes,
        " bytes (a positive multiple of 4) ", repetitions,
        " times (at least once) cannot be timed"));
  }
  ASSIGN_OR_RETURN(auto tiny, Pattern(sizeof(float)));
  ASSIGN_OR_RETURN(auto large, Pattern(bytes));
  std::vector<double> tiny_rounds, large_rounds, sends;
  uint32_t message = 1;
  for (int r = 0; r <= repetitions; ++r) {
    ASSIGN_OR_RETURN(const Round t, Exchange(link, calibration_id, message++, tiny, deadline));
    ASSIGN_OR_RETURN(const Round l, Exchange(link, calibration_id, message++, large, deadline));
    if (r == 0) continue;  // the first warms the buffers and the connection
    tiny_rounds.push_back(t.round_s);
    large_rounds.push_back(l.round_s);
    sends.push_back(l.send_s);
  }
  const double large_round = MedianOf(large_rounds);
  const double one_way = std::max(large_round - MedianOf(tiny_rounds) / 2, large_round / 2);
  return LinkTimes{.transfer_s_per_byte = one_way / static_cast<double>(bytes),
                   .send_busy_s = MedianOf(sends)};
}

absl::Status AnswerLink(TensorChannel& link, const std::string& calibration_id,
                        int repetitions, absl::Time deadline) {
  ASSIGN_OR_RETURN(auto answer, Pattern(sizeof(float)));
  const int messages = LinkCalibrationMessages(repetitions);
  for (int i = 0; i < messages; ++i) {
    const uint32_t message = static_cast<uint32_t>(i);
    RETURN_IF_ERROR(
        link.Receive(Tag(calibration_id, message, common::TensorKind::kActivation), deadline)
            .status());
    RETURN_IF_ERROR(link.Send(Tag(calibration_id, message, common::TensorKind::kGradient),
                              answer, deadline));
  }
  // The sender hangs up as soon as it holds the last answer, which can be before this
  // side hears that its last write is done: a link that breaks now (UNAVAILABLE) broke
  // after every question was answered, and whether the last answer arrived is the
  // sender's to say (it times the link and fails without it). Only the deadline fails
  // the receiver here.
  absl::Status flushed = link.Flush(deadline);
  if (flushed.code() == absl::StatusCode::kUnavailable) return absl::OkStatus();
  return flushed;
}

}  // namespace pipetrain::stage_server
