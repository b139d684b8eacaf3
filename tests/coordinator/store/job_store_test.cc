// Tests of the SQLite job store: CRUD and ordering, step history and logs, errors that
// name the job or file, durability across reopen, and concurrent writers.
#include "coordinator/store/job_store.h"

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::coordinator {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using pipetrain::v1::JobStatus;
using pipetrain::v1::LogLine;
using pipetrain::v1::StepRecord;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

JobStatus MakeJob(const std::string& id, int64_t created_s) {
  JobStatus job;
  job.set_job_id(id);
  job.set_state(JobStatus::QUEUED);
  job.mutable_created()->set_seconds(created_s);
  job.mutable_spec()->set_name(absl::StrCat("spec-of-", id));
  return job;
}

StepRecord MakeStep(int64_t step, double loss) {
  StepRecord record;
  record.set_step(step);
  record.set_loss(loss);
  return record;
}

LogLine MakeLog(const std::string& text) {
  LogLine line;
  line.set_text(text);
  return line;
}

std::unique_ptr<JobStore> OpenOrDie(const std::string& path) {
  auto store = JobStore::Open(path);
  EXPECT_THAT(store, IsOk());
  return store.ok() ? *std::move(store) : nullptr;
}

std::vector<std::string> Ids(const std::vector<JobStatus>& jobs) {
  std::vector<std::string> ids;
  for (const JobStatus& job : jobs) ids.push_back(job.job_id());
  return ids;
}

TEST(JobStoreTest, InsertGetAndUpdate) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("jobs.db"));
  ASSERT_NE(store, nullptr);
  JobStatus job = MakeJob("job-a", 100);
  *job.add_history() = MakeStep(1, 9.0);  // ignored: history lives in steps
  ASSERT_THAT(store->Insert(job), IsOk());

  auto got = store->Get("job-a", /*include_history=*/true);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->spec().name(), "spec-of-job-a");
  EXPECT_EQ(got->state(), JobStatus::QUEUED);
  EXPECT_EQ(got->history().size(), 0);

  job.set_state(JobStatus::RUNNING);
  job.set_steps_done(7);
  ASSERT_THAT(store->Update(job), IsOk());
  got = store->Get("job-a", /*include_history=*/false);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state(), JobStatus::RUNNING);
  EXPECT_EQ(got->steps_done(), 7);
}

TEST(JobStoreTest, ErrorsNameTheJob) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("jobs.db"));
  ASSERT_NE(store, nullptr);
  ASSERT_THAT(store->Insert(MakeJob("job-a", 1)), IsOk());
  EXPECT_THAT(store->Insert(MakeJob("job-a", 2)),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("'job-a'")));
  EXPECT_THAT(store->Insert(MakeJob("", 2)), StatusIs(absl::StatusCode::kInvalidArgument));
  const auto kUnknown = StatusIs(absl::StatusCode::kNotFound, "unknown job 'nope'");
  EXPECT_THAT(store->Get("nope", false), kUnknown);
  EXPECT_THAT(store->Update(MakeJob("nope", 1)), kUnknown);
  EXPECT_THAT(store->AppendStep("nope", MakeStep(1, 1.0)), kUnknown);
  EXPECT_THAT(store->AppendLog("nope", MakeLog("x")), kUnknown);
  EXPECT_THAT(store->Steps("nope", 0), kUnknown);
  EXPECT_THAT(store->Logs("nope"), kUnknown);
  // The failed insert changed nothing.
  auto got = store->Get("job-a", false);
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->created().seconds(), 1);
}

TEST(JobStoreTest, ListIsNewestFirstWithLimit) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("jobs.db"));
  ASSERT_NE(store, nullptr);
  ASSERT_THAT(store->Insert(MakeJob("job-b", 200)), IsOk());
  ASSERT_THAT(store->Insert(MakeJob("job-a", 100)), IsOk());
  ASSERT_THAT(store->Insert(MakeJob("job-c", 300)), IsOk());
  ASSERT_THAT(store->Insert(MakeJob("job-d", 300)), IsOk());  // same time: inserted later
  ASSERT_THAT(store->AppendStep("job-c", MakeStep(1, 1.0)), IsOk());

  auto all = store->List(0);
  ASSERT_THAT(all, IsOk());
  EXPECT_THAT(Ids(*all), ElementsAre("job-d", "job-c", "job-b", "job-a"));
  for (const JobStatus& job : *all) EXPECT_EQ(job.history().size(), 0);
  auto two = store->List(2);
  ASSERT_THAT(two, IsOk());
  EXPECT_THAT(Ids(*two), ElementsAre("job-d", "job-c"));
  EXPECT_THAT(store->List(-1), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(JobStoreTest, HistoryIsInStepOrderAndSameStepReplaces) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("jobs.db"));
  ASSERT_NE(store, nullptr);
  ASSERT_THAT(store->Insert(MakeJob("job-a", 1)), IsOk());
  ASSERT_THAT(store->Insert(MakeJob("job-b", 2)), IsOk());
  for (int64_t step : {3, 1, 2}) {
    ASSERT_THAT(store->AppendStep("job-a", MakeStep(step, step * 1.5)), IsOk());
  }
  ASSERT_THAT(store->AppendStep("job-a", MakeStep(2, 0.25)), IsOk());  // replaces step 2
  ASSERT_THAT(store->AppendStep("job-b", MakeStep(1, 42.0)), IsOk());

  auto job = store->Get("job-a", /*include_history=*/true);
  ASSERT_THAT(job, IsOk());
  ASSERT_EQ(job->history().size(), 3);
  EXPECT_EQ(job->history(0).step(), 1);
  EXPECT_EQ(job->history(1).step(), 2);
  EXPECT_EQ(job->history(1).loss(), 0.25);
  EXPECT_EQ(job->history(2).step(), 3);
  auto without = store->Get("job-a", /*include_history=*/false);
  ASSERT_THAT(without, IsOk());
  EXPECT_EQ(without->history().size(), 0);

  auto from2 = store->Steps("job-a", 2);
  ASSERT_THAT(from2, IsOk());
  ASSERT_EQ(from2->size(), 2u);
  EXPECT_EQ((*from2)[0].step(), 2);
  EXPECT_EQ((*from2)[1].step(), 3);
  auto other = store->Steps("job-b", 0);
  ASSERT_THAT(other, IsOk());
  ASSERT_EQ(other->size(), 1u);
  EXPECT_EQ((*other)[0].loss(), 42.0);
}

TEST(JobStoreTest, LogsKeepTheirOrderPerJob) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("jobs.db"));
  ASSERT_NE(store, nullptr);
  ASSERT_THAT(store->Insert(MakeJob("job-a", 1)), IsOk());
  ASSERT_THAT(store->Insert(MakeJob("job-b", 2)), IsOk());
  ASSERT_THAT(store->AppendLog("job-a", MakeLog("first")), IsOk());
  ASSERT_THAT(store->AppendLog("job-b", MakeLog("other")), IsOk());
  ASSERT_THAT(store->AppendLog("job-a", MakeLog("it's 'quoted'; DROP TABLE logs;")), IsOk());
  auto logs = store->Logs("job-a");
  ASSERT_THAT(logs, IsOk());
  ASSERT_EQ(logs->size(), 2u);
  EXPECT_EQ((*logs)[0].text(), "first");
  EXPECT_EQ((*logs)[1].text(), "it's 'quoted'; DROP TABLE logs;");
  auto empty_job = store->Insert(MakeJob("job-c", 3));
  ASSERT_THAT(empty_job, IsOk());
  auto none = store->Logs("job-c");
  ASSERT_THAT(none, IsOk());
  EXPECT_EQ(none->size(), 0u);
}

TEST(JobStoreTest, IdsAreSequentialAndSkipTakenOnes) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("jobs.db"));
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->NextJobId().value_or(""), "job-000001");
  ASSERT_THAT(store->Insert(MakeJob("job-000002", 1)), IsOk());
  EXPECT_EQ(store->NextJobId().value_or(""), "job-000003");
}

TEST(JobStoreTest, EverythingSurvivesReopen) {
  TempDir dir;
  const std::string path = dir.File("jobs.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    auto id = store->NextJobId();
    ASSERT_THAT(id, IsOk());
    EXPECT_EQ(*id, "job-000001");
    ASSERT_THAT(store->NextJobId(), IsOk());
    ASSERT_THAT(store->Insert(MakeJob(*id, 5)), IsOk());
    ASSERT_THAT(store->AppendStep(*id, MakeStep(1, 3.5)), IsOk());
    ASSERT_THAT(store->AppendLog(*id, MakeLog("hello")), IsOk());
  }
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->NextJobId().value_or(""), "job-000003");
  auto job = store->Get("job-000001", /*include_history=*/true);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->spec().name(), "spec-of-job-000001");
  ASSERT_EQ(job->history().size(), 1);
  EXPECT_EQ(job->history(0).loss(), 3.5);
  auto logs = store->Logs("job-000001");
  ASSERT_THAT(logs, IsOk());
  ASSERT_EQ(logs->size(), 1u);
  EXPECT_EQ((*logs)[0].text(), "hello");
  auto list = store->List(0);
  ASSERT_THAT(list, IsOk());
  EXPECT_THAT(Ids(*list), ElementsAre("job-000001"));
}

// A timeline of one step: `n` events of stage 0 whose start_us is the step (to tell apart).
pipetrain::v1::Timeline StepTimeline(int64_t step, int n) {
  pipetrain::v1::Timeline t;
  for (int i = 0; i < n; ++i) {
    pipetrain::v1::TimelineEvent* e = t.add_events();
    e->set_step(step);
    e->set_start_us(step);
    e->set_end_us(step + i + 1);
  }
  return t;
}

std::vector<int64_t> StepsOf(const pipetrain::v1::Timeline& t) {
  std::vector<int64_t> steps;
  for (const auto& e : t.events()) {
    if (steps.empty() || steps.back() != e.step()) steps.push_back(e.step());
  }
  return steps;
}

TEST(JobStoreTest, RecordStepKeepsTheLatestTimelinesOfEachKindAcrossReopen) {
  TempDir dir;
  const std::string path = dir.File("jobs.db");
  {
    auto store = OpenOrDie(path);
    ASSERT_NE(store, nullptr);
    JobStatus job = MakeJob("job-000001", 5);
    ASSERT_THAT(store->Insert(job), IsOk());
    for (int64_t step = 1; step <= 30; ++step) {
      job.set_steps_done(step);
      // Odd steps have no predicted timeline (an empty one is not stored).
      ASSERT_THAT(store->RecordStep(job, MakeStep(step, 1.0 / step), StepTimeline(step, 3),
                                    StepTimeline(step, step % 2 == 0 ? 2 : 0),
                                    {.measured = 5, .predicted = 3}),
                  IsOk());
    }
  }
  auto store = OpenOrDie(path);
  ASSERT_NE(store, nullptr);
  auto job = store->Get("job-000001", /*include_history=*/true);
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->steps_done(), 30);
  EXPECT_EQ(job->history_size(), 30);
  auto measured = store->Timelines("job-000001", /*predicted=*/false, 20);
  ASSERT_THAT(measured, IsOk());
  EXPECT_EQ(measured->job_id(), "job-000001");
  EXPECT_THAT(StepsOf(*measured), ElementsAre(26, 27, 28, 29, 30)) << "oldest first, 5 kept";
  EXPECT_EQ(measured->events_size(), 15);
  auto last = store->Timelines("job-000001", false, 1);
  ASSERT_THAT(last, IsOk());
  EXPECT_THAT(StepsOf(*last), ElementsAre(30));
  auto predicted = store->Timelines("job-000001", /*predicted=*/true, 20);
  ASSERT_THAT(predicted, IsOk());
  EXPECT_THAT(StepsOf(*predicted), ElementsAre(28, 30)) << "each kind keeps its own count";
  EXPECT_EQ(predicted->events_size(), 4);
  // A step run again after a restart: the later steps' timelines belong to the old run.
  JobStatus again = *job;
  ASSERT_THAT(store->RecordStep(again, MakeStep(28, 0.5), StepTimeline(28, 1),
                                pipetrain::v1::Timeline(), {.measured = 5, .predicted = 3}),
              IsOk());
  auto after = store->Timelines("job-000001", false, 20);
  ASSERT_THAT(after, IsOk());
  EXPECT_THAT(StepsOf(*after), ElementsAre(26, 27, 28));
  EXPECT_EQ(after->events_size(), 7);
  EXPECT_THAT(store->Timelines("job-000404", false, 1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store->RecordStep(MakeJob("job-000404", 1), MakeStep(1, 1), StepTimeline(1, 1),
                                StepTimeline(1, 1), {}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("job-000404")));
}

// By default the store keeps what its readers ask for: 20 steps of measured timelines and
// the latest prediction, which is all that is read of predictions.
TEST(JobStoreTest, RecordStepKeepsTwentyMeasuredAndOnePredictedByDefault) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("jobs.db"));
  ASSERT_NE(store, nullptr);
  JobStatus job = MakeJob("job-000001", 5);
  ASSERT_THAT(store->Insert(job), IsOk());
  for (int64_t step = 1; step <= 25; ++step) {
    job.set_steps_done(step);
    ASSERT_THAT(store->RecordStep(job, MakeStep(step, 1.0), StepTimeline(step, 1),
                                  StepTimeline(step, 2), JobStore::TimelinesKept{}),
                IsOk());
  }
  auto measured = store->Timelines("job-000001", /*predicted=*/false, 100);
  ASSERT_THAT(measured, IsOk());
  EXPECT_EQ(StepsOf(*measured).size(), 20u);
  EXPECT_EQ(StepsOf(*measured).front(), 6);
  auto predicted = store->Timelines("job-000001", /*predicted=*/true, 100);
  ASSERT_THAT(predicted, IsOk());
  EXPECT_THAT(StepsOf(*predicted), ElementsAre(25));
  EXPECT_EQ(predicted->events_size(), 2);
}

TEST(JobStoreTest, OpenRejectsMissingFolderAndNonDatabase) {
  TempDir dir;
  const std::string missing = dir.File("no/such/folder/jobs.db");
  EXPECT_THAT(JobStore::Open(missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/folder")));
  const std::string junk = dir.File("junk.db");
  ::pipetrain::testing::WriteFileOrDie(junk, std::string(4096, 'x'));
  EXPECT_THAT(JobStore::Open(junk),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr(junk), HasSubstr("not a SQLite database"))));
  auto folder = JobStore::Open(dir.path());  // a folder, not a file
  EXPECT_THAT(folder, StatusIs(absl::StatusCode::kUnavailable,
                               ::testing::AllOf(HasSubstr(dir.path()), HasSubstr("cannot open"))));
}

// Threads share one store (its mutex) and one thread writes through a second
// connection to the same file (WAL and the busy timeout).
TEST(JobStoreTest, ConcurrentAppendsAllLand) {
  TempDir dir;
  auto store = OpenOrDie(dir.File("jobs.db"));
  auto second = OpenOrDie(dir.File("jobs.db"));
  ASSERT_NE(store, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_THAT(store->Insert(MakeJob("job-a", 1)), IsOk());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    JobStore* target = t == 0 ? second.get() : store.get();
    threads.emplace_back([target, t] {
      for (int i = 0; i < kPerThread; ++i) {
        int64_t step = t * kPerThread + i;
        EXPECT_THAT(target->AppendStep("job-a", MakeStep(step, 1.0)), IsOk());
        EXPECT_THAT(target->AppendLog("job-a", MakeLog("line")), IsOk());
        EXPECT_THAT(target->NextJobId(), IsOk());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  auto steps = store->Steps("job-a", 0);
  ASSERT_THAT(steps, IsOk());
  ASSERT_EQ(steps->size(), size_t{kThreads * kPerThread});
  for (int i = 0; i < kThreads * kPerThread; ++i) EXPECT_EQ((*steps)[i].step(), i);
  auto logs = store->Logs("job-a");
  ASSERT_THAT(logs, IsOk());
  EXPECT_EQ(logs->size(), size_t{kThreads * kPerThread});
  EXPECT_EQ(store->NextJobId().value_or(""), "job-000101");
}

}  // namespace
}  // namespace pipetrain::coordinator
