// The coordinator's domain: jobs and stages. Submitted jobs are validated, recorded in
// the job store and queued; a scheduler thread starts each queued job as soon as enough
// free stages are registered (jobs run one after another on the same stages, or side by
// side on disjoint ones), and one thread per running job drives it (job_runner.h). The
// gRPC service and the HTTP API only translate to and from this class.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/auto/auto_schedule.h"
#include "coordinator/jobs/job_events.h"
#include "coordinator/jobs/job_recovery.h"
#include "coordinator/jobs/job_reporter.h"
#include "coordinator/runner/job_runner.h"
#include "coordinator/store/job_store.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "coordinator/runner/restart_rules.h"
#include "coordinator/auto/stage_calibration.h"
#include "coordinator/stages/stage_connection.h"
#include "coordinator/stages/stage_registry.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::coordinator {

struct ManagerOptions {
  std::string state_dir;  // jobs.db and checkpoints/JOB/step-N/
  // Where each job's TensorBoard event files go, in a JOB_ID folder; "" is
  // STATE_DIR/tensorboard.
  std::string tensorboard_dir;
  // Events of each running job kept in memory for its watchers (older: the store).
  size_t events_in_memory = kDefaultEventsInMemory;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // What Shutdown makes of the jobs running (--on-stop).
  OnStop on_stop = OnStop::kRecover;
  RunnerOptions runner;  // checkpoint_root is set per job
};

class JobManager {
 public:
  // Opens the store; jobs left QUEUED are queued again, and jobs a previous coordinator
  // left RUNNING or RECOVERING are continued (RECOVERING until their stages register
  // again) unless fault_tolerance.max_restarts is 0, which marks them FAILED.
  static absl::StatusOr<std::unique_ptr<JobManager>> Create(ManagerOptions options);
  ~JobManager();  // Shutdown()
  // Running jobs stop after their current step (with a checkpoint) and are recorded
  // RECOVERING, for the next coordinator to continue (FAILED, naming the checkpoint,
  // with fault_tolerance.max_restarts 0), or CANCELLED, naming the checkpoint, with
  // OnStop::kCancel; waits for their threads, which free their stages first (a stage
  // signalled with the coordinator serves until then: its heartbeat's `held`). Queued
  // jobs stay QUEUED in the store either way.
  void Shutdown();

  // Requests reach these calls checked by the service (request_checks.h: sizes, ids,
  // counts, a registration's fields); what is checked here is their meaning.
  //
  // INVALID_ARGUMENT naming the field for a bad spec, a corpus, token file or init_from
  // checkpoint the coordinator cannot read or that is malformed (naming the file), or a
  // model that does not fit the registered stages' memory.
  absl::StatusOr<std::string> Submit(pipetrain::v1::JobSpec spec);
  absl::StatusOr<pipetrain::v1::JobStatus> Get(const std::string& job_id, bool history);
  // The latest `limit` jobs (0 = all), most recent first, each with its latest step as
  // its history unless `latest_step` is false (one read per job that callers counting
  // states do not need).
  absl::StatusOr<std::vector<pipetrain::v1::JobStatus>> List(int limit,
                                                             bool latest_step = true);
  // A job's steps from `from_step` on, in order: what a metrics scrape needs of a long
  // job without reading its whole history.
  absl::StatusOr<std::vector<pipetrain::v1::StepRecord>> Steps(const std::string& job_id,
                                                               int64_t from_step);
  // A queued job ends at once; a running one after its current step (with a checkpoint).
  // An ended job is returned as it is.
  absl::StatusOr<pipetrain::v1::JobStatus> Cancel(const std::string& job_id);
  // Calls `sink` with the job's events from the start (steps from `from_step`), then
  // with new ones until the job ends (or at once with no_follow). Stops early when
  // `sink` returns false or `wanted` (asked about once a second) false: the client
  // went away.
  absl::Status Watch(const std::string& job_id, int64_t from_step, bool no_follow,
                     const std::function<bool(const pipetrain::v1::JobEvent&)>& sink,
                     const std::function<bool()>& wanted = [] { return true; });
  absl::StatusOr<pipetrain::v1::Timeline> Timeline(const std::string& job_id, int last_steps);
  // The simulator's prediction of the latest step (from the costs measured before it);
  // no events before the first step. Stored with each step, like the measured ones.
  absl::StatusOr<pipetrain::v1::Timeline> PredictedTimeline(const std::string& job_id);

  // `peer_identity` is the caller's TLS identity ("" without TLS), tied to the record
  // (StageRegistry::Register).
  absl::StatusOr<pipetrain::v1::RegisterStageResponse> RegisterStage(
      const pipetrain::v1::RegisterStageRequest& request, const std::string& peer_identity = "");
  pipetrain::v1::HeartbeatResponse Heartbeat(const pipetrain::v1::HeartbeatRequest& request);
  // The stages' collective rendezvous (RendezvousSet/Get); a job's keys are dropped
  // when it ends.
  RendezvousStore& rendezvous() { return rendezvous_; }
  pipetrain::v1::ClusterStatus Cluster();

 private:
  struct LiveJob;
  JobManager(ManagerOptions options, std::unique_ptr<JobStore> store);

  // Whether `spec` (whose plan options `options` are, from ValidatedPlanOptions) fits
  // the memory of the live stages with the most: refused naming what to change.
  absl::Status CheckFits(const pipetrain::v1::JobSpec& spec, planner::PlanOptions options);
  // pipeline.schedule "auto" (job_manager_auto.cc): the shape planned on the free stages
  // (all live ones when none is free) with costs calibrated on the free stages that
  // share the first one's device, all busy at once.
  absl::StatusOr<AutoChoice> PlanAuto(const pipetrain::v1::JobSpec& spec);
  // ... and the replicas' all-reduce timed on a ring of the free stages, into `costs`
  // (the links' rate, said in its source, when the ring fails).
  void TimeRing(const pipetrain::v1::JobSpec& spec,
                const std::vector<pipetrain::v1::StageInfo>& idle, StageConnector& connector,
                AutoCosts& costs);
  // ... and one transfer from the first free stage to the second, into `costs`' rates
  // (the links' rate, said in its source, when it fails).
  void TimeTransfer(const pipetrain::v1::JobSpec& spec,
                    const std::vector<pipetrain::v1::StageInfo>& idle, StageConnector& connector,
                    AutoCosts& costs);
  // `stored_logs`: the job's log lines already in the store (one queued by a previous
  // coordinator); 0 for a new job.
  void Enqueue(pipetrain::v1::JobStatus status, size_t stored_logs = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SchedulerLoop();
  // A job the store holds, as this coordinator starts (AtCoordinatorStart): queued
  // again, resumed (StartResuming) or recorded FAILED.
  absl::Status TakeOver(pipetrain::v1::JobStatus job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Its thread runs ResumeAfterRestart.
  void StartResuming(pipetrain::v1::JobStatus job, size_t stored_logs)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the job to its end, restarting it after a lost stage (job_recovery.h);
  // `resumed` continues a job a previous coordinator was running. The steps of a
  // job's life, in job_manager_runs.cc:
  void Drive(LiveJob* job, std::vector<StageRecord> stages,
             std::optional<Continuation> resumed = std::nullopt);
  // A job a previous coordinator was running: waits for its stages to register again
  // and continues it (Drive) from the newest state they or its checkpoint hold.
  void ResumeAfterRestart(LiveJob* job);
  pipetrain::v1::JobStatus StatusOf(LiveJob* job);
  // What restart_rules.h decides on, as the job is now.
  JobFacts FactsOf(LiveJob* job);
  // options_.runner for this job: its checkpoint folder, the stage connector.
  RunnerOptions RunnerOptionsFor(const std::string& job_id) const;
  JobReporter MakeReporter(LiveJob* job);
  JobRecovery MakeRecovery(LiveJob* job, const RunnerOptions& options);
  // The job's stages and RUNNING (a restart's record first).
  void StartRun(LiveJob* job, const Continuation& run, bool restarted);
  RunOutcome RunOnce(LiveJob* job, const Continuation& run, const RunnerOptions& options,
                     RunnerHooks& hooks);
  // Where the job continues after `out` lost a stage.
  absl::StatusOr<Continuation> Recover(LiveJob* job, JobRecovery& recovery,
                                       const Continuation& run, const RunOutcome& out);
  // After a coordinator restart, when MayResume.
  absl::StatusOr<Continuation> Resume(LiveJob* job, const LostRun& run);
  // Recovery.Recover; where the job cannot go on, a state it found newer than the job's
  // checkpoint is kept as the job's checkpoint (KeepAsCheckpoint), for resume.
  absl::StatusOr<Continuation> RecoverKeepingState(LiveJob* job, JobRecovery& recovery,
                                                   const LostRun& run);
  // Writes `state` under the job's checkpoints and makes it the job's checkpoint; a
  // failure is logged (the job keeps its older checkpoint).
  void KeepAsCheckpoint(LiveJob* job, const RestoredState& state, const std::string& root);
  // The job's stages as they register again, until all are back, the grace time is
  // over or the job is stopped.
  std::vector<std::optional<StageRecord>> AwaitStagesBack(LiveJob* job,
                                                          const pipetrain::v1::JobStatus& status);
  // Applies an ending verdict: the stages freed (`lost` marked lost), the state recorded.
  void Finish(LiveJob* job, const Verdict& verdict, const std::vector<std::string>& lost);
  void SetStages(LiveJob* job, const std::vector<StageRecord>& stages);
  // Records a new state (store, events); the last one also ends the event stream.
  void SetState(LiveJob* job, pipetrain::v1::JobStatus::State state, const std::string& reason);
  void Log(LiveJob* job, const std::string& text);
  // The same for a job whose id the caller holds; takes no lock of the manager's, so it
  // may be called with mu_ held.
  void LogAs(LiveJob* job, const std::string& id, const std::string& text);
  // Null once the job has ended and left memory (Retire): its record is in the store.
  std::shared_ptr<LiveJob> FindLive(const std::string& job_id);
  // The job's thread is done with it: an ended job leaves live_ (watchers that still
  // hold it keep it), and the scheduler joins its thread (ReapRetired).
  void Retire(const std::string& job_id);
  void ReapRetired();
  // For a watcher behind the events kept in memory: the log lines and steps it missed,
  // from the store, through `pass` (which counts them in logs_seen and last_step).
  absl::Status ReplayMissed(const std::string& job_id, int64_t from_step,
                            const JobEvents::Missed& missed, size_t* logs_seen,
                            int64_t* last_step,
                            const std::function<bool(const pipetrain::v1::JobEvent&)>& pass);
  // Steps whose timelines the store keeps per job: 20 measured (`pipetrain timeline
  // --steps`) and the latest prediction, the only one read (PredictedTimeline).
  static constexpr JobStore::TimelinesKept kTimelineSteps{.measured = 20, .predicted = 1};
  // How long a watcher waits after a batch of events before it reads the next.
  static constexpr absl::Duration kWatchBatch = absl::Milliseconds(20);

  const ManagerOptions options_;
  std::unique_ptr<JobStore> store_;
  RendezvousStore rendezvous_;  // the jobs' collective rendezvous keys, dropped as they end
  StageRegistry registry_;
  CalibrationCache calibrations_;  // per model shape and device, for "auto"

  absl::Mutex mu_;
  absl::CondVar wake_;  // a job was queued, a stage came or went, a job ended
  // The jobs queued or running (and the ended ones until their thread is done).
  std::map<std::string, std::shared_ptr<LiveJob>> live_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<LiveJob>> retired_ ABSL_GUARDED_BY(mu_);  // to join
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int resuming_ ABSL_GUARDED_BY(mu_) = 0;  // jobs still waiting for their old stages
  std::atomic<bool> shutting_down_{false};
  std::thread scheduler_;
};

}  // namespace pipetrain::coordinator
