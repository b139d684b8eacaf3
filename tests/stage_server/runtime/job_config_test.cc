// JobConfig's rules: which neighbour links a stage has (ring with several chunks or a
// tied embedding), the validation that names the field, and the links' options.
#include "stage_server/runtime/job_config.h"

#include <string>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::HasSubstr;

// Stage `stage` of K, one chunk of the model's pipeline layers each where they suffice.
JobConfig StageOf(int stage, int K, int chunks = 1, bool tied = false) {
  JobConfig c;
  c.job_id = "links";
  c.stage = stage;
  c.num_stages = K;
  c.model = model::TransformerConfig{32, 8, 16, 2, 10, tied};
  for (int i = 0; i < chunks; ++i) c.chunks.push_back({i, i + 1});
  c.upstream_address = "up:1";
  c.downstream_address = "down:2";
  return c;
}

TEST(JobConfigTest, APipelineHasLinksBetweenNeighboursOnly) {
  EXPECT_FALSE(LinksOf(StageOf(0, 1)).next);
  EXPECT_FALSE(LinksOf(StageOf(0, 1)).prev);
  EXPECT_TRUE(LinksOf(StageOf(0, 3)).next);
  EXPECT_FALSE(LinksOf(StageOf(0, 3)).prev);
  EXPECT_TRUE(LinksOf(StageOf(1, 3)).next);
  EXPECT_TRUE(LinksOf(StageOf(1, 3)).prev);
  EXPECT_FALSE(LinksOf(StageOf(2, 3)).next);
  EXPECT_TRUE(LinksOf(StageOf(2, 3)).prev);
}

TEST(JobConfigTest, SeveralChunksOrATiedEmbeddingCloseTheRing) {
  for (const JobConfig& c : {StageOf(0, 3, /*chunks=*/2), StageOf(2, 3, 2),
                             StageOf(0, 3, 1, /*tied=*/true), StageOf(2, 3, 1, true)}) {
    EXPECT_TRUE(LinksOf(c).next) << c.stage;
    EXPECT_TRUE(LinksOf(c).prev) << c.stage;
  }
  // One stage has no neighbour, ring or not.
  EXPECT_FALSE(LinksOf(StageOf(0, 1, 2, true)).next);
  EXPECT_FALSE(LinksOf(StageOf(0, 1, 2, true)).prev);
}

// The V placement needs no ring: stage 0 has no upstream link even with a tied
// embedding (both ends are its own), the last stage no downstream one; a middle stage's
// downstream link carries gradients to chunk 0 and activations to chunk 1.
TEST(JobConfigTest, TheVPlacementLinksNeighboursOnlyAndMixesKindsPerChunk) {
  JobConfig first = StageOf(0, 3, 2, /*tied=*/true), middle = StageOf(1, 3, 2),
            last = StageOf(2, 3, 2);
  for (JobConfig* c : {&first, &middle, &last}) c->placement = schedule::Placement::kV;
  EXPECT_FALSE(LinksOf(first).prev);
  EXPECT_TRUE(LinksOf(first).next);
  EXPECT_TRUE(LinksOf(middle).prev && LinksOf(middle).next);
  EXPECT_FALSE(LinksOf(last).next);
  EXPECT_TRUE(LinksOf(last).prev);
  using common::TensorKind;
  EXPECT_EQ(DownstreamLinkOptions(middle).receive_kinds,
            (std::vector<TensorKind>{TensorKind::kGradient, TensorKind::kActivation}));
  EXPECT_EQ(UpstreamLinkOptions(middle).receive_kinds,
            (std::vector<TensorKind>{TensorKind::kActivation, TensorKind::kGradient}));
  // The last stage hands chunk 0's output to chunk 1 itself: nothing arrives on its
  // downstream side, and from upstream an activation for chunk 0, a gradient for chunk 1.
  EXPECT_EQ(UpstreamLinkOptions(last).receive_kinds,
            (std::vector<TensorKind>{TensorKind::kActivation, TensorKind::kGradient}));
}

TEST(JobConfigTest, MoreStagesThanAnyProgramMayHaveAreRefused) {
  JobConfig c = StageOf(0, 3);
  c.num_stages = 1 << 30;
  EXPECT_THAT(ValidateJobConfig(c, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field num_stages must be in [1, 4096]")));
}

TEST(JobConfigTest, ValidationNamesJobStageAndField) {
  EXPECT_THAT(ValidateJobConfig(StageOf(1, 3), false), IsOk());
  JobConfig c = StageOf(1, 3);
  c.micro_batch_size = 0;
  EXPECT_THAT(ValidateJobConfig(c, false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "configure of job 'links' stage 1: field micro_batch_size must be >= 1"));
  c = StageOf(0, 3);
  c.upstream_address.clear();
  EXPECT_THAT(ValidateJobConfig(c, false), IsOk()) << "stage 0 has no upstream neighbour";
  c = StageOf(0, 3, /*chunks=*/2);
  c.upstream_address.clear();
  EXPECT_THAT(ValidateJobConfig(c, false),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field upstream_address is empty but this stage has an "
                                 "upstream neighbour")))
      << "the ring of two chunks comes to stage 0 from stage 2";
  c = StageOf(1, 3);
  c.chunks = {{3, 2}};
  EXPECT_THAT(ValidateJobConfig(c, false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field chunks[0] [3, 2)")));
  c = StageOf(1, 3);
  c.replicas = 2;
  c.rendezvous_prefix = "r";
  EXPECT_THAT(ValidateJobConfig(c, /*has_coordinator=*/false),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--coordinator")));
  EXPECT_THAT(ValidateJobConfig(c, /*has_coordinator=*/true), IsOk());
  c.job_id.clear();
  EXPECT_THAT(ValidateJobConfig(c, true),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field job_id is empty")));
}

TEST(JobConfigTest, TheLinksOptionsNameTheirPeers) {
  const JobConfig c = StageOf(0, 3, 2);
  const PeerLinkOptions down = DownstreamLinkOptions(c), up = UpstreamLinkOptions(c);
  EXPECT_EQ(down.peer_stage, 1);
  EXPECT_EQ(down.peer_address, "down:2");
  EXPECT_EQ(up.peer_stage, 2) << "the ring's predecessor of stage 0";
  EXPECT_EQ(up.peer_address, "up:1");
  for (const PeerLinkOptions& o : {down, up}) {
    EXPECT_EQ(o.job_id, "links");
    EXPECT_EQ(o.local_stage, 0);
    EXPECT_EQ(o.frame_bytes, c.frame_bytes);
  }
}

}  // namespace
}  // namespace pipetrain::stage_server
