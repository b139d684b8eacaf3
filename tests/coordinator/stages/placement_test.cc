// PlaceReplicas: the order r*K+s of a job's R x K stages puts each stage position's R
// copies on as few hosts as possible, moves nothing it need not, and is deterministic;
// StageHost reads the host of IPv4, IPv6 and named addresses; DescribePlacement's line.
#include "coordinator/stages/placement.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Stages named stage-1, stage-2, ... (registry order) at these addresses.
std::vector<StageRecord> At(const std::vector<std::string>& addresses) {
  std::vector<StageRecord> out;
  for (size_t i = 0; i < addresses.size(); ++i) {
    StageRecord r;
    r.stage_id = absl::StrCat("stage-", i + 1);
    r.address = addresses[i];
    out.push_back(r);
  }
  return out;
}

std::vector<std::string> Ids(const std::vector<StageRecord>& stages) {
  std::vector<std::string> out;
  for (const StageRecord& s : stages) out.push_back(s.stage_id);
  return out;
}

// The hosts of position s's copies in a placement ordered r*K+s.
std::set<std::string> HostsOf(const std::vector<StageRecord>& placed, int r, int k, int s) {
  std::set<std::string> out;
  for (int i = 0; i < r; ++i) out.insert(StageHost(placed[i * k + s].address));
  return out;
}

// Every input stage appears exactly once.
void ExpectPermutation(const std::vector<StageRecord>& placed,
                       const std::vector<StageRecord>& input) {
  std::vector<std::string> a = Ids(placed), b = Ids(input);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
}

TEST(StageHostTest, ReadsTheHostPartOfEveryAddressForm) {
  EXPECT_EQ(StageHost("10.0.0.5:50051"), "10.0.0.5");
  EXPECT_EQ(StageHost("[::1]:7000"), "::1");
  EXPECT_EQ(StageHost("[fd00::2]:50051"), "fd00::2");
  EXPECT_EQ(StageHost("node3:50051"), "node3");
  EXPECT_EQ(StageHost("node3"), "node3");
  // Not HOST:PORT (a bare IPv6 address): the whole address is its host.
  EXPECT_EQ(StageHost("fd00::2"), "fd00::2");
}

TEST(PlaceReplicasTest, TwoHostsOfTwoStagesPutEachPositionsCopiesOnOneHost) {
  // Registered host by host: in registry order replica 0 would be both stages of host
  // a, and each position's all-reduce would cross hosts.
  const auto input = At({"10.0.0.5:1", "10.0.0.5:2", "10.0.0.6:1", "10.0.0.6:2"});
  const auto placed = PlaceReplicas(input, 2, 2);
  ExpectPermutation(placed, input);
  EXPECT_EQ(HostsOf(placed, 2, 2, 0), std::set<std::string>{"10.0.0.5"});
  EXPECT_EQ(HostsOf(placed, 2, 2, 1), std::set<std::string>{"10.0.0.6"});
  EXPECT_THAT(Ids(placed), ElementsAre("stage-1", "stage-3", "stage-2", "stage-4"));
  EXPECT_THAT(PositionsSpanningHosts(placed, 2, 2), IsEmpty());
  EXPECT_THAT(PositionsSpanningHosts(input, 2, 2), ElementsAre(0, 1));
}

TEST(PlaceReplicasTest, AnInputAlreadyPlacedWellIsUnchanged) {
  const auto input = At({"a:1", "b:1", "a:2", "b:2"});
  EXPECT_THAT(Ids(PlaceReplicas(input, 2, 2)), ElementsAre("stage-1", "stage-2", "stage-3",
                                                           "stage-4"));
}

TEST(PlaceReplicasTest, MoreHostsThanNeededTakesWholeHostsForEachPosition) {
  // R = 2, K = 3 on 6 stages of 4 hosts: hosts b and d hold two stages each, a and c
  // one each; two positions fit on b and d, the third must span a and c.
  const auto input = At({"a:1", "b:1", "c:1", "b:2", "d:1", "d:2"});
  const auto placed = PlaceReplicas(input, 2, 3);
  ExpectPermutation(placed, input);
  int single = 0;
  for (int s = 0; s < 3; ++s) single += HostsOf(placed, 2, 3, s).size() == 1 ? 1 : 0;
  EXPECT_EQ(single, 2);
  const std::vector<int> spanning = PositionsSpanningHosts(placed, 2, 3);
  ASSERT_EQ(spanning.size(), 1u);
  EXPECT_EQ(HostsOf(placed, 2, 3, spanning[0]), (std::set<std::string>{"a", "c"}));
  // The registry order had every position across two hosts.
  EXPECT_EQ(PositionsSpanningHosts(input, 2, 3).size(), 3u);
}

TEST(PlaceReplicasTest, ABigHostHoldsSeveralPositionsAndLeftoversGoWhereMostAre) {
  // R = 3, K = 2: host a holds 4, b 2: one position on a, the other two of b and one of a.
  const auto input = At({"a:1", "b:1", "a:2", "a:3", "b:2", "a:4"});
  const auto placed = PlaceReplicas(input, 3, 2);
  ExpectPermutation(placed, input);
  std::vector<std::set<std::string>> hosts = {HostsOf(placed, 3, 2, 0), HostsOf(placed, 3, 2, 1)};
  std::sort(hosts.begin(), hosts.end(),
            [](const auto& x, const auto& y) { return x.size() < y.size(); });
  EXPECT_EQ(hosts[0], std::set<std::string>{"a"});
  EXPECT_EQ(hosts[1], (std::set<std::string>{"a", "b"}));
}

TEST(PlaceReplicasTest, EveryStageOnItsOwnHostKeepsTheOrder) {
  const auto input = At({"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1", "10.0.0.4:1"});
  EXPECT_THAT(Ids(PlaceReplicas(input, 2, 2)), ElementsAre("stage-1", "stage-2", "stage-3",
                                                           "stage-4"));
  EXPECT_THAT(PositionsSpanningHosts(input, 2, 2), ElementsAre(0, 1));
}

TEST(PlaceReplicasTest, OneHostForAllKeepsTheOrder) {
  const auto input = At({"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"});
  EXPECT_THAT(Ids(PlaceReplicas(input, 2, 2)), ElementsAre("stage-1", "stage-2", "stage-3",
                                                           "stage-4"));
  EXPECT_THAT(PositionsSpanningHosts(input, 2, 2), IsEmpty());
}

TEST(PlaceReplicasTest, IPv6AndNamedHostsAreGroupedByHost) {
  // One host written with different ports is one host.
  const auto input = At({"[fd00::1]:7000", "[fd00::1]:7001", "node3:50051", "node3:50052"});
  const auto placed = PlaceReplicas(input, 2, 2);
  EXPECT_EQ(HostsOf(placed, 2, 2, 0), std::set<std::string>{"fd00::1"});
  EXPECT_EQ(HostsOf(placed, 2, 2, 1), std::set<std::string>{"node3"});
}

TEST(PlaceReplicasTest, OneReplicaIsUnchanged) {
  const auto input = At({"a:1", "b:1", "a:2", "b:2"});
  EXPECT_THAT(Ids(PlaceReplicas(input, 1, 4)), ElementsAre("stage-1", "stage-2", "stage-3",
                                                           "stage-4"));
  EXPECT_THAT(PositionsSpanningHosts(input, 1, 4), IsEmpty());
}

TEST(PlaceReplicasTest, AWrongCountIsUnchanged) {
  const auto input = At({"a:1", "a:2", "b:1"});
  EXPECT_THAT(Ids(PlaceReplicas(input, 2, 2)), ElementsAre("stage-1", "stage-2", "stage-3"));
}

TEST(PlaceReplicasTest, TheSameInputGivesTheSamePlacement) {
  const auto input = At({"a:1", "a:2", "b:1", "c:1", "b:2", "c:2", "a:3", "d:1"});
  const auto first = Ids(PlaceReplicas(input, 2, 4));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(Ids(PlaceReplicas(input, 2, 4)), first);
  ExpectPermutation(PlaceReplicas(input, 2, 4), input);
  // Another registry order may place differently, but both find the fewest spanning
  // positions there are: host a's third stage and host d's one must share a position.
  auto reversed = input;
  std::reverse(reversed.begin(), reversed.end());
  EXPECT_EQ(PositionsSpanningHosts(PlaceReplicas(input, 2, 4), 2, 4).size(), 1u);
  EXPECT_EQ(PositionsSpanningHosts(PlaceReplicas(reversed, 2, 4), 2, 4).size(), 1u);
}

TEST(DescribePlacementTest, NamesEachPositionsHostAndTheOnesThatSpanHosts) {
  const auto together = PlaceReplicas(At({"10.0.0.5:1", "10.0.0.5:2", "10.0.0.6:1",
                                          "10.0.0.6:2"}), 2, 2);
  EXPECT_EQ(DescribePlacement(together, 2, 2),
            "replicas placed: stage position 0 on host 10.0.0.5 (2 copies), stage position 1 "
            "on host 10.0.0.6 (2 copies)");
  const std::string apart = DescribePlacement(At({"a:1", "b:1", "c:1", "d:1"}), 2, 2);
  EXPECT_THAT(apart, HasSubstr("stage position 0 spans 2 hosts (1 copy on a, 1 copy on c)"));
  EXPECT_THAT(apart, HasSubstr("stage positions 0, 1 have copies on more than one host"));
  EXPECT_THAT(DescribePlacement(together, 2, 2), Not(HasSubstr("more than one host")));
}

}  // namespace
}  // namespace pipetrain::coordinator
