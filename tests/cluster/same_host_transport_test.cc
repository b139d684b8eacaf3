// End to end: stage servers on one host hand each other tensors through shared
// memory (`--same-host-transport auto`, the default) or keep every byte on the stream
// (`off`), and the same job gives the same losses on both, bit for bit; each stage's log
// says which path every link direction took; a stage killed in the middle of a step on
// the shared-memory path is replaced and the job ends with the uninterrupted losses; and
// however many jobs and recoveries came before, a stage maps only its current links'
// regions (`/proc/PID/maps`: two a link, its own and its neighbour's, so at most 4: a
// stage keeps its last job's links until its next job, as it keeps their streams), and
// `pipetrain cluster` shows each link's paths, as the stages' heartbeats report them;
// replicas give the same losses on both paths too.
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/cluster_jobs.h"
#include "tests/testing/local_cluster.h"
#include "tests/testing/loss_comparison.h"
#include "tests/testing/status_json.h"
#include "tests/testing/tolerance.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::LocalCluster;
using ::pipetrain::testing::LocalClusterOptions;
using ::pipetrain::testing::Losses;
using ::pipetrain::testing::LossesMatch;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSteps = 8;

// The shared-memory regions process `pid` maps (their names, "/pipetrain-<hex>").
std::vector<std::string> MappedRegions(pid_t pid) {
  std::ifstream maps(absl::StrCat("/proc/", pid, "/maps"));
  std::vector<std::string> regions;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/dev/shm/pipetrain-") != std::string::npos) regions.push_back(line);
  }
  return regions;
}

class SameHostTransportTest : public testing::ClusterJobTest {
 protected:
  SameHostTransportTest() {
    spec_["training"]["steps"] = kSteps;
    spec_["data"]["validate_every_steps"] = 0;
    spec_["checkpoint"]["every_steps"] = 0;
    spec_["pipeline"]["schedule"] = "1f1b";
    // Activations of 8 x 64 x 128 floats (256 KiB): large enough for shared memory
    // (smaller tensors keep to the stream, LinkShm::kMinTensorBytes).
    spec_["model"]["seq_len"] = 64;
    spec_["model"]["d_model"] = 128;
    spec_["training"]["batch_size"] = 32;
  }

  // A job on 3 of the cluster's 4 stages, followed to its end: its status.
  json Run(LocalCluster& c) {
    const std::string id = SubmitAndFollow(c, {"pipeline.stages=3"});
    return Status(c, id);
  }

  // `pipetrain cluster`'s table once some stage reports its links (heartbeats come every
  // 2 s): "" if none does within 20 s.
  std::string ClusterTableOnceLinked(LocalCluster& c) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      auto table = c.Cli({"cluster"});
      if (table.ok() && table->exit_code == 0 &&
          (table->out.find("shm/") != std::string::npos ||
           table->out.find("tcp/") != std::string::npos)) {
        return table->out;
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
    return "";
  }

  // Over every stage's links in `pipetrain cluster --json`: the tensor bytes sent, and
  // of those through shared memory, once some were reported (within 20 s).
  std::pair<uint64_t, uint64_t> LinkBytesOnceSent(LocalCluster& c) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    std::pair<uint64_t, uint64_t> sent{0, 0};
    while (absl::Now() < deadline && sent.first == 0) {
      auto out = c.Cli({"cluster", "--json"});
      if (out.ok() && out->exit_code == 0) {
        sent = {0, 0};
        for (const json& stage : json::parse(out->out).value("stages", json::array())) {
          for (const json& link : stage.value("links", json::array())) {
            sent.first += std::stoull(link.value("bytes_sent", "0"));
            sent.second += std::stoull(link.value("bytes_sent_same_host", "0"));
          }
        }
      }
      if (sent.first == 0) absl::SleepFor(absl::Milliseconds(200));
    }
    return sent;
  }

  // Tensor bytes went where the path says: most through shared memory, or none.
  void ExpectBytesOnThePath(LocalCluster& c, bool same_host) {
    const auto [sent, shm_bytes] = LinkBytesOnceSent(c);
    EXPECT_GT(sent, 0u);
    if (same_host) {
      EXPECT_GT(shm_bytes, sent / 2) << "of " << sent << " bytes sent";
    } else {
      EXPECT_EQ(shm_bytes, 0u);
    }
  }

  // Every stage maps at most its two links' regions; `some`: and some stage maps any.
  void ExpectOnlyCurrentLinksMapped(LocalCluster& c, bool some) {
    size_t total = 0;
    for (pid_t pid : c.stage_pids()) {
      const std::vector<std::string> regions = MappedRegions(pid);
      EXPECT_LE(regions.size(), 4u) << "stage pid " << pid << ": " << ::testing::PrintToString(regions);
      total += regions.size();
    }
    EXPECT_EQ(total > 0, some) << total << " regions mapped";
  }
};

TEST_F(SameHostTransportTest, BothPathsGiveTheSameLossesAndSayWhichTheyTook) {
  std::vector<double> losses[2];
  for (const bool same_host : {true, false}) {
    LocalClusterOptions options;
    options.stage_args = {"--same-host-transport", same_host ? "auto" : "off"};
    auto cluster = LocalCluster::Start(dir_.File(same_host ? "auto" : "off"), 4, options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    const json done = Run(**cluster);
    ASSERT_EQ(done["state"], "SUCCEEDED") << done.dump() << (*cluster)->stage_logs();
    losses[same_host] = Losses(done);
    const std::string logs = (*cluster)->stage_logs();
    if (same_host && logs.find("shared-memory region") != std::string::npos) {
      GTEST_SKIP() << "this machine cannot make the regions (a small /dev/shm?): " << logs;
    }
    if (same_host) {
      EXPECT_THAT(logs, HasSubstr("sending on shared memory (")) << logs;
      EXPECT_THAT(logs, HasSubstr("receiving on shared memory (")) << logs;
      EXPECT_THAT(logs, Not(HasSubstr("on tcp"))) << logs;
    } else {
      EXPECT_THAT(logs, HasSubstr("sending on tcp (--same-host-transport off)")) << logs;
      EXPECT_THAT(logs, Not(HasSubstr("on shared memory"))) << logs;
    }
    ExpectOnlyCurrentLinksMapped(**cluster, /*some=*/same_host);
    // The stages' heartbeats carry the paths to `pipetrain cluster`.
    const std::string want = same_host ? "shm/shm" : "tcp/tcp";
    EXPECT_THAT(ClusterTableOnceLinked(**cluster), HasSubstr(want));
    // The activations and gradients (256 KiB) went where the paths say.
    ExpectBytesOnThePath(**cluster, same_host);
  }
  ASSERT_EQ(losses[true].size(), static_cast<size_t>(kSteps));
  EXPECT_TRUE(LossesMatch(losses[true], losses[false], testing::kSameArithmetic));
}

// Replicas on one host: 2 copies of 2 stages, each link through shared memory or the
// stream, give the same losses (the replicas' gradient average is gloo's either way).
TEST_F(SameHostTransportTest, ReplicasGiveTheSameLossesOnBothPaths) {
  std::vector<double> losses[2];
  for (const bool same_host : {true, false}) {
    LocalClusterOptions options;
    options.stage_args = {"--same-host-transport", same_host ? "auto" : "off"};
    auto cluster =
        LocalCluster::Start(dir_.File(same_host ? "replicas-auto" : "replicas-off"), 4, options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    // 16 sequences a replica in 2 micro-batches of 8: 256 KiB activations again.
    const std::string id = SubmitAndFollow(
        **cluster, {"pipeline.stages=2", "pipeline.replicas=2", "pipeline.micro_batches=2"});
    const json done = Status(**cluster, id);
    ASSERT_EQ(done["state"], "SUCCEEDED") << done.dump() << (*cluster)->stage_logs();
    losses[same_host] = Losses(done);
    const std::string logs = (*cluster)->stage_logs();
    if (same_host && logs.find("shared-memory region") != std::string::npos) {
      GTEST_SKIP() << "this machine cannot make the regions (a small /dev/shm?): " << logs;
    }
    ExpectBytesOnThePath(**cluster, same_host);
  }
  ASSERT_EQ(losses[true].size(), static_cast<size_t>(kSteps));
  EXPECT_TRUE(LossesMatch(losses[true], losses[false], testing::kSameArithmetic));
}

TEST_F(SameHostTransportTest, AStageKilledMidStepIsReplacedAndNoRegionLeaks) {
  LocalClusterOptions options;
  options.stage_args = {"--fail-at", "job-000002:1:4:backward"};
  auto cluster = LocalCluster::Start(dir_.File("state"), 4, options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const json reference = Run(c);
  ASSERT_EQ(reference["state"], "SUCCEEDED") << reference.dump();
  const json done = Run(c);
  const std::string logs = c.stage_logs();
  ASSERT_EQ(done["state"], "SUCCEEDED") << done.dump() << logs;
  EXPECT_THAT(logs, HasSubstr("--fail-at: job 'job-000002' stage 1 step 4")) << logs;
  if (logs.find("shared-memory region") != std::string::npos) {
    GTEST_SKIP() << "this machine cannot make the regions (a small /dev/shm?): " << logs;
  }
  EXPECT_THAT(logs, HasSubstr("sending on shared memory (")) << logs;
  ASSERT_EQ(done.value("recoveries", json::array()).size(), 1u) << done.dump();
  EXPECT_TRUE(LossesMatch(Losses(done), Losses(reference), testing::kSameArithmetic));
  // A third job on the stages that are left: still no more than their links' regions.
  const json third = Run(c);
  EXPECT_EQ(third["state"], "SUCCEEDED") << third.dump();
  ExpectOnlyCurrentLinksMapped(c, /*some=*/true);
}

}  // namespace
}  // namespace pipetrain
