#include "coordinator/stage_calibration.h"

#include "absl/strings/str_cat.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

std::string CalibrationKey(const pb::JobSpec& spec, const pb::DeviceInfo& device, int rows) {
  std::string model;
  spec.model().SerializeToString(&model);  // deterministic for one binary and message
  return absl::StrCat(model, "|", spec.training().precision(), "|", rows, "|", device.kind(),
                      "|", device.name(), "|", device.threads());
}

absl::StatusOr<AutoCosts> CalibrationCache::Get(const pb::JobSpec& spec,
                                                const pb::StageInfo& stage, int rows,
                                                const Calibrate& calibrate) {
  const std::string key = CalibrationKey(spec, stage.device(), rows);
  {
    absl::MutexLock lock(&mu_);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  }
  pb::CalibrateRequest request;
  *request.mutable_model() = spec.model();
  request.set_precision(spec.training().precision());
  request.set_rows(rows);
  request.set_repetitions(kCalibrationRepetitions);
  absl::StatusOr<pb::CalibrateResponse> r = calibrate(stage.address(), request);
  if (!r.ok()) {
    return absl::Status(r.status().code(), absl::StrCat("calibrating ", stage.stage_id(), " (",
                                                        stage.address(), "): ",
                                                        r.status().message()));
  }
  planner::CostRates rates;
  rates.forward_s_per_flop = r->forward_s_per_flop();
  rates.backward_input_s_per_flop = r->backward_input_s_per_flop();
  rates.backward_weight_s_per_flop = r->backward_weight_s_per_flop();
  rates.optimizer_s_per_param = r->optimizer_s_per_param();
  rates.steps = r->repetitions();
  AutoCosts costs{rates, absl::StrCat("calibrated on ", stage.stage_id(), " (",
                                      stage.device().name(), ", ", rows,
                                      " rows a micro-batch, ", r->repetitions(), " rounds)")};
  absl::MutexLock lock(&mu_);
  cache_[key] = costs;
  return costs;
}

}  // namespace pipetrain::coordinator
