#include "coordinator/metrics/prometheus_metrics.h"

#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/metrics/prometheus_text.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/time_util.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using google::protobuf::util::TimeUtil;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

pb::StepRecord Step(int64_t step, double loss) {
  pb::StepRecord r;
  r.set_step(step);
  r.set_loss(loss);
  r.set_step_time_s(0.25);
  r.set_tokens_per_s(512);
  r.set_bubble_measured(0.5);
  r.set_bubble_predicted(0.375);
  for (int s = 0; s < 2; ++s) {
    pb::StageStepStats* st = r.add_stages();
    st->set_stage(s);
    st->set_peak_memory_bytes(1000 + s);
    st->set_peak_activation_bytes(200 + s);
  }
  return r;
}

pb::JobStatus Job(const std::string& id, pb::JobStatus::State state, int64_t finished_s = 0) {
  pb::JobStatus j;
  j.set_job_id(id);
  j.set_state(state);
  j.mutable_spec()->set_name("plain");
  j.mutable_spec()->mutable_pipeline()->set_schedule("1f1b");
  j.mutable_spec()->mutable_training()->set_steps(10);
  if (finished_s > 0) *j.mutable_finished() = TimeUtil::SecondsToTimestamp(finished_s);
  return j;
}

pb::StageInfo Stage(const std::string& id, pb::StageInfo::State state, int64_t beat_s,
                    uint64_t memory) {
  pb::StageInfo s;
  s.set_stage_id(id);
  s.set_address("127.0.0.1:7501");
  s.set_state(state);
  s.mutable_device()->set_memory_bytes(memory);
  *s.mutable_last_heartbeat() = TimeUtil::SecondsToTimestamp(beat_s);
  return s;
}

// A running job at step 3 of 10 (validation at step 2), a queued one, a failed one
// without steps, and two stages.
MetricsInput Fixture() {
  MetricsInput in;
  in.now = kNow;
  in.version = "0.1.0";
  pb::JobStatus running = Job("job-000003", pb::JobStatus::RUNNING);
  running.mutable_spec()->set_name("say \"hi\"\\ to\nall");
  running.set_steps_done(3);
  *running.add_history() = Step(2, 4.5);
  running.mutable_history(0)->set_has_val_loss(true);
  running.mutable_history(0)->set_val_loss(4.75);
  *running.add_history() = Step(3, 4.25);
  in.jobs.push_back(running);
  in.jobs.push_back(Job("job-000002", pb::JobStatus::QUEUED));
  in.jobs.push_back(Job("job-000001", pb::JobStatus::FAILED, 1'699'999'000));
  *in.cluster.add_stages() = Stage("stage-1", pb::StageInfo::BUSY, 1'699'999'998, 1 << 30);
  *in.cluster.add_stages() = Stage("stage-2", pb::StageInfo::IDLE, 1'699'999'999, 0);
  return in;
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

// The metric name of a sample or of a HELP/TYPE line.
std::string FamilyOf(const std::string& line) {
  if (line.rfind("# ", 0) == 0) {
    std::vector<std::string> words = absl::StrSplit(line, ' ');
    return words.size() > 2 ? words[2] : "";
  }
  return line.substr(0, line.find_first_of("{ "));
}

TEST(PrometheusMetricsTest, EveryLineIsACommentOrANameLabelsValueSample) {
  const std::string text = PrometheusMetrics(Fixture());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const std::regex sample(
      R"re(^[a-zA-Z_:][a-zA-Z0-9_:]*(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")re"
      R"re((,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*")*\})? )re"
      R"re(([-+]?[0-9]*\.?[0-9]+([eE][-+]?[0-9]+)?|NaN|[-+]Inf)$)re");
  const std::regex comment(R"(^# (HELP|TYPE) pipetrain_[a-z_]+ .+$)");
  for (const std::string& line : Lines(text)) {
    if (line[0] == '#') {
      EXPECT_TRUE(std::regex_match(line, comment)) << line;
    } else {
      EXPECT_TRUE(std::regex_match(line, sample)) << line;
      EXPECT_EQ(line.rfind("pipetrain_", 0), 0u) << line;
    }
  }
}

TEST(PrometheusMetricsTest, EachFamilyHasOneHelpAndOneTypeThenAllItsSamples) {
  const std::vector<std::string> lines = Lines(PrometheusMetrics(Fixture()));
  std::map<std::string, int> helps, types;
  std::set<std::string> closed;  // families whose block has ended
  std::string current;
  for (const std::string& line : lines) {
    const std::string family = FamilyOf(line);
    if (line.rfind("# HELP ", 0) == 0) ++helps[family];
    if (line.rfind("# TYPE ", 0) == 0) {
      ++types[family];
      EXPECT_THAT(line, ::testing::EndsWith(" gauge")) << line;
    }
    if (family != current) {
      EXPECT_FALSE(closed.count(family)) << family << " is split in two blocks";
      if (!current.empty()) closed.insert(current);
      current = family;
      EXPECT_EQ(line.rfind("# HELP ", 0), 0u) << "a family starts with its HELP: " << line;
    }
  }
  EXPECT_GE(helps.size(), 14u);
  for (const auto& [family, n] : helps) {
    EXPECT_EQ(n, 1) << family;
    EXPECT_EQ(types[family], 1) << family;
  }
}

TEST(PrometheusMetricsTest, CountsJobsAndStagesPerStateWithZerosPresent) {
  const std::string text = PrometheusMetrics(Fixture());
  for (const char* line : {
           "pipetrain_build_info{version=\"0.1.0\"} 1\n",
           "pipetrain_jobs{state=\"QUEUED\"} 1\n",
           "pipetrain_jobs{state=\"RUNNING\"} 1\n",
           "pipetrain_jobs{state=\"SUCCEEDED\"} 0\n",
           "pipetrain_jobs{state=\"FAILED\"} 1\n",
           "pipetrain_jobs{state=\"CANCELLED\"} 0\n",
           "pipetrain_jobs{state=\"RECOVERING\"} 0\n",
           "pipetrain_stages{state=\"IDLE\"} 1\n",
           "pipetrain_stages{state=\"BUSY\"} 1\n",
           "pipetrain_stages{state=\"LOST\"} 0\n",
           "pipetrain_stage_heartbeat_age_seconds{stage_id=\"stage-1\",address=\"127.0.0.1:7501\"} 2\n",
           "pipetrain_stage_heartbeat_age_seconds{stage_id=\"stage-2\",address=\"127.0.0.1:7501\"} 1\n",
           "pipetrain_stage_memory_bytes{stage_id=\"stage-1\",address=\"127.0.0.1:7501\"} 1073741824\n",
       }) {
    EXPECT_THAT(text, HasSubstr(line));
  }
  EXPECT_THAT(text, Not(HasSubstr("STATE_UNSPECIFIED")));
  EXPECT_THAT(text, Not(HasSubstr("pipetrain_stage_memory_bytes{stage_id=\"stage-2\"")))
      << "a stage that reported no memory has no memory sample";
}

TEST(PrometheusMetricsTest, ARunningJobHasItsLatestStepWithAnEscapedName) {
  const std::string text = PrometheusMetrics(Fixture());
  const std::string id = R"(job_id="job-000003",name="say \"hi\"\\ to\nall")";
  for (const std::string& line : {
           "pipetrain_job_info{" + id + ",state=\"RUNNING\",schedule=\"1f1b\"} 1\n",
           "pipetrain_job_steps_done{" + id + "} 3\n",
           "pipetrain_job_steps_planned{" + id + "} 10\n",
           "pipetrain_job_loss{" + id + "} 4.25\n",
           "pipetrain_job_validation_loss{" + id + "} 4.75\n",
           "pipetrain_job_step_seconds{" + id + "} 0.25\n",
           "pipetrain_job_tokens_per_second{" + id + "} 512\n",
           "pipetrain_job_bubble_fraction{" + id + ",kind=\"measured\"} 0.5\n",
           "pipetrain_job_bubble_fraction{" + id + ",kind=\"predicted\"} 0.375\n",
           "pipetrain_job_stage_peak_memory_bytes{" + id + ",stage=\"1\"} 1001\n",
           "pipetrain_job_stage_peak_activation_bytes{" + id + ",stage=\"0\"} 200\n",
       }) {
    EXPECT_THAT(text, HasSubstr(line));
  }
  // The failed job ended recently, so it keeps its series; the queued one has none.
  EXPECT_THAT(text, HasSubstr("pipetrain_job_steps_done{job_id=\"job-000001\",name=\"plain\"} 0\n"));
  EXPECT_THAT(text, Not(HasSubstr("job-000002")));
}

TEST(PrometheusMetricsTest, NoValidationLossOrStepFiguresBeforeTheyExist) {
  MetricsInput in = Fixture();
  in.jobs[0].mutable_history(0)->set_has_val_loss(false);
  std::string text = PrometheusMetrics(in);
  EXPECT_THAT(text, Not(HasSubstr("pipetrain_job_validation_loss")));
  EXPECT_THAT(text, HasSubstr("pipetrain_job_loss{"));
  EXPECT_THAT(text, Not(HasSubstr("pipetrain_job_loss{job_id=\"job-000001\"")))
      << "a job without steps has no loss";
  in.jobs[0].clear_history();
  text = PrometheusMetrics(in);
  EXPECT_THAT(text, Not(HasSubstr("pipetrain_job_loss")));
  EXPECT_THAT(text, Not(HasSubstr("pipetrain_job_bubble_fraction")));
  EXPECT_THAT(text, HasSubstr("pipetrain_job_steps_done{"));
}

TEST(PrometheusMetricsTest, SeriesForRunningJobsAndTheLatestFinishedFive) {
  std::vector<pb::JobStatus> jobs;
  jobs.push_back(Job("q", pb::JobStatus::QUEUED));
  for (int i = 0; i < 7; ++i) {
    // Created in this order (most recent first), finished in another.
    jobs.push_back(Job(absl::StrCat("e", i), pb::JobStatus::SUCCEEDED, 1000 + (i * 3) % 7));
  }
  jobs.push_back(Job("r", pb::JobStatus::RUNNING));
  // finished: e0 1000, e1 1003, e2 1006, e3 1002, e4 1005, e5 1001, e6 1004.
  EXPECT_THAT(JobsWithSeries(jobs), ElementsAre(2, 3, 4, 5, 7, 8));
  EXPECT_TRUE(JobsWithSeries({}).empty());
}

TEST(PrometheusMetricsTest, StepsNeededAreTheLatestOrTheLastValidationInterval) {
  pb::JobStatus job = Job("j", pb::JobStatus::RUNNING);
  EXPECT_EQ(FirstStepForMetrics(job), 1);
  job.set_steps_done(12);
  EXPECT_EQ(FirstStepForMetrics(job), 12);
  job.mutable_spec()->mutable_data()->set_validate_every_steps(5);
  EXPECT_EQ(FirstStepForMetrics(job), 8);  // 8..12 holds step 10
  job.set_steps_done(3);
  EXPECT_EQ(FirstStepForMetrics(job), 1);
}

TEST(PrometheusTextTest, EscapesLabelValuesAndWritesExactFloats) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(FormatSampleValue(0.1), "0.1");
  EXPECT_EQ(FormatSampleValue(42), "42");
  EXPECT_EQ(FormatSampleValue(-1.5e-7), "-1.5e-07");
  EXPECT_EQ(std::stod(FormatSampleValue(1.0 / 3)), 1.0 / 3);
  EXPECT_EQ(FormatSampleValue(std::nan("")), "NaN");
  EXPECT_EQ(FormatSampleValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatSampleValue(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(PrometheusTextTest, AFamilyWithoutSamplesWritesNothing) {
  std::string out;
  MetricFamily("pipetrain_x", "help").AppendTo(out);
  EXPECT_EQ(out, "");
  MetricFamily f("pipetrain_x", "a \\ help\nline");
  f.Add({}, 2);
  f.AppendTo(out);
  EXPECT_EQ(out, "# HELP pipetrain_x a \\\\ help\\nline\n# TYPE pipetrain_x gauge\npipetrain_x 2\n");
}

}  // namespace
}  // namespace pipetrain::coordinator
