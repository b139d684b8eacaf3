// Which library the replicas of a stage reduce with (reducer_choice.h): NCCL only where
// every replica has a GPU of its own, gloo otherwise, the same choice on every replica.
// Here (CPU stages, or CUDA stages where no GPU can be read) it is always gloo, and the
// gloo reducer it returns sums; nccl_reducer_test checks the NCCL side on a GPU.
#include "stage_server/collective/reducer_choice.h"

#include <random>
#include <vector>

#include "common/cuda_probe.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/collective/nccl_reducer.h"
#include "tests/testing/reducer_rendezvous.h"

namespace pipetrain::stage_server::collective {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const char kGpuA[] = "nccl host=node1 gpu=00000000:19:00.0";
const char kGpuB[] = "nccl host=node1 gpu=00000000:3B:00.0";
const char kGpuAElsewhere[] = "nccl host=node2 gpu=00000000:19:00.0";

TEST(ChooseCollectiveTest, NcclOnlyWhenEveryReplicaHasAGpuOfItsOwn) {
  const CollectiveChoice own = ChooseCollective({kGpuA, kGpuB, kGpuAElsewhere});
  EXPECT_TRUE(own.nccl) << own.reason;
  EXPECT_THAT(own.reason, StartsWith("nccl"));

  const CollectiveChoice shared = ChooseCollective({kGpuA, kGpuB, kGpuA});
  EXPECT_FALSE(shared.nccl);
  EXPECT_THAT(shared.reason, HasSubstr("replicas 0 and 2 share one GPU"));
  EXPECT_THAT(shared.reason, HasSubstr("host=node1 gpu=00000000:19:00.0"));

  const CollectiveChoice cpu = ChooseCollective({kGpuA, kCpuPlace});
  EXPECT_FALSE(cpu.nccl);
  EXPECT_EQ(cpu.reason, "gloo: replica 1 runs on cpu");

  const CollectiveChoice no_nccl = ChooseCollective({"cuda:0, built without NCCL", kGpuB});
  EXPECT_FALSE(no_nccl.nccl);
  EXPECT_THAT(no_nccl.reason, HasSubstr("replica 0 runs on cuda:0, built without NCCL"));
}

// Where this machine has no GPU, a CUDA stage's place says why NCCL is out; with one,
// it is an NCCL place naming the device's PCI bus.
TEST(ChooseCollectiveTest, ACudaPlaceNamesTheGpuOrWhyNcclCannotBeUsed) {
  const std::string place = CudaPlace(0);
  if (NcclBuilt() && common::HasCudaDevice()) {
    EXPECT_THAT(place, StartsWith("nccl host="));
    EXPECT_THAT(place, HasSubstr(" gpu="));
  } else {
    EXPECT_THAT(place, StartsWith("cuda:0, "));
    EXPECT_FALSE(ChooseCollective({place, place}).nccl);
  }
}

class ReducerChoiceTest : public ::testing::Test {
 protected:
  // Every replica's CreateReducer at once, CPU stages or all on `cuda` (one device).
  std::vector<absl::StatusOr<ChosenReducer>> Connect(int replicas, const std::string& prefix,
                                                     std::optional<int> cuda) {
    std::vector<absl::StatusOr<ChosenReducer>> out(replicas);
    testing::ReducerRendezvous::InThreads(replicas, [&](int r) {
      out[r] = CreateReducer(rendezvous_.Options(r, replicas, prefix), cuda);
    });
    return out;
  }

  // The coordinator's store as `o`'s replicas see it, for a test that writes to it.
  CoordinatorStore StoreOf(const ReducerOptions& o) const {
    return CoordinatorStore(o.coordinator_address, o.security, o.job_id, StageRendezvousPrefix(o),
                            absl::Seconds(5));
  }

  testing::ReducerRendezvous rendezvous_;
};

// Three CPU replicas, and three stages on one cuda:0 (this machine's, or none): gloo
// either way, the same reason on every replica, and the reducer sums.
TEST_F(ReducerChoiceTest, CpuStagesAndStagesSharingOneGpuReduceWithGloo) {
  for (std::optional<int> cuda : {std::optional<int>(), std::optional<int>(0)}) {
    SCOPED_TRACE(cuda ? "cuda:0" : "cpu");
    auto chosen = Connect(3, cuda ? "shared-gpu" : "cpu", cuda);
    for (const auto& c : chosen) ASSERT_TRUE(c.ok()) << c.status();
    for (const auto& c : chosen) {
      EXPECT_FALSE(c->choice.nccl);
      EXPECT_EQ(c->choice.reason, chosen[0]->choice.reason);
      EXPECT_STREQ(c->reducer->library(), "gloo");
    }
    EXPECT_THAT(chosen[0]->choice.reason, cuda && NcclBuilt() && common::HasCudaDevice()
                                              ? HasSubstr("share one GPU")
                                              : HasSubstr("replica 0 runs on"));
    std::mt19937 gen(std::random_device{}());
    std::uniform_int_distribution<int> small(-8, 8);
    std::vector<std::vector<float>> data(3, std::vector<float>(1001));
    std::vector<float> want(1001, 0.0f);
    for (auto& d : data) {
      for (size_t i = 0; i < d.size(); ++i) want[i] += d[i] = static_cast<float>(small(gen));
    }
    std::vector<absl::Status> done(3);
    testing::ReducerRendezvous::InThreads(
        3, [&](int r) { done[r] = chosen[r]->reducer->AllReduceSum(data[r], absl::Seconds(30)); });
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(done[r].ok()) << done[r];
      EXPECT_EQ(data[r], want) << "replica " << r;
    }
  }
}

TEST_F(ReducerChoiceTest, OneReplicaConnectsToNothing) {
  auto chosen = CreateReducer(rendezvous_.Options(0, 1, "solo"), 0);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_STREQ(chosen->reducer->library(), "none");
}

TEST_F(ReducerChoiceTest, AReplicaThatNeverComesIsNamed) {
  ReducerOptions o = rendezvous_.Options(0, 2, "alone");
  o.connect_deadline = absl::Milliseconds(300);
  auto chosen = CreateReducer(o, std::nullopt);
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(chosen.status().message(), HasSubstr("job job-000042, stage 1, replica 0 of 2"));
  EXPECT_THAT(chosen.status().message(), HasSubstr("replica 1 did not arrive"));
}

// Without a GPU (or without NCCL) an NCCL reducer cannot be made; the error says whose.
TEST_F(ReducerChoiceTest, AnNcclReducerWithoutAGpuSaysWhoCouldNotHaveOne) {
  if (NcclBuilt() && common::HasCudaDevice()) GTEST_SKIP() << "a GPU is present";
  ReducerOptions o = rendezvous_.Options(0, 1, "no-gpu");
  CoordinatorStore store = StoreOf(o);
  auto reducer = CreateNcclReducer(o, 0, store, absl::Now() + absl::Seconds(5));
  ASSERT_FALSE(reducer.ok());
  EXPECT_THAT(reducer.status().message(), HasSubstr("job job-000042, stage 1, replica 0 of 1"));
  EXPECT_THAT(reducer.status().message(), HasSubstr("cuda:0"));
}

// Every replica publishes its listen host and its place in one value; one that does not
// is named, and nobody connects to it.
TEST_F(ReducerChoiceTest, AReplicaThatPublishesNoListenHostIsNamed) {
  ReducerOptions o = rendezvous_.Options(1, 2, "garbled");
  CoordinatorStore store = StoreOf(o);
  ASSERT_TRUE(store.Set("place/0", kCpuPlace).ok());
  auto chosen = CreateReducer(o, std::nullopt);
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(chosen.status().message(), HasSubstr("job job-000042, stage 1, replica 1 of 2"));
  EXPECT_THAT(chosen.status().message(), HasSubstr("replica 0 published 'cpu'"));
}

// Replica 0's NCCL unique id reaches the others through the coordinator's store; one of
// the wrong size is refused before any CUDA call, so this holds without a GPU too.
TEST_F(ReducerChoiceTest, AnNcclUniqueIdOfTheWrongSizeIsRefused) {
  if (!NcclBuilt()) GTEST_SKIP() << "this build has no NCCL";
  ReducerOptions o = rendezvous_.Options(1, 2, "short-id");
  CoordinatorStore store = StoreOf(o);
  ASSERT_TRUE(store.Set("nccl-unique-id", "abcd").ok());
  auto reducer = CreateNcclReducer(o, 0, store, absl::Now() + absl::Seconds(5));
  ASSERT_FALSE(reducer.ok());
  EXPECT_EQ(reducer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(reducer.status().message(), HasSubstr("job job-000042, stage 1, replica 1 of 2"));
  EXPECT_THAT(reducer.status().message(),
              HasSubstr("replica 0's NCCL unique id is 2 bytes, not 128"));
}

}  // namespace
}  // namespace pipetrain::stage_server::collective
