#include "coordinator/auto/stage_calibration.h"

#include <algorithm>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

std::string CalibrationKey(const pb::JobSpec& spec, const pb::DeviceInfo& device, int rows,
                           int sharing, int slots) {
  std::string model;
  spec.model().SerializeToString(&model);  // deterministic for one binary and message
  return absl::StrCat(model, "|", spec.training().precision(), "|", rows, "|", device.kind(),
                      "|", device.name(), "|", device.threads(), "|", sharing, "/", slots);
}

namespace {

// Every address asked at once (`calibrate` from as many threads), the i-th with
// request_of(i): the answers, in order.
std::vector<absl::StatusOr<pb::CalibrateResponse>> AskAtOnce(
    const std::vector<std::string>& addresses,
    const std::function<pb::CalibrateRequest(int)>& request_of,
    const CalibrationCache::Calibrate& calibrate) {
  const int n = static_cast<int>(addresses.size());
  std::vector<absl::StatusOr<pb::CalibrateResponse>> answers(n, absl::UnknownError("not asked"));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] { answers[i] = calibrate(addresses[i], request_of(i)); });
  }
  for (std::thread& t : threads) t.join();
  return answers;
}

std::vector<std::string> AddressesOf(const std::vector<pb::StageInfo>& stages) {
  std::vector<std::string> out;
  for (const pb::StageInfo& s : stages) out.push_back(s.address());
  return out;
}

// Each rate the median of the stages' answers (the mean of the middle two of an even
// count), times `scale`.
planner::CostRates MedianRates(const std::vector<pb::CalibrateResponse>& answers, double scale) {
  auto median = [&](double (pb::CalibrateResponse::*field)() const) {
    std::vector<double> v;
    for (const pb::CalibrateResponse& a : answers) v.push_back((a.*field)());
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return scale * (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
  };
  planner::CostRates rates;
  rates.forward_s_per_flop = median(&pb::CalibrateResponse::forward_s_per_flop);
  rates.backward_input_s_per_flop = median(&pb::CalibrateResponse::backward_input_s_per_flop);
  rates.backward_weight_s_per_flop = median(&pb::CalibrateResponse::backward_weight_s_per_flop);
  rates.optimizer_s_per_param = median(&pb::CalibrateResponse::optimizer_s_per_param);
  rates.steps = answers.front().repetitions();
  return rates;
}

}  // namespace

absl::StatusOr<AutoCosts> CalibrationCache::Get(const pb::JobSpec& spec,
                                                const std::vector<pb::StageInfo>& stages,
                                                int slots, int rows, const Calibrate& calibrate) {
  if (stages.empty()) return absl::InvalidArgumentError("a calibration needs a stage");
  const int n = static_cast<int>(stages.size());
  slots = std::max(1, slots);
  const pb::StageInfo& first = stages.front();
  const std::string key = CalibrationKey(spec, first.device(), rows, n, slots);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  pb::CalibrateRequest request;
  *request.mutable_model() = spec.model();
  request.set_precision(spec.training().precision());
  request.set_rows(rows);
  request.set_repetitions(kCalibrationRepetitions);
  const std::vector<absl::StatusOr<pb::CalibrateResponse>> answers =
      AskAtOnce(AddressesOf(stages), [&](int) { return request; }, calibrate);
  std::vector<pb::CalibrateResponse> ok;
  for (int i = 0; i < n; ++i) {
    if (!answers[i].ok()) {
      return absl::Status(answers[i].status().code(),
                          absl::StrCat("calibrating ", stages[i].stage_id(), " (",
                                       stages[i].address(), "): ", answers[i].status().message()));
    }
    ok.push_back(*answers[i]);
  }
  AutoCosts costs{MedianRates(ok, std::min(1.0, static_cast<double>(slots) / n)),
                  absl::StrCat("calibrated on ", first.stage_id(), " (", first.device().name(),
                               ", ", rows, " rows a micro-batch, ", ok.front().repetitions(),
                               " rounds")};
  if (n > 1) {
    absl::StrAppend(&costs.source, "; with the ", n, " stages sharing its device busy at once, ",
                    slots, " at full speed");
  }
  absl::StrAppend(&costs.source, ")");
  absl::MutexLock lock(&mu_);
  cache_[key] = costs;
  return costs;
}

namespace {

std::string RingKey(const std::vector<pb::StageInfo>& stages, uint64_t bytes) {
  std::vector<std::string> ids;
  for (const pb::StageInfo& s : stages) ids.push_back(absl::StrCat(s.stage_id(), "@", s.address()));
  std::sort(ids.begin(), ids.end());
  std::string key = absl::StrCat(bytes);
  for (const std::string& id : ids) absl::StrAppend(&key, "|", id);
  return key;
}

}  // namespace

absl::StatusOr<CalibrationCache::RingCost> CalibrationCache::GetRing(
    const std::vector<pb::StageInfo>& stages, uint64_t bytes, const std::string& calibration_id,
    const Calibrate& calibrate) {
  const int n = static_cast<int>(stages.size());
  if (n < 2) return absl::InvalidArgumentError("a ring calibration needs two stages or more");
  const std::string key = RingKey(stages, bytes);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = rings_.find(key); it != rings_.end()) return it->second;
  }
  const std::vector<absl::StatusOr<pb::CalibrateResponse>> answers = AskAtOnce(
      AddressesOf(stages),
      [&](int i) {
        pb::CalibrateRequest request;
        request.set_repetitions(kCalibrationRepetitions);
        pb::RingCalibration& ring = *request.mutable_ring();
        ring.set_calibration_id(calibration_id);
        ring.set_rendezvous_prefix("ring/");
        ring.set_rank(i);
        ring.set_size(n);
        ring.set_bytes(bytes);
        return request;
      },
      calibrate);
  double slowest = 0;
  bool emulated = true;
  for (int i = 0; i < n; ++i) {
    if (!answers[i].ok()) {
      return absl::Status(answers[i].status().code(),
                          absl::StrCat("timing the replicas' all-reduce on ", n, " stages: ",
                                       stages[i].stage_id(), " (", stages[i].address(),
                                       "): ", answers[i].status().message()));
    }
    slowest = std::max(slowest, answers[i]->allreduce_s());
    emulated = emulated && answers[i]->emulated();
  }
  RingCost cost;
  cost.bytes_per_s = RingRateFromTime(static_cast<double>(bytes), n, slowest);
  cost.source = emulated
      ? absl::StrCat("the replicas' all-reduce free (", n, " emulated stages do not reduce)")
      : absl::StrFormat("the replicas' all-reduce at %.3g GB/s (%d stages, %.3g MiB in %.3g ms)",
                        cost.bytes_per_s / 1e9, n, static_cast<double>(bytes) / (1 << 20),
                        slowest * 1e3);
  absl::MutexLock lock(&mu_);
  rings_[key] = cost;
  return cost;
}

absl::StatusOr<CalibrationCache::TransferCost> CalibrationCache::GetTransfer(
    const pb::StageInfo& sender, const pb::StageInfo& receiver, uint64_t bytes,
    const std::string& calibration_id, const std::string& secret, const Calibrate& calibrate) {
  const std::string key = absl::StrCat(bytes, "|", sender.stage_id(), "@", sender.address(), "|",
                                       receiver.stage_id(), "@", receiver.address());
  {
    absl::MutexLock lock(&mu_);
    if (auto it = transfers_.find(key); it != transfers_.end()) return it->second;
  }
  const pb::StageInfo* ends[2] = {&sender, &receiver};
  const std::vector<absl::StatusOr<pb::CalibrateResponse>> answers = AskAtOnce(
      {sender.address(), receiver.address()},
      [&](int i) {
        pb::CalibrateRequest request;
        request.set_repetitions(kTransferRepetitions);
        pb::TransferCalibration& t = *request.mutable_transfer();
        t.set_calibration_id(calibration_id);
        t.set_peer_secret(secret);
        t.set_send(i == 0);
        if (i == 0) t.set_peer_address(receiver.address());
        t.set_bytes(bytes);
        return request;
      },
      calibrate);
  for (int i = 0; i < 2; ++i) {
    if (!answers[i].ok()) {
      return absl::Status(answers[i].status().code(),
                          absl::StrCat("timing a transfer from ", sender.stage_id(), " to ",
                                       receiver.stage_id(), ": ", ends[i]->stage_id(), " (",
                                       ends[i]->address(), "): ", answers[i].status().message()));
    }
  }
  TransferCost cost{answers[0]->transfer_s_per_byte(), answers[0]->send_busy_s(), ""};
  cost.source = absl::StrFormat(
      "transfers at %.3g GB/s and sends holding their stage %.3g ms (%.3g MiB from %s to %s)",
      cost.transfer_s_per_byte > 0 ? 1e-9 / cost.transfer_s_per_byte : 0.0,
      cost.send_busy_s * 1e3, static_cast<double>(bytes) / (1 << 20), sender.stage_id(),
      receiver.stage_id());
  absl::MutexLock lock(&mu_);
  transfers_[key] = cost;
  return cost;
}

}  // namespace pipetrain::coordinator
