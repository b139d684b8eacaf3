#include "coordinator/metrics/prometheus_metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/job_state.h"
#include "coordinator/metrics/prometheus_text.h"
#include "google/protobuf/util/time_util.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using google::protobuf::util::TimeUtil;

void AddJobStates(const std::vector<pb::JobStatus>& jobs, std::string& out) {
  MetricFamily family("pipetrain_jobs", "Jobs known to the coordinator, by state.");
  for (int s = pb::JobStatus::QUEUED; s <= pb::JobStatus::State_MAX; ++s) {
    const auto state = static_cast<pb::JobStatus::State>(s);
    const auto n = std::count_if(jobs.begin(), jobs.end(),
                                 [state](const pb::JobStatus& j) { return j.state() == state; });
    family.Add({{"state", pb::JobStatus::State_Name(state)}}, static_cast<double>(n));
  }
  family.AppendTo(out);
}

void AddStages(const pb::ClusterStatus& cluster, absl::Time now, std::string& out) {
  MetricFamily states("pipetrain_stages", "Registered stage servers, by state.");
  for (int s = pb::StageInfo::IDLE; s <= pb::StageInfo::LOST; ++s) {
    const auto state = static_cast<pb::StageInfo::State>(s);
    const auto n = std::count_if(cluster.stages().begin(), cluster.stages().end(),
                                 [state](const pb::StageInfo& i) { return i.state() == state; });
    states.Add({{"state", pb::StageInfo::State_Name(state)}}, static_cast<double>(n));
  }
  MetricFamily age("pipetrain_stage_heartbeat_age_seconds",
                   "Seconds since the stage's last heartbeat reached the coordinator.");
  MetricFamily memory("pipetrain_stage_memory_bytes",
                      "Device memory the stage may use, as it reported when registering.");
  for (const pb::StageInfo& stage : cluster.stages()) {
    MetricLabels labels = {{"stage_id", stage.stage_id()}, {"address", stage.address()}};
    if (stage.has_last_heartbeat()) {
      const absl::Time beat =
          absl::FromUnixMicros(TimeUtil::TimestampToMicroseconds(stage.last_heartbeat()));
      age.Add(labels, absl::ToDoubleSeconds(std::max(now - beat, absl::ZeroDuration())));
    }
    if (stage.device().memory_bytes() > 0) {
      memory.Add(labels, static_cast<double>(stage.device().memory_bytes()));
    }
  }
  states.AppendTo(out);
  age.AppendTo(out);
  memory.AppendTo(out);
}

// The per-job families, each filled across jobs so a family's samples stay together.
struct JobFamilies {
  MetricFamily info{"pipetrain_job_info",
                    "1 for each job with series; its state and schedule as labels."};
  MetricFamily steps_done{"pipetrain_job_steps_done", "Optimizer steps the job has finished."};
  MetricFamily steps_planned{"pipetrain_job_steps_planned",
                             "The job's last step (steps count the training run's: one past "
                             "an init_from checkpoint's, plus training.steps)."};
  MetricFamily restarts{"pipetrain_job_restarts",
                        "Automatic restarts of the job after a lost stage or a coordinator "
                        "restart."};
  MetricFamily loss{"pipetrain_job_loss", "Mean training loss of the job's latest step."};
  MetricFamily val_loss{"pipetrain_job_validation_loss",
                        "The job's latest validation loss (only once one was measured)."};
  MetricFamily step_seconds{"pipetrain_job_step_seconds", "Wall time of the job's latest step."};
  MetricFamily tokens{"pipetrain_job_tokens_per_second",
                      "Training tokens per second of wall time in the job's latest step."};
  MetricFamily bubble{"pipetrain_job_bubble_fraction",
                      "Idle fraction of stage time in the latest step: measured, and as the "
                      "planner's simulator predicted it."};
  MetricFamily peak_memory{"pipetrain_job_stage_peak_memory_bytes",
                           "Peak memory of each pipeline stage in the latest step (weights, "
                           "optimizer state and activations)."};
  MetricFamily peak_activations{"pipetrain_job_stage_peak_activation_bytes",
                                "Peak stored activations of each pipeline stage in the "
                                "latest step."};

  void Add(const pb::JobStatus& job) {
    const MetricLabels id = {{"job_id", job.job_id()}, {"name", job.spec().name()}};
    MetricLabels info_labels = id;
    info_labels.emplace_back("state", pb::JobStatus::State_Name(job.state()));
    info_labels.emplace_back("schedule", job.spec().pipeline().schedule());
    info.Add(info_labels, 1);
    steps_done.Add(id, static_cast<double>(job.steps_done()));
    steps_planned.Add(id, static_cast<double>(common::JobLastStep(job)));
    restarts.Add(id, static_cast<double>(job.recoveries_size()));
    auto with_val = std::find_if(job.history().rbegin(), job.history().rend(),
                                 [](const pb::StepRecord& r) { return r.has_val_loss(); });
    if (with_val != job.history().rend()) val_loss.Add(id, with_val->val_loss());
    if (job.history().empty()) return;
    const pb::StepRecord& last = *job.history().rbegin();
    loss.Add(id, last.loss());
    step_seconds.Add(id, last.step_time_s());
    tokens.Add(id, last.tokens_per_s());
    MetricLabels measured = id, predicted = id;
    measured.emplace_back("kind", "measured");
    predicted.emplace_back("kind", "predicted");
    bubble.Add(measured, last.bubble_measured());
    bubble.Add(predicted, last.bubble_predicted());
    for (const pb::StageStepStats& stage : last.stages()) {
      MetricLabels labels = id;
      labels.emplace_back("stage", absl::StrCat(stage.stage()));
      peak_memory.Add(labels, static_cast<double>(stage.peak_memory_bytes()));
      peak_activations.Add(labels, static_cast<double>(stage.peak_activation_bytes()));
    }
  }

  void AppendTo(std::string& out) const {
    for (const MetricFamily* f : {&info, &steps_done, &steps_planned, &restarts, &loss, &val_loss,
                                  &step_seconds, &tokens, &bubble, &peak_memory,
                                  &peak_activations}) {
      f->AppendTo(out);
    }
  }
};

}  // namespace

std::vector<size_t> JobsWithSeries(const std::vector<pb::JobStatus>& jobs) {
  std::vector<size_t> ended;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (common::JobEnded(jobs[i].state())) ended.push_back(i);
  }
  std::stable_sort(ended.begin(), ended.end(), [&jobs](size_t a, size_t b) {
    return jobs[b].finished() < jobs[a].finished();
  });
  if (ended.size() > kEndedJobsWithSeries) ended.resize(kEndedJobsWithSeries);
  std::vector<size_t> out;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].state() == pb::JobStatus::RUNNING ||
        std::find(ended.begin(), ended.end(), i) != ended.end()) {
      out.push_back(i);
    }
  }
  return out;
}

int64_t FirstStepForMetrics(const pb::JobStatus& job) {
  const int64_t every = std::max(job.spec().data().validate_every_steps(), 1);
  return std::max<int64_t>(1, job.steps_done() - every + 1);
}

std::string PrometheusMetrics(const MetricsInput& input) {
  std::string out;
  MetricFamily build("pipetrain_build_info", "1; the coordinator's pipetrain version as a label.");
  build.Add({{"version", input.version}}, 1);
  build.AppendTo(out);
  AddJobStates(input.jobs, out);
  AddStages(input.cluster, input.now, out);
  JobFamilies families;
  for (size_t i : JobsWithSeries(input.jobs)) families.Add(input.jobs[i]);
  families.AppendTo(out);
  return out;
}

}  // namespace pipetrain::coordinator
