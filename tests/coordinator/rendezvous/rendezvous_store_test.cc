// RendezvousStore: set and get, waiting with a deadline, the per-job limits, Forget.
#include "coordinator/rendezvous/rendezvous_store.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(RendezvousStoreTest, SetThenGetAnswersTheValuePerJob) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("job-1", "s0/0", std::string("addr\0one", 8)).ok());
  ASSERT_TRUE(store.Set("job-2", "s0/0", "other").ok());
  absl::StatusOr<std::string> v = store.Get("job-1", "s0/0", absl::ZeroDuration());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("addr\0one", 8));
  EXPECT_EQ(*store.Get("job-2", "s0/0", absl::ZeroDuration()), "other");
  EXPECT_EQ(store.jobs(), 2);
  EXPECT_EQ(store.keys("job-1"), 1);
  EXPECT_EQ(store.bytes("job-1"), 4 + 8);
}

TEST(RendezvousStoreTest, MissingKeyWithoutWaitIsNotFoundNamingJobAndKey) {
  RendezvousStore store;
  absl::StatusOr<std::string> v = store.Get("job-7", "s1/3", absl::ZeroDuration());
  ASSERT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(v.status().message(), HasSubstr("job-7"));
  EXPECT_THAT(v.status().message(), HasSubstr("s1/3"));
}

TEST(RendezvousStoreTest, GetWaitsForALaterSet) {
  RendezvousStore store;
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_TRUE(store.Set("job-1", "k", "late").ok());
  });
  absl::StatusOr<std::string> v = store.Get("job-1", "k", absl::Seconds(20));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "late");
}

TEST(RendezvousStoreTest, GetGivesUpAtItsDeadline) {
  RendezvousStore store;
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = store.Get("job-1", "never", absl::Milliseconds(150));
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(v.status().message(), HasSubstr("job-1"));
  EXPECT_THAT(v.status().message(), HasSubstr("never"));
  EXPECT_GE(took, absl::Milliseconds(150));
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_EQ(store.jobs(), 0);  // a wait leaves nothing behind
}

TEST(RendezvousStoreTest, WaitIsCappedAtTheLimit) {
  RendezvousLimits limits;
  limits.max_wait = absl::Milliseconds(100);
  RendezvousStore store(limits);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> v = store.Get("job-1", "k", absl::Hours(1));
  EXPECT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(RendezvousStoreTest, SettingAgainIsOkWithTheSameValueAndAnErrorWithAnother) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("job-1", "k", "a").ok());
  EXPECT_TRUE(store.Set("job-1", "k", "a").ok());
  absl::Status s = store.Set("job-1", "k", "b");
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(s.message(), HasSubstr("job-1"));
  EXPECT_EQ(*store.Get("job-1", "k", absl::ZeroDuration()), "a");
  EXPECT_EQ(store.keys("job-1"), 1);
}

TEST(RendezvousStoreTest, EmptyNamesAreInvalidAndNamed) {
  RendezvousStore store;
  absl::Status s = store.Set("", "k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("job_id"));
  s = store.Set("job-1", "", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("key"));
  EXPECT_EQ(store.Get("job-1", "", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.jobs(), 0);
}

TEST(RendezvousStoreTest, KeyCountLimitIsPerJob) {
  RendezvousLimits limits;
  limits.max_keys_per_job = 3;
  RendezvousStore store(limits);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store.Set("job-1", std::to_string(i), "v").ok());
  absl::Status s = store.Set("job-1", "3", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("job-1"));
  EXPECT_THAT(s.message(), HasSubstr("'3'"));
  EXPECT_TRUE(store.Set("job-2", "3", "v").ok());  // another job has its own room
  EXPECT_EQ(store.keys("job-1"), 3);
}

TEST(RendezvousStoreTest, ByteLimitCountsKeysAndValues) {
  RendezvousLimits limits;
  limits.max_bytes_per_job = 20;
  RendezvousStore store(limits);
  ASSERT_TRUE(store.Set("job-1", "a", std::string(9, 'x')).ok());   // 10 bytes
  ASSERT_TRUE(store.Set("job-1", "b", std::string(9, 'x')).ok());   // 20 bytes
  absl::Status s = store.Set("job-1", "c", "");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("job-1"));
  EXPECT_EQ(store.bytes("job-1"), 20);
  RendezvousStore fresh(limits);
  EXPECT_EQ(fresh.Set("job-9", "k", std::string(40, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fresh.jobs(), 0);  // a refused first key leaves no empty job behind
}

TEST(RendezvousStoreTest, JobCountIsBounded) {
  RendezvousLimits limits;
  limits.max_jobs = 2;
  RendezvousStore store(limits);
  ASSERT_TRUE(store.Set("job-1", "k", "v").ok());
  ASSERT_TRUE(store.Set("job-2", "k", "v").ok());
  EXPECT_EQ(store.Set("job-3", "k", "v").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(store.Set("job-2", "k2", "v").ok());  // known jobs may still add keys
  store.Forget("job-1");
  EXPECT_TRUE(store.Set("job-3", "k", "v").ok());
}

TEST(RendezvousStoreTest, ForgetDropsOnlyThatJob) {
  RendezvousStore store;
  ASSERT_TRUE(store.Set("job-1", "k", "v1").ok());
  ASSERT_TRUE(store.Set("job-2", "k", "v2").ok());
  store.Forget("job-1");
  EXPECT_EQ(store.Get("job-1", "k", absl::ZeroDuration()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*store.Get("job-2", "k", absl::ZeroDuration()), "v2");
  EXPECT_EQ(store.bytes("job-1"), 0);
  // The job's keys may be set afresh (a new run of the same id starts clean).
  EXPECT_TRUE(store.Set("job-1", "k", "other").ok());
}

TEST(RendezvousStoreTest, ForgetWakesTheJobsWaitersWithAborted) {
  RendezvousStore store;
  absl::StatusOr<std::string> v;
  const absl::Time start = absl::Now();
  std::thread waiter([&] { v = store.Get("job-1", "k", absl::Seconds(30)); });
  absl::SleepFor(absl::Milliseconds(100));
  store.Forget("job-2");  // another job's end does not end this wait
  store.Forget("job-1");
  waiter.join();
  EXPECT_EQ(v.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(v.status().message(), HasSubstr("job-1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

TEST(RendezvousStoreTest, ManyWaitersAllSeeTheirKeys) {
  RendezvousStore store;
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::vector<std::string> got(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      // Each publishes its own key, then waits for its right neighbour's (a ring).
      EXPECT_TRUE(store.Set("job-1", std::to_string(i), absl::StrCat("v", i)).ok());
      absl::StatusOr<std::string> v =
          store.Get("job-1", std::to_string((i + 1) % kThreads), absl::Seconds(20));
      if (v.ok()) got[i] = *v;
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(got[i], absl::StrCat("v", (i + 1) % kThreads));
}

}  // namespace
}  // namespace pipetrain::coordinator
