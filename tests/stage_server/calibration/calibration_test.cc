// The stage's calibration for `pipeline.schedule: "auto"` (stage_server/calibration/calibration.h):
// on an emulated device, whose actions take FLOPs over a known rate, the rates it reports
// are that rate's inverse (the sleeps only ever run long); on the cpu backend, rates are
// positive and finite, and a calibration leaves the weights as they were.
#include "stage_server/calibration/calibration.h"

#include <cmath>
#include <thread>
#include <vector>

#include "common/buffer_pool.h"
#include "common/testing/status_matchers.h"
#include "coordinator/rendezvous/rendezvous_service.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/exec/emulated_chunk.h"
#include "stage_server/runtime/stage_runtime.h"
#include "tests/testing/fake_coordinator.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;

model::TransformerConfig SmallConfig() {
  return model::TransformerConfig{.vocab_size = 64, .seq_len = 16, .d_model = 32, .n_heads = 2,
                                  .n_layers = 2};
}

TEST(CalibrationTest, EmulatedRatesAreTheDevicesFlopRate) {
  const model::TransformerConfig config = SmallConfig();
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
  const model::TransformerConfig config = SmallConfig();
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
  const model::TransformerConfig config = SmallConfig();
  auto pool = std::make_shared<common::BufferPool>();
  EmulatedChunk block(config, 1, 2, 2, {.name = "test", .flops = 1e15}, false, pool);
  EXPECT_THAT(CalibrateBlock(block, config, model::PrecisionTable().front(), 2, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EmulatedChunk embedding(config, 0, 1, 2, {.name = "test", .flops = 1e15}, false, pool);
  EXPECT_THAT(CalibrateBlock(embedding, config, model::PrecisionTable().front(), 2, 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(CalibrationTest, AStageRefusesOutOfRangeCalibrations) {
  RuntimeOptions o;
  o.device.kind = DeviceSpec::Kind::kCpu;
  StageRuntime stage(o);
  const model::Precision& fp32 = model::PrecisionTable().front();
  const model::TransformerConfig config = SmallConfig();
  for (const auto& [rows, repetitions] : std::vector<std::pair<int, int>>{
           {0, 1}, {StageRuntime::kMaxCalibrationRows + 1, 1}, {1, 0},
           {1, StageRuntime::kMaxCalibrationRepetitions + 1}}) {
    EXPECT_THAT(stage.Calibrate(config, fp32, rows, repetitions),
                StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("rows")))
        << rows << " rows, " << repetitions << " repetitions";
  }
  model::TransformerConfig no_block = config;
  no_block.n_layers = 0;
  EXPECT_THAT(stage.Calibrate(no_block, fp32, 1, 1),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("no transformer block")));
  o.memory_limit_bytes = 1024;
  StageRuntime small(o);
  EXPECT_THAT(small.Calibrate(config, fp32, 4, 1),
              StatusIs(absl::StatusCode::kResourceExhausted, ::testing::HasSubstr("--memory-limit")));
  EXPECT_THAT(stage.Calibrate(config, fp32, 2, 1), IsOk());
}

// The replicas' all-reduce timed on a ring (StageRuntime::CalibrateRing): stages of
// cpu devices rendezvous through the coordinator's store (a real gRPC server here), all
// time the same bytes and answer a positive median; an emulated stage answers at once
// that it does not reduce; out-of-range requests are refused naming the field.
class RingCalibrationTest : public ::testing::Test {
 protected:
  RingCalibrationTest() : service_(&store_), server_(&service_) {}

  RuntimeOptions Options(DeviceSpec::Kind kind) const {
    RuntimeOptions o;
    o.device.kind = kind;
    if (kind == DeviceSpec::Kind::kEmulated) o.device.emulated = "1e12";
    o.coordinator_address = server_.address();
    return o;
  }

  static StageRuntime::RingCalibration Ring(int rank, int size, uint64_t bytes) {
    return {.calibration_id = "calibrate-7", .rendezvous_prefix = "ring/", .rank = rank,
            .size = size, .bytes = bytes, .repetitions = 3};
  }

  coordinator::RendezvousStore store_;
  coordinator::RendezvousService service_;
  pipetrain::testing::TestServer server_;
};

TEST_F(RingCalibrationTest, EveryMemberTimesTheSameAllReduce) {
  constexpr int kMembers = 3;
  std::vector<std::unique_ptr<StageRuntime>> stages;
  for (int i = 0; i < kMembers; ++i) {
    stages.push_back(std::make_unique<StageRuntime>(Options(DeviceSpec::Kind::kCpu)));
  }
  std::vector<absl::StatusOr<StageRuntime::RingTime>> times(kMembers,
                                                            absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kMembers; ++i) {
    threads.emplace_back([&, i] { times[i] = stages[i]->CalibrateRing(Ring(i, kMembers, 1 << 20)); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kMembers; ++i) {
    ASSERT_THAT(times[i], IsOk()) << "member " << i;
    EXPECT_FALSE(times[i]->emulated);
    EXPECT_GT(times[i]->allreduce_s, 0) << "member " << i;
    EXPECT_LT(times[i]->allreduce_s, 30) << "member " << i;
  }
  EXPECT_GT(store_.keys("calibrate-7"), 0) << "the ring met through the coordinator's store";
}

TEST_F(RingCalibrationTest, OneUntimedCallThenTheTimedOnesOnAPatternNeverZero) {
  // TimeAllReduce refills its buffer with a non-zero pattern before every call (the sums
  // of a real ring would otherwise grow without bound); a recording reducer sees it.
  struct Recording : collective::GradientReducer {
    absl::Status AllReduceSum(std::span<float> data, absl::Duration) override {
      ++calls;
      last.assign(data.begin(), data.end());
      return absl::OkStatus();
    }
    absl::Status ReduceScatterSum(std::span<float>, absl::Duration) override {
      return absl::UnimplementedError("calibration times the all-reduce only");
    }
    absl::Status AllGather(std::span<float>, absl::Duration) override {
      return absl::UnimplementedError("calibration times the all-reduce only");
    }
    int rank() const override { return 0; }
    int size() const override { return 1; }
    const char* library() const override { return "recording"; }
    int calls = 0;
    std::vector<float> last;
  } reducer;
  auto t = TimeAllReduce(reducer, 64, 4, absl::Seconds(1));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(reducer.calls, 5) << "one untimed, four timed";
  ASSERT_EQ(reducer.last.size(), 16u);
  for (float v : reducer.last) EXPECT_NE(v, 0.0f) << "never zeros";
  EXPECT_THAT(TimeAllReduce(reducer, 6, 1, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("6 bytes")));
  EXPECT_THAT(TimeAllReduce(reducer, 8, 0, absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(RingCalibrationTest, AnEmulatedStageSaysItDoesNotReduce) {
  StageRuntime stage(Options(DeviceSpec::Kind::kEmulated));
  auto t = stage.CalibrateRing(Ring(1, 4, 1 << 20));
  ASSERT_THAT(t, IsOk());
  EXPECT_TRUE(t->emulated);
  EXPECT_EQ(t->allreduce_s, 0);
  EXPECT_EQ(store_.keys("calibrate-7"), 0) << "it connected to nobody";
}

TEST_F(RingCalibrationTest, OutOfRangeRequestsAreRefusedNamingTheField) {
  StageRuntime stage(Options(DeviceSpec::Kind::kCpu));
  const std::pair<StageRuntime::RingCalibration, std::string> cases[] = {
      {Ring(0, 1, 64), "ring.size (1)"},
      {Ring(2, 2, 64), "ring.rank (2) must be in [0, 2)"},
      {Ring(-1, 2, 64), "ring.rank (-1)"},
      {Ring(0, 2, 6), "ring.bytes (6)"},
      {Ring(0, 2, 0), "ring.bytes (0)"},
      {Ring(0, 2, StageRuntime::kMaxRingCalibrationBytes + 4), "ring.bytes"}};
  for (const auto& [bad, field] : cases) {
    EXPECT_THAT(stage.CalibrateRing(bad),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(::testing::HasSubstr("calibrate-7"),
                                          ::testing::HasSubstr(field))))
        << field;
  }
  StageRuntime::RingCalibration no_repetitions = Ring(0, 2, 64);
  no_repetitions.repetitions = 0;
  EXPECT_THAT(stage.CalibrateRing(no_repetitions),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("repetitions (0)")));
}

}  // namespace
}  // namespace pipetrain::stage_server
