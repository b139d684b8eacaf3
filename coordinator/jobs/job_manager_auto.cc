// JobManager::PlanAuto: pipeline.schedule "auto" at submit. Which stages the search may
// use and which one calibrates are the manager's to say; the planning itself is
// coordinator/auto/auto_schedule.h's and the cache coordinator/auto/stage_calibration.h's.
#include <atomic>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/logging.h"
#include "coordinator/stages/device_groups.h"
#include "coordinator/stages/grpc_stage_connector.h"
#include "coordinator/jobs/job_manager.h"

namespace pipetrain::coordinator {

namespace pb = ::pipetrain::v1;

namespace {
// A block's few passes take milliseconds on small models and seconds on large ones.
constexpr absl::Duration kCalibrationDeadline = absl::Seconds(60);
// How far back a job's measured runtime costs are looked for.
constexpr int kRecentJobs = 20;

// The first of `idle` and the free stages that share its device, which calibrate
// together; `slots`: how many of them the device runs at once.
std::vector<pb::StageInfo> SharingTheFirst(const std::vector<pb::StageInfo>& idle, int& slots) {
  std::vector<pb::DeviceInfo> devices;
  for (const pb::StageInfo& s : idle) devices.push_back(s.device());
  const planner::SharedDevices shared = GroupDevices(devices);
  if (shared.empty()) {
    slots = 1;
    return {idle.front()};
  }
  const int first = shared.of_server.front();
  slots = shared.slots[first];
  std::vector<pb::StageInfo> out;
  for (size_t i = 0; i < idle.size(); ++i) {
    if (shared.of_server[i] == first) out.push_back(idle[i]);
  }
  return out;
}
}  // namespace

void JobManager::TimeRing(const pb::JobSpec& spec, const std::vector<pb::StageInfo>& idle,
                          StageConnector& connector, AutoCosts& costs) {
  static std::atomic<int64_t> next{1};
  const std::string id = absl::StrCat("calibrate-", next++);
  absl::StatusOr<CalibrationCache::RingCost> ring = calibrations_.GetRing(
      idle, RingCalibrationBytes(spec), id,
      [&](const std::string& address, const pb::CalibrateRequest& request) {
        return connector.Connect(address)->Calibrate(request, kCalibrationDeadline);
      });
  rendezvous_.Forget(id);
  if (ring.ok()) {
    costs.collective_bytes_per_s = ring->bytes_per_s;
    absl::StrAppend(&costs.source, "; ", ring->source);
  } else {
    absl::StrAppend(&costs.source, "; the replicas' all-reduce at the links' rate (",
                    ring.status().message(), ")");
    common::LogWarning("coordinator", absl::StrCat("auto plan: ", ring.status().message()));
  }
}

void JobManager::TimeTransfer(const pb::JobSpec& spec, const std::vector<pb::StageInfo>& idle,
                              StageConnector& connector, AutoCosts& costs) {
  static std::atomic<int64_t> next{1};
  absl::BitGen gen;
  const std::string secret = absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                                             absl::Uniform<uint64_t>(gen));
  const uint64_t bytes =
      TransferCalibrationBytes(spec, CalibrationRows(spec, static_cast<int>(idle.size())));
  absl::StatusOr<CalibrationCache::TransferCost> t = calibrations_.GetTransfer(
      idle[0], idle[1], bytes, absl::StrCat("calibrate-link-", next++), secret,
      [&](const std::string& address, const pb::CalibrateRequest& request) {
        return connector.Connect(address)->Calibrate(request, kCalibrationDeadline);
      });
  if (t.ok() && t->transfer_s_per_byte > 0) {
    costs.rates->transfer_s_per_byte = t->transfer_s_per_byte;
    costs.rates->send_busy_s = t->send_busy_s;
    absl::StrAppend(&costs.source, "; ", t->source);
    return;
  }
  const std::string why = t.ok() ? "the transfer took no time" : std::string(t.status().message());
  absl::StrAppend(&costs.source, "; transfers at the links' rate (", why, ")");
  common::LogWarning("coordinator", absl::StrCat("auto plan: ", why));
}

absl::StatusOr<AutoChoice> JobManager::PlanAuto(const pb::JobSpec& spec) {
  std::vector<pb::StageInfo> idle, live;
  for (const pb::StageInfo& s : registry_.Snapshot()) {
    if (s.state() == pb::StageInfo::LOST) continue;
    live.push_back(s);
    if (s.state() == pb::StageInfo::IDLE) idle.push_back(s);
  }
  // The stages it will run on: the free ones, or, while every stage is busy, all of
  // them (the job then waits in the queue for the shape chosen).
  const std::vector<pb::StageInfo>& pool = idle.empty() ? live : idle;
  std::vector<pb::DeviceInfo> devices;
  for (const pb::StageInfo& s : pool) devices.push_back(s.device());
  AutoCosts costs{std::nullopt, "the devices' FLOP rates (no free stage to calibrate)"};
  if (!idle.empty()) {
    std::shared_ptr<StageConnector> connector =
        ConnectorOrGrpc(options_.runner.connector, options_.runner.security);
    int slots = 1;
    const std::vector<pb::StageInfo> sharing = SharingTheFirst(idle, slots);
    absl::StatusOr<AutoCosts> calibrated = calibrations_.Get(
        spec, sharing, slots,
        CalibrationRows(spec, static_cast<int>(devices.size())),
        [&](const std::string& address, const pb::CalibrateRequest& request) {
          return connector->Connect(address)->Calibrate(request, kCalibrationDeadline);
        });
    if (calibrated.ok()) {
      costs = *std::move(calibrated);
      if (idle.size() > 1) TimeTransfer(spec, idle, *connector, costs);
      if (idle.size() > 1 && spec.training().batch_size() > 1) TimeRing(spec, idle, *connector, costs);
      // The runtime's costs from the newest job that measured them on this cluster.
      if (absl::StatusOr<std::vector<pb::JobStatus>> recent = store_->List(kRecentJobs);
          recent.ok()) {
        AddRuntimeCosts(*recent, costs);
      }
    } else {
      costs.source = absl::StrCat("the devices' FLOP rates (", calibrated.status().message(), ")");
      common::LogWarning("coordinator", absl::StrCat("auto plan: ", costs.source));
    }
  }
  return ChooseAutoPlan(spec, devices, costs);
}

}  // namespace pipetrain::coordinator
