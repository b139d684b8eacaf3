// GradientReducer over gloo: R = 2, 3, 4 replicas in threads, rendezvous through a real
// gRPC server serving the coordinator's rendezvous RPCs, on 127.0.0.1. Sums against a
// reference, R = 1, and peers that never come or go away mid-run (errors in time).
#include "stage_server/collective/gradient_reducer.h"

#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/model/optimizer_split.h"
#include "coordinator/rendezvous/rendezvous_service.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "gloo/common/error.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/collective/coordinator_store.h"
#include "tests/testing/reducer_rendezvous.h"

namespace pipetrain::stage_server::collective {
namespace {

using ::testing::HasSubstr;
using Reducers = std::vector<absl::StatusOr<std::unique_ptr<GradientReducer>>>;

class GradientReducerTest : public ::testing::Test {
 protected:
  ReducerOptions Options(int replica, int replicas, const std::string& prefix, int stage = 0) {
    return rendezvous_.Options(replica, replicas, prefix, stage);
  }

  // Connects `ranks` of `replicas` (all by default), each in its own thread, as
  // stages on different machines would.
  Reducers Connect(int replicas, const std::string& prefix, std::vector<int> ranks = {},
                   absl::Duration deadline = absl::Seconds(30), int stage = 0) {
    if (ranks.empty()) {
      for (int r = 0; r < replicas; ++r) ranks.push_back(r);
    }
    Reducers out(ranks.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i] {
        ReducerOptions o = Options(ranks[i], replicas, prefix, stage);
        o.connect_deadline = deadline;
        out[i] = CreateGlooReducer(o);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  // Every reducer's AllReduceSum on its own buffer, at once.
  static std::vector<absl::Status> ReduceAll(Reducers& reducers,
                                             std::vector<std::vector<float>>& data,
                                             absl::Duration deadline = absl::Seconds(30)) {
    std::vector<absl::Status> out(reducers.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < reducers.size(); ++i) {
      threads.emplace_back([&, i] { out[i] = (*reducers[i])->AllReduceSum(data[i], deadline); });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  testing::ReducerRendezvous rendezvous_;
};

TEST_F(GradientReducerTest, SumsSmallIntegersExactlyForTwoThreeAndFourReplicas) {
  for (int replicas : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("R = ", replicas));
    Reducers reducers = Connect(replicas, absl::StrCat("ints-", replicas));
    for (const auto& r : reducers) ASSERT_TRUE(r.ok()) << r.status();
    for (int i = 0; i < replicas; ++i) {
      EXPECT_EQ((*reducers[i])->rank(), i);
      EXPECT_EQ((*reducers[i])->size(), replicas);
    }
    // Odd length, so that the ring's segments do not divide it evenly.
    constexpr size_t kN = 10007;
    std::vector<std::vector<float>> data(replicas, std::vector<float>(kN));
    std::vector<float> want(kN, 0);
    for (int r = 0; r < replicas; ++r) {
      for (size_t i = 0; i < kN; ++i) {
        data[r][i] = static_cast<float>(static_cast<int>((i * 7 + r * 13) % 17) - 8);
        want[i] += data[r][i];
      }
    }
    for (const absl::Status& s : ReduceAll(reducers, data)) ASSERT_TRUE(s.ok()) << s;
    for (int r = 0; r < replicas; ++r) EXPECT_EQ(data[r], want) << "replica " << r;
  }
}

TEST_F(GradientReducerTest, SumsFreshRandomFloatsOverSeveralCallsInARow) {
  for (int replicas : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("R = ", replicas));
    Reducers reducers = Connect(replicas, absl::StrCat("floats-", replicas));
    for (const auto& r : reducers) ASSERT_TRUE(r.ok()) << r.status();
    std::mt19937 gen(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Sizes from one element to several of gloo's 1 MiB segments.
    for (size_t n : {size_t{1}, size_t{3}, size_t{65537}, size_t{600001}}) {
      SCOPED_TRACE(absl::StrCat("n = ", n));
      std::vector<std::vector<float>> data(replicas, std::vector<float>(n));
      std::vector<double> want(n, 0);
      for (int r = 0; r < replicas; ++r) {
        for (size_t i = 0; i < n; ++i) {
          data[r][i] = normal(gen);
          want[i] += data[r][i];
        }
      }
      for (const absl::Status& s : ReduceAll(reducers, data)) ASSERT_TRUE(s.ok()) << s;
      for (int r = 0; r < replicas; ++r) {
        int bad = 0;
        for (size_t i = 0; i < n; ++i) {
          const double tol = 1e-6 * std::max(1.0, std::abs(want[i])) * replicas;
          if (std::abs(data[r][i] - want[i]) > tol && ++bad <= 3) {
            ADD_FAILURE() << "replica " << r << " element " << i << ": " << data[r][i]
                          << " vs " << want[i];
          }
        }
        EXPECT_EQ(bad, 0) << "replica " << r;
      }
      // Every replica holds the very same bits (the runtime relies on it: the replicas'
      // weights must stay identical).
      for (int r = 1; r < replicas; ++r) EXPECT_EQ(data[r], data[0]);
    }
  }
}

// The split optimizer's halves: a reduce-scatter leaves each replica the sum of its own
// piece (added in replica order, so the test's float sum in that order is the very same
// bits) and the rest untouched; the all-gather then gives every replica every piece.
TEST_F(GradientReducerTest, ReduceScatterThenAllGatherGiveEveryReplicaTheSumInReplicaOrder) {
  for (int replicas : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("R = ", replicas));
    Reducers reducers = Connect(replicas, absl::StrCat("split-", replicas));
    for (const auto& r : reducers) ASSERT_TRUE(r.ok()) << r.status();
    std::mt19937 gen(std::random_device{}());
    std::normal_distribution<float> normal(0.0f, 1.0f);
    // Fewer elements than replicas (empty pieces), odd sizes, several gloo segments.
    for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{10007}, size_t{600001}}) {
      SCOPED_TRACE(absl::StrCat("n = ", n));
      std::vector<std::vector<float>> data(replicas, std::vector<float>(n));
      for (auto& d : data) {
        for (float& x : d) x = normal(gen);
      }
      const std::vector<std::vector<float>> before = data;
      std::vector<float> want = before[0];
      for (int r = 1; r < replicas; ++r) {
        for (size_t i = 0; i < n; ++i) want[i] += before[r][i];
      }
      auto each = [&](auto op) {
        std::vector<absl::Status> out(replicas);
        std::vector<std::thread> threads;
        for (int r = 0; r < replicas; ++r) {
          threads.emplace_back([&, r] { out[r] = op(**reducers[r], data[r]); });
        }
        for (std::thread& t : threads) t.join();
        return out;
      };
      for (const absl::Status& s : each([](GradientReducer& g, std::vector<float>& d) {
             return g.ReduceScatterSum(d, absl::Seconds(30));
           })) {
        ASSERT_TRUE(s.ok()) << s;
      }
      for (int r = 0; r < replicas; ++r) {
        const model::CopyRange own = model::RangeOfCopy(n, replicas, r);
        for (size_t i = 0; i < n; ++i) {
          const bool mine = i >= own.begin && i < own.end;
          ASSERT_EQ(data[r][i], mine ? want[i] : before[r][i])
              << "replica " << r << " element " << i << (mine ? " (its piece)" : " (not its)");
        }
      }
      for (const absl::Status& s : each([](GradientReducer& g, std::vector<float>& d) {
             return g.AllGather(d, absl::Seconds(30));
           })) {
        ASSERT_TRUE(s.ok()) << s;
      }
      for (int r = 0; r < replicas; ++r) EXPECT_EQ(data[r], want) << "replica " << r;
    }
    // The all-reduce still works on the same connections after the split's calls.
    std::vector<std::vector<float>> ones(replicas, std::vector<float>(5, 1.0f));
    for (const absl::Status& s : ReduceAll(reducers, ones)) ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(ones[0], std::vector<float>(5, static_cast<float>(replicas)));
  }
}

TEST_F(GradientReducerTest, AReduceScatterWithAPeerGoneIsNamedAndBreaksTheReducer) {
  Reducers reducers = Connect(2, "split-dies");
  for (const auto& r : reducers) ASSERT_TRUE(r.ok()) << r.status();
  reducers[1]->reset();
  std::vector<float> data(4096, 1.0f);
  const absl::Time start = absl::Now();
  absl::Status s = (*reducers[0])->ReduceScatterSum(data, absl::Seconds(3));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  EXPECT_THAT(s.message(), HasSubstr("reduce-scatter of 4096 floats"));
  EXPECT_THAT(s.message(), HasSubstr("replica 1 (host"));
  EXPECT_EQ((*reducers[0])->AllGather(data, absl::Seconds(3)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(GradientReducerTest, OneReplicaIsANoOpWithoutAnyConnection) {
  ReducerOptions o = Options(0, 1, "solo");
  o.coordinator_address = "";  // nothing to reach
  absl::StatusOr<std::unique_ptr<GradientReducer>> reducer = CreateGlooReducer(o);
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  std::vector<float> data = {1.5f, -2.0f, 3.25f};
  const std::vector<float> before = data;
  ASSERT_TRUE((*reducer)->AllReduceSum(data, absl::Seconds(1)).ok());
  ASSERT_TRUE((*reducer)->ReduceScatterSum(data, absl::Seconds(1)).ok());
  ASSERT_TRUE((*reducer)->AllGather(data, absl::Seconds(1)).ok());
  EXPECT_EQ(data, before);
  EXPECT_EQ((*reducer)->size(), 1);
  EXPECT_EQ(rendezvous_.store().jobs(), 0);  // it published nothing
}

TEST_F(GradientReducerTest, BadOptionsAreInvalidArgumentNamingTheField) {
  ReducerOptions o = Options(3, 3, "bad");
  absl::StatusOr<std::unique_ptr<GradientReducer>> r = CreateGlooReducer(o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("replica"));
  EXPECT_THAT(r.status().message(), HasSubstr("job-000042"));
  o = Options(0, 0, "bad");
  EXPECT_EQ(CreateGlooReducer(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Options(0, 2, "bad");
  o.coordinator_address = "";
  r = CreateGlooReducer(o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("coordinator_address"));
}

TEST_F(GradientReducerTest, APeerThatNeverArrivesIsNamedWithinTheDeadline) {
  const absl::Time start = absl::Now();
  // Replicas 0 and 1 of 3 come; replica 2 never does.
  Reducers reducers = Connect(3, "absent", {0, 1}, absl::Seconds(2));
  const absl::Duration took = absl::Now() - start;
  for (const auto& r : reducers) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("replica 2 did not arrive"));
    EXPECT_THAT(r.status().message(), HasSubstr("job-000042"));
    EXPECT_THAT(r.status().message(), HasSubstr("stage 0"));
  }
  EXPECT_LT(took, absl::Seconds(20));
}

TEST_F(GradientReducerTest, AnUnreachableCoordinatorIsAnErrorWithinTheDeadline) {
  ReducerOptions o = Options(0, 2, "nobody");
  o.coordinator_address = testing::UnusedAddress();
  o.connect_deadline = absl::Seconds(2);
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<GradientReducer>> r = CreateGlooReducer(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(o.coordinator_address));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
}

TEST_F(GradientReducerTest, APeerThatGoesAwayMidRunIsNamedWithinTheDeadline) {
  for (int replicas : {2, 3}) {
    SCOPED_TRACE(absl::StrCat("R = ", replicas));
    Reducers reducers = Connect(replicas, absl::StrCat("dies-", replicas));
    for (const auto& r : reducers) ASSERT_TRUE(r.ok()) << r.status();
    std::vector<std::vector<float>> data(replicas, std::vector<float>(4096, 1.0f));
    for (const absl::Status& s : ReduceAll(reducers, data)) ASSERT_TRUE(s.ok()) << s;
    // The last replica's stage dies: its connections close.
    const int dead = replicas - 1;
    reducers[dead]->reset();
    reducers.pop_back();
    data.pop_back();
    const absl::Time start = absl::Now();
    std::vector<absl::Status> results = ReduceAll(reducers, data, absl::Seconds(3));
    EXPECT_LT(absl::Now() - start, absl::Seconds(20));
    for (size_t i = 0; i < results.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("replica ", i));
      ASSERT_FALSE(results[i].ok());
      EXPECT_TRUE(results[i].code() == absl::StatusCode::kUnavailable ||
                  results[i].code() == absl::StatusCode::kDeadlineExceeded)
          << results[i];
      EXPECT_THAT(results[i].message(), HasSubstr("job-000042"));
      EXPECT_THAT(results[i].message(), HasSubstr(absl::StrCat("replica ", i, " of ", replicas)));
      EXPECT_THAT(results[i].message(), HasSubstr(absl::StrCat("replica ", dead, " (host")));
      // A broken reducer refuses at once instead of hanging on its dead pairs.
      absl::Status again = (*reducers[i])->AllReduceSum(data[i], absl::Seconds(3));
      EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
    }
  }
}

TEST_F(GradientReducerTest, StagePositionsOfOneJobReduceApart) {
  // Stage 0's and stage 1's replicas rendezvous under the same prefix at once.
  Reducers s0, s1;
  std::thread t0([&] { s0 = Connect(2, "run-1", {}, absl::Seconds(30), 0); });
  std::thread t1([&] { s1 = Connect(2, "run-1", {}, absl::Seconds(30), 1); });
  t0.join();
  t1.join();
  for (const auto& r : s0) ASSERT_TRUE(r.ok()) << r.status();
  for (const auto& r : s1) ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::vector<float>> d0 = {{1, 2}, {10, 20}}, d1 = {{100}, {1000}};
  std::vector<absl::Status> r0, r1;
  std::thread u0([&] { r0 = ReduceAll(s0, d0); });
  std::thread u1([&] { r1 = ReduceAll(s1, d1); });
  u0.join();
  u1.join();
  for (const absl::Status& s : r0) ASSERT_TRUE(s.ok()) << s;
  for (const absl::Status& s : r1) ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(d0[0], (std::vector<float>{11, 22}));
  EXPECT_EQ(d0[1], (std::vector<float>{11, 22}));
  EXPECT_EQ(d1[0], (std::vector<float>{1100}));
}

TEST_F(GradientReducerTest, CoordinatorStoreWaitsForKeysAndGivesUpAtItsDeadline) {
  const std::string& at = rendezvous_.address();
  CoordinatorStore a(at, common::RpcSecurity(), "job-000042", "p/", absl::Seconds(5));
  CoordinatorStore b(at, common::RpcSecurity(), "job-000042", "p/", absl::Seconds(5));
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_TRUE(a.Set("k", "v").ok());
  });
  absl::StatusOr<std::string> v = b.Get("k", absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "v");
  EXPECT_EQ(*rendezvous_.store().Get("job-000042", "p/k", absl::ZeroDuration()), "v");  // prefixed
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> missing = b.Get("never", absl::Milliseconds(500));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded) << missing.status();
  EXPECT_THAT(missing.status().message(), HasSubstr("p/never"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  // gloo's form throws, with the same message, instead of hanging.
  EXPECT_THROW(b.wait({"never"}, std::chrono::milliseconds(300)), gloo::IoException);
}

}  // namespace
}  // namespace pipetrain::stage_server::collective
