// The stage's calibration for `pipeline.schedule: "auto"` (stage_server/calibration.h):
// on an emulated device, whose actions take FLOPs over a known rate, the rates it reports
// are that rate's inverse (the sleeps only ever run long); on the cpu backend, rates are
// positive and finite, and a calibration leaves the weights as they were.
#include "stage_server/calibration.h"

#include <cmath>

#include "common/buffer_pool.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/backend_chunk.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/emulated_chunk.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;

model::GptConfig SmallConfig() {
  return model::GptConfig{.vocab_size = 64, .seq_len = 16, .d_model = 32, .n_heads = 2,
                          .n_layers = 2};
}

TEST(CalibrationTest, EmulatedRatesAreTheDevicesFlopRate) {
  const model::GptConfig config = SmallConfig();
  // About 2 ms a forward: long against timer slack, short for a test.
  const model::LayerCost cost = model::CostOfLayer(config, kCalibrationLayer);
  const int rows = 4;
  const double flops = cost.forward_flops * rows * config.seq_len / 2e-3;
  EmulatedChunk chunk(config, kCalibrationLayer, kCalibrationLayer + 1, rows,
                      {.name = "test", .flops = flops}, false,
                      std::make_shared<common::BufferPool>());
  auto r = CalibrateBlock(chunk, config, model::PrecisionTable().front(), rows, 3);
  ASSERT_THAT(r, IsOk());
  // A sleep never ends early; a loaded machine may wake it late, hence the wide top.
  for (double rate : {r->forward_s_per_flop, r->backward_input_s_per_flop,
                      r->backward_weight_s_per_flop}) {
    EXPECT_GE(rate * flops, 0.999);
    EXPECT_LT(rate * flops, 5.0);
  }
  EXPECT_EQ(r->repetitions, 3);
}

TEST(CalibrationTest, CpuRatesArePositiveAndTheWeightsStay) {
  const model::GptConfig config = SmallConfig();
  auto backend = compute::CpuBackend::Create(1);
  ASSERT_THAT(backend, IsOk());
  auto layers = compute::ModelChunk::Create(config, kCalibrationLayer, kCalibrationLayer + 1,
                                            backend->get());
  ASSERT_THAT(layers, IsOk());
  ASSERT_THAT((*layers)->Initialize(7), IsOk());
  const std::string name = (*layers)->Params().front().name;
  auto before = (*layers)->GetParam(name);
  ASSERT_THAT(before, IsOk());
  compute::ModelChunk* view = layers->get();
  auto chunk = BackendChunk::Create(*std::move(layers), 2, std::make_shared<common::BufferPool>());
  ASSERT_THAT(chunk, IsOk());
  auto r = CalibrateBlock(**chunk, config, model::PrecisionTable().front(), 2, 2);
  ASSERT_THAT(r, IsOk());
  for (double rate : {r->forward_s_per_flop, r->backward_input_s_per_flop,
                      r->backward_weight_s_per_flop, r->optimizer_s_per_param}) {
    EXPECT_GT(rate, 0);
    EXPECT_TRUE(std::isfinite(rate));
  }
  auto after = view->GetParam(name);
  ASSERT_THAT(after, IsOk());
  EXPECT_EQ(*after, *before) << "a calibration must not train the stage's chunk";
}

TEST(CalibrationTest, RefusesBadArgumentsAndAChunkWithTheEmbedding) {
  const model::GptConfig config = SmallConfig();
  auto pool = std::make_shared<common::BufferPool>();
  EmulatedChunk block(config, 1, 2, 2, {.name = "test", .flops = 1e15}, false, pool);
  EXPECT_THAT(CalibrateBlock(block, config, model::PrecisionTable().front(), 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EmulatedChunk embedding(config, 0, 1, 2, {.name = "test", .flops = 1e15}, false, pool);
  EXPECT_THAT(CalibrateBlock(embedding, config, model::PrecisionTable().front(), 2, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pipetrain::stage_server
