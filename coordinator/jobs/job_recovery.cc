#include "coordinator/jobs/job_recovery.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_state.h"
#include "common/model/checkpoint_folder.h"
#include "common/model/precision.h"
#include "common/model/split_checkpoint.h"
#include "common/status_macros.h"
#include "coordinator/jobs/job_manager_internal.h"
#include "coordinator/spec/job_spec.h"
#include "coordinator/stages/placement.h"
#include "coordinator/runner/restart_rules.h"
#include "coordinator/planner/planner.h"
#include "coordinator/runner/snapshot_choice.h"
#include "coordinator/stages/stage_costs.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;

// The step of a checkpoint folder the runner named ROOT/step-N; 0 for none.
int64_t CheckpointStep(const std::string& dir) {
  return model::CheckpointFolderStep(dir).value_or(0);
}


// The precision the job trains in: its snapshots' (a stage's export leaves the default).
std::string PrecisionOf(const pb::JobSpec& spec) {
  absl::StatusOr<model::Precision> p = model::PrecisionNamed(spec.training().precision());
  return p.ok() ? std::string(p->name) : model::kCheckpointDefaultPrecision;
}

std::string Stages(size_t n) { return absl::StrCat(n, n == 1 ? " stage" : " stages"); }

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// What a stage holds of the job's snapshots (of the layout it ran).
absl::StatusOr<std::vector<SnapshotEntry>> ListEntries(StageConnection& client,
                                                       const std::string& job_id, int stages,
                                                       absl::Duration deadline) {
  ASSIGN_OR_RETURN(std::vector<pb::SnapshotInfo> infos, client.ListSnapshots(job_id, deadline));
  std::vector<SnapshotEntry> out;
  for (const pb::SnapshotInfo& i : infos) {
    if (i.num_stages() != stages) continue;  // a layout before this one
    out.push_back({i.owner_stage(), static_cast<int>(i.chunk()), i.step(), i.held()});
  }
  return out;
}

}  // namespace

LostRun LostRunOf(const pb::JobStatus& status, std::string checkpoint_root, pb::JobSpec spec,
                  std::vector<StageRecord> stages, std::vector<std::string> lost,
                  int64_t failed_step, bool stages_hold_state) {
  LostRun run;
  run.job_id = status.job_id();
  run.spec = std::move(spec);
  run.stages = std::move(stages);
  run.lost = std::move(lost);
  run.failed_step = failed_step;
  run.stages_hold_state = stages_hold_state;
  run.checkpoint_dir = status.checkpoint_dir();
  run.checkpoint_root = std::move(checkpoint_root);
  run.restart = status.recoveries_size() + 1;
  return run;
}

LostRun LostRunAfterRestart(const pb::JobStatus& status,
                            const std::vector<std::optional<StageRecord>>& back,
                            std::string checkpoint_root) {
  const int k = static_cast<int>(back.size());
  std::vector<StageRecord> stages;
  std::vector<std::string> lost;
  for (int i = 0; i < k; ++i) {
    if (back[i]) {
      stages.push_back(*back[i]);
      continue;
    }
    // Not back: lost. Its old id may name another stage in this coordinator's registry.
    StageRecord gone;
    gone.address = i < status.stage_addresses_size() ? status.stage_addresses(i) : "";
    gone.stage_id = absl::StrCat(i < status.stage_ids_size() ? status.stage_ids(i) : "stage",
                                 " (", gone.address, ")");
    stages.push_back(gone);
    lost.push_back(gone.stage_id);
  }
  return LostRunOf(status, std::move(checkpoint_root), SpecForStageServers(status.spec(), k),
                   std::move(stages), std::move(lost), status.steps_done() + 1,
                   /*stages_hold_state=*/true);
}

JobRecovery::JobRecovery(StageRegistry& registry, std::shared_ptr<StageConnector> connector,
                         absl::Duration rpc_deadline, absl::Duration poll,
                         std::function<void(const std::string&)> log, std::function<bool()> stop)
    : registry_(registry), connector_(std::move(connector)), rpc_deadline_(rpc_deadline),
      poll_(poll), log_(std::move(log)), stop_(std::move(stop)) {}

bool NewerThanCheckpoint(const RestoredState& state, const std::string& checkpoint_dir) {
  return state.step > CheckpointStep(checkpoint_dir);
}

absl::StatusOr<std::string> WriteAsCheckpoint(const RestoredState& state,
                                              const std::string& checkpoint_root) {
  const std::string dir = absl::StrCat(checkpoint_root, "/step-", state.step);
  ASSIGN_OR_RETURN(std::string bytes, model::SerializeCheckpoint(state.whole));
  RETURN_IF_ERROR(model::WriteCheckpointFolder(dir, {{0, 0, std::move(bytes)}}, 1));
  return dir;
}

Recovered JobRecovery::Recover(const LostRun& run) {
  pb::Recovery record;
  SetNow(record.mutable_lost());
  std::vector<std::string> lost = run.lost;
  for (const std::string& id : lost) {
    registry_.MarkLost(id);
    registry_.ReleaseStage(run.job_id, id);  // free for the job when it comes back
  }
  std::vector<int> survivors;
  for (int i = 0; i < static_cast<int>(run.stages.size()); ++i) {
    if (std::find(lost.begin(), lost.end(), run.stages[i].stage_id) == lost.end()) {
      survivors.push_back(i);
    }
  }
  Source source = FindState(run, survivors, lost);
  std::optional<Continuation> next = FindStages(run, survivors, lost);
  const std::string who = absl::StrJoin(lost, " and ");
  if (!next) {
    const absl::Status why =
        stop_() ? absl::CancelledError(absl::StrCat("stopped while recovering from ", who,
                                                    " lost at step ", run.failed_step))
                : absl::UnavailableError(absl::StrCat(
                      who, " lost at step ", run.failed_step,
                      ": no free stage took its place within ",
                      run.spec.fault_tolerance().wait_for_stages_s(),
                      " s (fault_tolerance.wait_for_stages_s) and the model does not fit the ",
                      Stages(survivors.size()), " left"));
    return Recovered{.next = why, .stranded = std::move(source.restored)};
  }
  next->restored = std::move(source.restored);
  const int64_t from = next->restored ? next->restored->step : 0;
  for (const std::string& id : lost) record.add_lost_stage_ids(id);
  record.set_failed_step(run.failed_step);
  record.set_restored_step(from);
  record.set_source(source.what);
  record.set_stages(static_cast<int32_t>(next->stages.size()));
  record.set_replicas(std::max(1, next->spec.pipeline().replicas()));
  next->record = record;
  const std::string on = common::JobLayoutText(run.spec.pipeline().replicas(),
                                std::max(1, next->spec.pipeline().replicas()), next->stages.size());
  log_(absl::StrCat(who, " lost at step ", run.failed_step, ": restarting from ",
                    from > 0 ? absl::StrCat("step ", from) : std::string("the start"), " on ",
                    on, " (restart ", run.restart, " of ",
                    run.spec.fault_tolerance().max_restarts(), "; from ", source.what, ")"));
  return Recovered{.next = *std::move(next), .stranded = std::nullopt};
}

JobRecovery::Source JobRecovery::FindState(const LostRun& run, std::vector<int>& survivors,
                                           std::vector<std::string>& lost) {
  const bool snapshots = run.stages_hold_state && run.spec.checkpoint().snapshot_every_steps() > 0;
  std::vector<std::vector<SnapshotEntry>> listings;
  std::vector<int> answered;
  for (int i : survivors) {
    const StageRecord& stage = run.stages[i];
    std::unique_ptr<StageConnection> client = connector_->Connect(stage.address);
    absl::Status alive = client->Ping(absl::Seconds(5));
    if (!alive.ok()) {
      // Lost as well (two stages at once): it cannot be continued on.
      log_(absl::StrCat(stage.stage_id, " at ", stage.address, " does not answer either (",
                        alive.message(), ")"));
      lost.push_back(stage.stage_id);
      registry_.MarkLost(stage.stage_id);
      registry_.ReleaseStage(run.job_id, stage.stage_id);
      continue;
    }
    answered.push_back(i);
    listings.emplace_back();
    if (!snapshots) continue;
    absl::StatusOr<std::vector<SnapshotEntry>> listing =
        ListEntries(*client, run.job_id, run.spec.pipeline().stages(), absl::Seconds(10));
    if (listing.ok()) {
      listings.back() = *std::move(listing);
    } else {
      log_(absl::StrCat(stage.stage_id, ": its snapshots cannot be listed: ",
                        listing.status().message()));
    }
  }
  survivors = answered;

  std::optional<RestoredState> snap;
  if (snapshots) snap = FromSnapshots(run, survivors, listings);
  const int64_t disk_step = CheckpointStep(run.checkpoint_dir);
  if (snap && snap->step >= disk_step) return {std::move(snap), "the stages' snapshots"};
  if (disk_step > 0) {
    absl::StatusOr<model::Checkpoint> whole =
        model::LoadWholeCheckpoint(run.checkpoint_dir, "checkpoint");
    if (whole.ok() && whole->optimizer) {
      const int64_t step = whole->optimizer->step;
      const std::string what = absl::StrCat("checkpoint ", run.checkpoint_dir);
      return {RestoredState{step, *std::move(whole), what}, what};
    }
    log_(absl::StrCat("the checkpoint ", run.checkpoint_dir, " cannot be restored: ",
                      whole.ok() ? "it holds no optimizer state" : whole.status().message()));
  }
  if (snap) return {std::move(snap), "the stages' snapshots"};
  return {std::nullopt, "the start"};
}

namespace {

// One replica's snapshots as ChooseSnapshotStep takes them: listings, and the survivor
// (index into the recovery's listings) each came from.
struct ReplicaListings {
  std::vector<size_t> holders;
  std::vector<std::vector<SnapshotEntry>> listings;
};

// The survivors' snapshots by the replica whose state they are (`groups` 1: all one). A
// holder's own snapshots are of its replica, and so is what it holds for its ring
// predecessor, except in a one-stage job whose copies split the optimizer: there the
// previous replica's stage pushed them (JobConfig::SnapshotsRingReplicas).
std::vector<ReplicaListings> ByReplica(const std::vector<std::vector<SnapshotEntry>>& listings,
                                       const std::vector<int>& survivors, int k, int groups) {
  std::vector<ReplicaListings> out(groups);
  for (size_t h = 0; h < listings.size(); ++h) {
    const int r = groups == 1 ? 0 : survivors[h] / k;
    for (bool held : {false, true}) {
      const int g = held && k == 1 && groups > 1 ? (r + groups - 1) % groups : r;
      std::vector<SnapshotEntry> entries;
      for (const SnapshotEntry& e : listings[h]) {
        if (e.held == held) entries.push_back(e);
      }
      if (entries.empty()) continue;
      out[g].holders.push_back(h);
      out[g].listings.push_back(std::move(entries));
    }
  }
  return out;
}

}  // namespace

std::optional<RestoredState> JobRecovery::FromSnapshots(
    const LostRun& run, const std::vector<int>& survivors,
    const std::vector<std::vector<SnapshotEntry>>& listings) {
  const int k = run.spec.pipeline().stages();
  const int chunks = std::max(1, run.spec.pipeline().chunks());
  // With replicas, every replica's snapshots are of the same state, except where the
  // copies split the optimizer: each holds its own pieces of the moments, so every
  // replica's are needed, of one step, joined.
  const int groups = SplitsOptimizer(run.spec) ? run.spec.pipeline().replicas() : 1;
  const std::vector<ReplicaListings> by_replica = ByReplica(listings, survivors, k, groups);
  std::vector<SnapshotChoice> choices(groups);
  for (int64_t step = run.failed_step - 1;;) {
    int64_t newest_common = step;
    for (int g = 0; g < groups; ++g) {
      std::optional<SnapshotChoice> choice =
          ChooseSnapshotStep(by_replica[g].listings, k, chunks, step);
      if (!choice) {
        if (std::any_of(listings.begin(), listings.end(), [](const auto& l) { return !l.empty(); })) {
          log_(absl::StrCat("the surviving stages' snapshots do not hold every stage's state at "
                            "any one step",
                            groups > 1 ? absl::StrCat(" for replica ", g, " (its copies split "
                                                      "the optimizer, so each replica's are needed)")
                                       : std::string()));
        }
        return std::nullopt;
      }
      choices[g] = *std::move(choice);
      newest_common = std::min(newest_common, choices[g].step);
    }
    if (std::all_of(choices.begin(), choices.end(),
                    [&](const SnapshotChoice& c) { return c.step == newest_common; })) {
      break;
    }
    step = newest_common;
  }
  std::vector<model::Checkpoint> wholes;
  for (int g = 0; g < groups; ++g) {
    absl::StatusOr<model::Checkpoint> whole = AssembleSnapshot(
        choices[g],
        [&](const SnapshotPick& pick) -> absl::StatusOr<std::string> {
          std::unique_ptr<StageConnection> client =
              connector_->Connect(run.stages[survivors[by_replica[g].holders[pick.holder]]].address);
          return client->FetchSnapshot(run.job_id, pick.owner_stage, pick.chunk, choices[g].step,
                                       pick.held, rpc_deadline_);
        },
        run.job_id);
    if (!whole.ok()) {
      log_(std::string(whole.status().message()));
      return std::nullopt;
    }
    wholes.push_back(*std::move(whole));
  }
  absl::StatusOr<model::Checkpoint> joined =
      groups == 1 ? std::move(wholes[0])
                  : model::JoinCopies(std::move(wholes),
                                      absl::StrCat("job '", run.job_id, "': the replicas' snapshots "
                                                   "of step ", choices[0].step));
  if (!joined.ok()) {
    log_(std::string(joined.status().message()));
    return std::nullopt;
  }
  joined->precision = PrecisionOf(run.spec);
  return RestoredState{choices[0].step, *std::move(joined), "the stages' snapshots"};
}

std::optional<Continuation> JobRecovery::FindStages(const LostRun& run,
                                                    const std::vector<int>& survivors,
                                                    const std::vector<std::string>& lost) {
  const int k = static_cast<int>(run.stages.size());
  const int missing = k - static_cast<int>(survivors.size());
  // A replacement needs as much memory as the least of the stages it replaces had.
  uint64_t need = 0;
  bool first = true;
  for (const StageRecord& s : run.stages) {
    if (std::find(lost.begin(), lost.end(), s.stage_id) == lost.end()) continue;
    const uint64_t m = s.device.memory_bytes();
    need = first ? m : std::min(need, m);
    first = false;
  }
  auto with_replacements = [&](std::vector<StageRecord> replacements) {
    Continuation next;
    next.spec = run.spec;
    size_t r = 0;
    for (int i = 0; i < k; ++i) {
      const bool survived = std::find(survivors.begin(), survivors.end(), i) != survivors.end();
      next.stages.push_back(survived ? run.stages[i] : replacements[r++]);
    }
    return next;
  };
  if (missing == 0) return with_replacements({});
  if (auto free = registry_.Acquire(run.job_id, missing, need)) return with_replacements(*free);
  // Re-planned on the survivors: a single pipeline only (replicas go on fewer, below).
  if (!survivors.empty() && std::max(1, run.spec.pipeline().replicas()) == 1) {
    Continuation next;
    next.spec = run.spec;
    next.spec.mutable_pipeline()->set_stages(static_cast<int32_t>(survivors.size()));
    for (int i : survivors) next.stages.push_back(run.stages[i]);
    if (Fits(next.spec, next.stages)) return next;
  }
  // Fewer replicas: a wait is only for when no replica can go on alone.
  std::string why = absl::StrCat("the model does not fit the ", Stages(survivors.size()), " left");
  if (std::max(1, run.spec.pipeline().replicas()) > 1) {
    if (std::optional<Continuation> fewer = OnFewerReplicas(run, survivors, why)) return fewer;
  }
  const absl::Duration wait = absl::Seconds(run.spec.fault_tolerance().wait_for_stages_s());
  const absl::Time deadline = absl::Now() + wait;
  log_(absl::StrCat("waiting up to ", absl::FormatDuration(wait), " for ", missing,
                    " free stage", missing == 1 ? "" : "s", " (", why, ")"));
  while (!stop_() && absl::Now() < deadline) {
    absl::SleepFor(std::min(poll_, std::max(deadline - absl::Now(), absl::ZeroDuration())));
    if (auto free = registry_.Acquire(run.job_id, missing, need)) return with_replacements(*free);
  }
  return std::nullopt;
}

std::optional<Continuation> JobRecovery::OnFewerReplicas(const LostRun& run,
                                                         const std::vector<int>& survivors,
                                                         std::string& why) {
  const int replicas = std::max(1, run.spec.pipeline().replicas());
  const int k = run.spec.pipeline().stages();
  std::vector<int> whole;  // the replicas that lost none of their stages
  for (int r = 0; r < replicas; ++r) {
    bool all = true;
    for (int s = 0; s < k; ++s) all = all && Contains(survivors, r * k + s);
    if (all) whole.push_back(r);
  }
  if (whole.empty()) {
    why = absl::StrCat("each of the ", replicas, " replicas lost a stage");
    return std::nullopt;
  }
  const int64_t batch = run.spec.training().batch_size();
  const int m = std::max(1, run.spec.pipeline().micro_batches());
  // The most replicas the batch still splits over and the model fits (the data of a
  // step depends only on the seed and the step, so any R' gives the same losses).
  for (int n = static_cast<int>(whole.size()); n >= 1; --n) {
    if (batch % (static_cast<int64_t>(n) * m) != 0) continue;
    Continuation next;
    next.spec = run.spec;
    next.spec.mutable_pipeline()->set_replicas(n);
    for (int i = 0; i < n; ++i) {
      for (int s = 0; s < k; ++s) next.stages.push_back(run.stages[whole[i] * k + s]);
    }
    if (!Fits(next.spec, next.stages)) continue;
    next.stages = PlaceReplicas(std::move(next.stages), n, k);
    // The other survivors go back to the registry: free for the next job.
    std::vector<std::string> freed;
    for (int i : survivors) {
      const std::string& id = run.stages[i].stage_id;
      const bool kept = std::any_of(next.stages.begin(), next.stages.end(),
                                    [&](const StageRecord& s) { return s.stage_id == id; });
      if (kept) continue;
      registry_.ReleaseStage(run.job_id, id);
      freed.push_back(id);
    }
    log_(absl::StrCat("no free stage takes the lost one's place: continuing on ", n, " of the ",
                      replicas, " replicas (training.batch_size ", batch, " = ", n, " x ", m,
                      " micro-batches x ", batch / (static_cast<int64_t>(n) * m), ")",
                      freed.empty() ? std::string()
                                    : absl::StrCat("; freed ", absl::StrJoin(freed, ", "))));
    if (n > 1) log_(DescribePlacement(next.stages, n, k));
    return next;
  }
  why = absl::StrCat("training.batch_size ", batch, " does not split over the ", whole.size(),
                     " whole replica", whole.size() == 1 ? "" : "s", " left in ", m,
                     " micro-batches each, or the model does not fit them");
  return std::nullopt;
}

bool JobRecovery::Fits(const pb::JobSpec& spec, const std::vector<StageRecord>& stages) const {
  if (!ValidateJobSpec(spec).ok()) return false;
  absl::StatusOr<planner::PlanOptions> po = planner::OptionsFromJobSpec(spec);
  if (!po.ok()) return false;
  std::vector<pb::DeviceInfo> devices;
  for (const StageRecord& s : stages) devices.push_back(s.device);
  SetCostsFromDevices(devices, *po);  // the memory cap is the least stage's
  return planner::MakePlan(*po).ok();
}

}  // namespace pipetrain::coordinator
