// The stage service's translation of a Configure request: the per-chunk recompute list
// is taken as the coordinator sent it, and refused by its field when it does not give
// one entry per chunk. The stage applies no recompute rule of its own. A step's learning
// rate is taken as sent, 0 included.
#include <cmath>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/stage.pb.h"
#include "stage_server/stage_service.h"

namespace pipetrain::stage_server {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// Stage 1 of 2 with two chunks: the last stage, which a stage-side rule would spare.
pb::ConfigureRequest TwoChunks() {
  pb::ConfigureRequest r;
  r.set_job_id("j1");
  r.set_stage(1);
  r.set_num_stages(2);
  pb::ModelConfig* m = r.mutable_model();
  m->set_vocab_size(8);
  m->set_seq_len(4);
  m->set_d_model(4);
  m->set_n_heads(2);
  m->set_n_layers(2);
  for (int c = 0; c < 2; ++c) {
    pb::LayerRange* range = r.add_chunks();
    range->set_chunk(c);
    range->set_begin_layer(1 + 2 * c);
    range->set_end_layer(2 + 2 * c);
  }
  r.set_micro_batch_size(1);
  return r;
}

TEST(StageServiceTest, EachChunkRecomputesAsTheRequestSays) {
  pb::ConfigureRequest r = TwoChunks();
  r.add_chunk_recompute(true);
  r.add_chunk_recompute(false);
  auto config = JobConfigFromProto(r);
  ASSERT_THAT(config, IsOk());
  EXPECT_EQ(config->chunk_recompute, (std::vector<bool>{true, false}));
  EXPECT_TRUE(config->recomputes(0));
  EXPECT_FALSE(config->recomputes(1));
}

TEST(StageServiceTest, NoListMeansNoChunkRecomputes) {
  auto config = JobConfigFromProto(TwoChunks());
  ASSERT_THAT(config, IsOk());
  EXPECT_FALSE(config->recomputes(0));
  EXPECT_FALSE(config->recomputes(1));
}

TEST(StageServiceTest, AListOfAnotherLengthThanTheChunksIsRefusedByItsField) {
  for (int entries : {1, 3}) {
    pb::ConfigureRequest r = TwoChunks();
    for (int i = 0; i < entries; ++i) r.add_chunk_recompute(true);
    EXPECT_THAT(JobConfigFromProto(r),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("chunk_recompute"), HasSubstr("2 chunks"))))
        << entries;
  }
}


// A step's learning rate as the coordinator's schedule gives it: 0 (a decay to min_lr
// 0) is a rate, unset leaves the configured one, and a rate no optimizer can take is
// refused by its field.
TEST(StageServiceTest, AStepsLearningRateOfZeroIsARate) {
  pb::RunStepRequest r;
  r.set_job_id("j1");
  r.set_step(4);
  auto unset = StepRequestFromProto(r);
  ASSERT_THAT(unset, IsOk());
  EXPECT_FALSE(unset->inputs.lr.has_value()) << "the configured rate";
  r.set_lr(0);
  auto zero = StepRequestFromProto(r);
  ASSERT_THAT(zero, IsOk());
  ASSERT_TRUE(zero->inputs.lr.has_value());
  EXPECT_EQ(*zero->inputs.lr, 0.0f);
  r.set_lr(3e-4f);
  auto rate = StepRequestFromProto(r);
  ASSERT_THAT(rate, IsOk());
  EXPECT_EQ(rate->inputs.lr, 3e-4f);
  for (float bad : {-1e-3f, NAN, INFINITY}) {
    r.set_lr(bad);
    EXPECT_THAT(StepRequestFromProto(r),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field lr is")))
        << bad;
  }
}

TEST(StageServiceTest, ADeferredOptimizersLearningRateOfZeroIsARate) {
  pb::ApplyOptimizerRequest r;
  r.set_job_id("j1");
  r.set_step(4);
  auto unset = ApplyOptimizerRequestFromProto(r);
  ASSERT_THAT(unset, IsOk());
  EXPECT_FALSE(unset->lr.has_value()) << "the rate phase 1 was given";
  r.set_lr(0);
  auto zero = ApplyOptimizerRequestFromProto(r);
  ASSERT_THAT(zero, IsOk());
  EXPECT_EQ(zero->lr, 0.0f);
  r.set_lr(-1);
  EXPECT_THAT(ApplyOptimizerRequestFromProto(r),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("field lr is -1, must be >= 0 and finite")));
}

}  // namespace
}  // namespace pipetrain::stage_server
