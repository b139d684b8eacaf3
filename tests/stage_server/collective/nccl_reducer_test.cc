// The NCCL reducer on a GPU (label gpu; skips without one, saying why). NCCL takes one
// GPU per rank, so on a one-GPU machine: a one-rank communicator round-trips fresh
// random buffers through the device in every collective, a replica whose peer never
// comes ends at its deadline naming itself, and two replicas on the one GPU choose gloo.
// With two GPUs or more: two replicas' all-reduce, reduce-scatter and all-gather against
// the sums computed here, bit for bit (one addition per element).
#include "stage_server/collective/nccl_reducer.h"

#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cuda_probe.h"
#include "common/model/optimizer_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/collective/reducer_choice.h"
#include "tests/testing/reducer_rendezvous.h"

namespace pipetrain::stage_server::collective {
namespace {

using ::testing::HasSubstr;
using Buffers = std::vector<std::vector<float>>;

#define REQUIRE_NCCL_GPU()                                             \
  do {                                                                 \
    if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL";        \
    if (!common::HasCudaDevice()) {                                    \
      GTEST_SKIP() << "no usable GPU: " << common::ProbeCuda().reason; \
    }                                                                  \
  } while (false)

std::vector<float> Random(size_t n, std::mt19937& gen) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(gen);
  return v;
}

class NcclReducerTest : public ::testing::Test {
 protected:
  // Replica r of `replicas` on cuda:r, each connected in its own thread.
  std::vector<absl::StatusOr<std::unique_ptr<GradientReducer>>> Connect(int replicas,
                                                                        const std::string& prefix) {
    std::vector<absl::StatusOr<std::unique_ptr<GradientReducer>>> out(replicas);
    testing::ReducerRendezvous::InThreads(replicas, [&](int r) {
      ReducerOptions o = rendezvous_.Options(r, replicas, prefix);
      CoordinatorStore store(o.coordinator_address, o.security, o.job_id, absl::StrCat(prefix, "/"),
                             absl::Seconds(30));
      out[r] = CreateNcclReducer(o, r, store, absl::Now() + o.connect_deadline);
    });
    return out;
  }

  testing::ReducerRendezvous rendezvous_;
  std::mt19937 gen_{std::random_device{}()};
};

TEST_F(NcclReducerTest, OneRankRoundTripsEveryCollectiveThroughTheDevice) {
  REQUIRE_NCCL_GPU();
  auto reducers = Connect(1, "one-rank");
  ASSERT_TRUE(reducers[0].ok()) << reducers[0].status();
  GradientReducer& reducer = **reducers[0];
  EXPECT_STREQ(reducer.library(), "nccl");
  // Growing sizes (the buffers are re-allocated), then a smaller one.
  for (size_t n : {size_t{1}, size_t{4097}, size_t{3000001}, size_t{17}}) {
    SCOPED_TRACE(absl::StrCat("n = ", n));
    const std::vector<float> want = Random(n, gen_);
    std::vector<float> data = want;
    ASSERT_TRUE(reducer.AllReduceSum(data, absl::Seconds(30)).ok());
    EXPECT_EQ(data, want);
    ASSERT_TRUE(reducer.ReduceScatterSum(data, absl::Seconds(30)).ok());
    EXPECT_EQ(data, want);
    ASSERT_TRUE(reducer.AllGather(data, absl::Seconds(30)).ok());
    EXPECT_EQ(data, want);
  }
}

TEST_F(NcclReducerTest, AReplicaWhosePeerNeverComesEndsAtItsDeadline) {
  REQUIRE_NCCL_GPU();
  ReducerOptions o = rendezvous_.Options(0, 2, "alone");
  o.connect_deadline = absl::Seconds(3);
  CoordinatorStore store(o.coordinator_address, o.security, o.job_id, "alone/", absl::Seconds(3));
  const absl::Time start = absl::Now();
  auto reducer = CreateNcclReducer(o, 0, store, absl::Now() + o.connect_deadline);
  ASSERT_FALSE(reducer.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "the deadline was not kept";
  EXPECT_THAT(reducer.status().message(), HasSubstr("job job-000042, stage 1, replica 0 of 2"));
}

TEST_F(NcclReducerTest, TwoReplicasOnOneGpuChooseGloo) {
  REQUIRE_NCCL_GPU();
  std::vector<absl::StatusOr<ChosenReducer>> chosen(2);
  testing::ReducerRendezvous::InThreads(
      2, [&](int r) { chosen[r] = CreateReducer(rendezvous_.Options(r, 2, "one-gpu"), 0); });
  for (const auto& c : chosen) {
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_FALSE(c->choice.nccl);
    EXPECT_THAT(c->choice.reason, HasSubstr("share one GPU"));
    EXPECT_STREQ(c->reducer->library(), "gloo");
  }
}

TEST_F(NcclReducerTest, TwoGpusSumGatherAndScatterBitForBit) {
  REQUIRE_NCCL_GPU();
  const int gpus = static_cast<int>(common::ProbeCuda().devices.size());
  if (gpus < 2) GTEST_SKIP() << "NCCL takes one GPU per replica; this machine has " << gpus;
  auto reducers = Connect(2, "two-gpus");
  for (const auto& r : reducers) ASSERT_TRUE(r.ok()) << r.status();
  for (size_t n : {size_t{1}, size_t{7}, size_t{1000003}}) {
    SCOPED_TRACE(absl::StrCat("n = ", n));
    const Buffers given = {Random(n, gen_), Random(n, gen_)};
    std::vector<float> sum(n);
    for (size_t i = 0; i < n; ++i) sum[i] = given[0][i] + given[1][i];
    auto run = [&](auto call) {
      Buffers data = given;
      std::vector<absl::Status> done(2);
      testing::ReducerRendezvous::InThreads(2,
                                            [&](int r) { done[r] = call(**reducers[r], data[r]); });
      for (const absl::Status& s : done) EXPECT_TRUE(s.ok()) << s;
      return data;
    };
    const Buffers all = run([](GradientReducer& g, std::vector<float>& d) {
      return g.AllReduceSum(d, absl::Seconds(30));
    });
    EXPECT_EQ(all[0], sum);
    EXPECT_EQ(all[1], sum);
    const Buffers scattered = run([](GradientReducer& g, std::vector<float>& d) {
      return g.ReduceScatterSum(d, absl::Seconds(30));
    });
    const Buffers gathered = run([](GradientReducer& g, std::vector<float>& d) {
      return g.AllGather(d, absl::Seconds(30));
    });
    for (int r = 0; r < 2; ++r) {
      const model::CopyRange own = model::RangeOfCopy(n, 2, r);
      std::vector<float> want = given[r];  // only the own piece is summed
      std::copy(sum.begin() + own.begin, sum.begin() + own.end, want.begin() + own.begin);
      EXPECT_EQ(scattered[r], want) << "replica " << r;
      std::vector<float> pieces(n);  // every piece from its owner's buffer
      for (int q = 0; q < 2; ++q) {
        const model::CopyRange p = model::RangeOfCopy(n, 2, q);
        std::copy(given[q].begin() + p.begin, given[q].begin() + p.end, pieces.begin() + p.begin);
      }
      EXPECT_EQ(gathered[r], pieces) << "replica " << r;
    }
  }
}

}  // namespace
}  // namespace pipetrain::stage_server::collective
