// MemoryBreakdown and the limits a stage checks it against: which parts each limit
// counts on each device, the one message shape, saturation, and the sizes derived from
// a chunk's parameters (its state; its checkpoint's bound, against a real export).
#include "stage_server/runtime/memory_breakdown.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/checkpoint.h"
#include "common/model/optimizer_split.h"
#include "common/safetensors.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/compute/chunk_checkpoint.h"
#include "stage_server/compute/cpu_backend.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

JobConfig Job(int micro_batch_size) {
  JobConfig c;
  c.job_id = "m";
  c.stage = 1;
  c.num_stages = 2;
  c.model = model::TransformerConfig{32, 8, 16, 2, 4, false};
  c.chunks = {{1, c.model.num_pipeline_layers()}};
  c.micro_batch_size = micro_batch_size;
  c.snapshot_reserve_bytes = 777;
  return c;
}

TEST(MemoryBreakdownTest, ThePartsAreTheStateTheBuffersOneMicroBatchAndTheReserve) {
  const JobConfig c = Job(3);
  const MemoryBreakdown cpu = MemoryOf(c, DeviceSpec::Kind::kCpu, false);
  EXPECT_EQ(cpu.state, ParamsOf(c) * 16) << "fp32 weight, gradient and two AdamW moments";
  EXPECT_EQ(cpu.buffers, BackendChunk::BufferBytes(c.model, 1, c.model.num_pipeline_layers(), 3));
  EXPECT_GT(cpu.activations, 0u);
  EXPECT_EQ(cpu.reserve, 777u);
  EXPECT_EQ(cpu.links, LinkBytes(c, false));
  EXPECT_EQ(cpu.Total(), cpu.state + cpu.buffers + cpu.activations + cpu.reserve + cpu.links);
  // Activations grow with the micro-batch; an emulated stage allocates no buffers.
  EXPECT_GT(MemoryOf(Job(6), DeviceSpec::Kind::kCpu, false).activations, cpu.activations);
  const MemoryBreakdown emulated = MemoryOf(c, DeviceSpec::Kind::kEmulated, false);
  EXPECT_EQ(emulated.buffers, 0u);
  EXPECT_EQ(emulated.state, cpu.state);
  EXPECT_EQ(emulated.activations, cpu.activations);
}

// Copies that split the optimizer (shard_optimizer with replicas) keep AdamW's moments for
// their piece of every layer: counted by a bound at least what the chunk holds (each
// layer's RangeOfCopy) and at most one element a layer over the even share; the weights
// and gradients stay whole. One replica, or no shard_optimizer: no split.
TEST(MemoryBreakdownTest, CopiesThatSplitTheOptimizerCountTheirPieceOfTheMoments) {
  JobConfig c = Job(1);
  c.replicas = 3;
  c.replica = 1;
  EXPECT_EQ(MomentParamsOf(c), ParamsOf(c)) << "replicas without the split hold every moment";
  c.shard_optimizer = true;
  uint64_t held = 0;
  const int layers = c.model.num_pipeline_layers() - 1;
  for (int l = 1; l < c.model.num_pipeline_layers(); ++l) {
    held += model::RangeOfCopy(static_cast<uint64_t>(model::ParamsOfLayer(c.model, l)), 3, 1).size();
  }
  EXPECT_GE(MomentParamsOf(c), held);
  EXPECT_LE(MomentParamsOf(c), ParamsOf(c) / 3 + layers);
  EXPECT_LT(MomentParamsOf(c), ParamsOf(c) / 2);
  EXPECT_EQ(StateBytes(c), ParamsOf(c) * 8 + MomentParamsOf(c) * 8)
      << "fp32 weight and gradient whole, the two moments for the piece";
  EXPECT_LT(MemoryOf(c, DeviceSpec::Kind::kCpu, false).state, ParamsOf(c) * 16);
  c.replicas = 1;
  c.replica = 0;
  EXPECT_EQ(MomentParamsOf(c), ParamsOf(c)) << "one replica has nothing to split with";
}

// A Llama chunk that holds a block holds one pair of rotary tables, 2 x T x hs/2 fp32,
// counted once per chunk (not per block) on every device kind, as the planner counts
// them; a chunk of only the embedding or the head holds none, and GPT-2 none at all.
TEST(MemoryBreakdownTest, EachLlamaChunkWithABlockCountsOnePairOfRotaryTables) {
  JobConfig c = Job(3);
  EXPECT_EQ(MemoryOf(c, DeviceSpec::Kind::kCpu, false).tables, 0u) << "GPT-2";
  c.model.family = "llama";  // T 8, C 16, 2 heads of 8: tables of 8 x 4
  c.model.n_kv_heads = 1;
  c.model.ffn_dim = 24;
  c.model.rope_theta = 10000;
  c.model.norm_eps = 1e-5;
  ASSERT_THAT(model::ValidateConfig(c.model), IsOk());
  const uint64_t pair = 2 * 8 * 4 * 4;
  const int n = c.model.num_pipeline_layers();  // embedding, 4 blocks, head
  c.chunks = {{0, 1}, {1, 3}, {3, n - 1}, {n - 1, n}};  // as a stage of several chunks
  EXPECT_EQ(TableBytes(c), 2 * pair);
  const MemoryBreakdown cpu = MemoryOf(c, DeviceSpec::Kind::kCpu, false);
  EXPECT_EQ(cpu.tables, 2 * pair);
  EXPECT_EQ(cpu.Total(),
            cpu.state + cpu.tables + cpu.buffers + cpu.activations + cpu.reserve + cpu.links);
  c.chunks = {{0, n}};
  EXPECT_EQ(MemoryOf(c, DeviceSpec::Kind::kCpu, false).tables, pair) << "one pair for 4 blocks";
  // An emulated stage sizes the tables it emulates, as it sizes the state; its host holds
  // neither.
  const MemoryBreakdown emulated = MemoryOf(c, DeviceSpec::Kind::kEmulated, false);
  EXPECT_EQ(emulated.tables, pair);
  const std::vector<MemoryLimit> limits =
      MemoryLimitsOf(emulated, DeviceSpec::Kind::kEmulated, 0, 1 << 30);
  ASSERT_EQ(limits.size(), 1u);
  EXPECT_EQ(limits[0].counted.tables, 0u);
  EXPECT_EQ(limits[0].counted.state, 0u);
  // Over a limit, the part is named with its field.
  const MemoryLimit limit{"--memory-limit", 1, {.state = 10, .tables = pair}};
  EXPECT_THAT(CheckFits(c, limit),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr(absl::StrCat(pair, " for the layers' shared tables (rotary "
                                                    "angles, field model.seq_len 8)"))));
}

// Per neighbour, a link keeps warm buffers as large as its own region and, with the
// same-host path on, that region: four of the largest tensors in slots of at least
// 4 KiB (at least 8 slots), at most 64 MiB, as a tied GPT-2 vocabulary's gradient needs.
TEST(MemoryBreakdownTest, EachNeighbourCountsItsLinksBuffersAndWithTheSameHostPathItsRegion) {
  const JobConfig last = Job(3);  // stage 1 of 2: a neighbour upstream
  const uint64_t region = 8 * 4096;  // its largest tensor, 3 x 8 x 16 fp32, fits a slot
  EXPECT_EQ(MemoryOf(last, DeviceSpec::Kind::kCpu, false).links, region);
  EXPECT_EQ(MemoryOf(last, DeviceSpec::Kind::kCpu, true).links, 2 * region);
  JobConfig middle = last;
  middle.num_stages = 3;
  middle.chunks = {{1, 2}};
  EXPECT_EQ(MemoryOf(middle, DeviceSpec::Kind::kEmulated, true).links, 4 * region);
  JobConfig alone = last;
  alone.stage = 0;
  alone.num_stages = 1;
  alone.chunks = {{0, last.model.num_pipeline_layers()}};
  EXPECT_EQ(MemoryOf(alone, DeviceSpec::Kind::kCpu, true).links, 0u) << "no neighbour";
  JobConfig tied = last;
  tied.model = model::TransformerConfig{50257, 8, 768, 2, 4, true};
  tied.chunks = {{1, tied.model.num_pipeline_layers()}};
  EXPECT_EQ(MemoryOf(tied, DeviceSpec::Kind::kCpu, true).links, uint64_t{256} << 20)
      << "a 154 MB gradient: the region's cap and as much of warm buffers, on the link "
         "upstream and on the tied embedding's link back to stage 0";
  // Counted against the limits of the host it lives in, and named.
  const MemoryBreakdown need{.state = 100, .links = 50};
  EXPECT_EQ(MemoryLimitsOf(need, DeviceSpec::Kind::kCpu, 1000, 5000)[0].counted.links, 50u);
  EXPECT_EQ(MemoryLimitsOf(need, DeviceSpec::Kind::kCpu, 1000, 5000)[1].counted.links, 50u);
  EXPECT_EQ(MemoryLimitsOf(need, DeviceSpec::Kind::kCuda, 1000, 5000)[0].counted.links, 0u)
      << "a CUDA stage's --memory-limit is its GPU's";
  EXPECT_THAT(CheckFits(last, {"--memory-limit", 120, need}),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("50 for the peer links' buffers and shared memory (field "
                                 "micro_batch_size 3; pipetrain-stage --same-host-transport)")));
}

TEST(MemoryBreakdownTest, EachLimitCountsWhatItBounds) {
  const MemoryBreakdown need{.state = 100, .buffers = 20, .activations = 5, .reserve = 7};
  // --memory-limit: all but the activations (the planner fits those); the host's memory
  // on a CPU stage: all of it.
  std::vector<MemoryLimit> limits = MemoryLimitsOf(need, DeviceSpec::Kind::kCpu, 1000, 5000);
  ASSERT_EQ(limits.size(), 2u);
  EXPECT_EQ(limits[0].name, "--memory-limit");
  EXPECT_EQ(limits[0].bytes, 1000u);
  EXPECT_EQ(limits[0].counted.Total(), 127u);
  EXPECT_EQ(limits[1].bytes, 5000u);
  EXPECT_EQ(limits[1].counted.Total(), 132u);
  // An emulated stage holds no state on its host; a CUDA stage's GPU refuses for itself.
  limits = MemoryLimitsOf(need, DeviceSpec::Kind::kEmulated, 1000, 5000);
  ASSERT_EQ(limits.size(), 2u);
  EXPECT_EQ(limits[0].counted.Total(), 127u);
  EXPECT_EQ(limits[1].counted.Total(), 32u);
  limits = MemoryLimitsOf(need, DeviceSpec::Kind::kCuda, 1000, 5000);
  ASSERT_EQ(limits.size(), 1u);
  EXPECT_EQ(limits[0].name, "--memory-limit");
  // No --memory-limit, host memory unknown: nothing to check.
  EXPECT_TRUE(MemoryLimitsOf(need, DeviceSpec::Kind::kCpu, 0, 0).empty());
}

TEST(MemoryBreakdownTest, OneMessageShapeNamesTheCountedPartsTheirFieldsAndTheLimit) {
  const JobConfig c = Job(3);
  const MemoryLimit limit{"the host's memory", 131,
                          {.state = 100, .buffers = 20, .activations = 5, .reserve = 7}};
  EXPECT_THAT(
      CheckFits(c, limit),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("configure of job 'm' stage 1: needs 132 bytes ("),
                     HasSubstr("100 for weights, gradients and optimizer state"),
                     HasSubstr("20 for micro-batch buffers (field micro_batch_size 3)"),
                     HasSubstr("5 for the activations of one micro-batch (field "
                               "micro_batch_size 3, rows of 8 tokens)"),
                     HasSubstr("7 for in-memory snapshots (field snapshot_reserve_bytes)"),
                     HasSubstr(") but this stage has 131 (the host's memory)"),
                     HasSubstr("turn snapshots off"))));
  // Exactly at the limit fits; a part that is not counted is not named.
  MemoryLimit at = limit;
  at.bytes = 132;
  EXPECT_THAT(CheckFits(c, at), IsOk());
  MemoryLimit no_reserve{"--memory-limit", 10, {.state = 100}};
  EXPECT_THAT(CheckFits(c, no_reserve),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("needs 100 bytes (100 for weights"),
                             Not(HasSubstr("buffers")), Not(HasSubstr("snapshots")))));
}

// Sizes a request sets saturate instead of wrapping, and no limit admits them.
TEST(MemoryBreakdownTest, HugeRequestsSaturateAndAreRefused) {
  constexpr int kBig = std::numeric_limits<int>::max();
  JobConfig c = Job(kBig);
  c.model = model::TransformerConfig{8, kBig, kBig, 1, 1, false};
  c.chunks = {{0, 3}};
  c.snapshot_reserve_bytes = UINT64_MAX;
  const MemoryBreakdown need = MemoryOf(c, DeviceSpec::Kind::kCpu, false);
  EXPECT_EQ(need.activations, UINT64_MAX);
  EXPECT_EQ(need.Total(), UINT64_MAX);
  const MemoryLimit limit{"--memory-limit", UINT64_MAX - 1, need};
  EXPECT_THAT(CheckFits(c, limit), StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(MemoryBreakdownTest, BytesPerParameterComeFromTheDtypeTable) {
  const uint64_t f32 = common::DTypeSize(common::DType::kF32);
  EXPECT_EQ(WeightBytesPerParam(), f32);
  EXPECT_EQ(model::GradientBytesPerParam(), f32);
  EXPECT_EQ(OptimizerBytesPerParam(), 2 * f32);
  EXPECT_EQ(StateBytesPerParam(), 4 * f32);
  EXPECT_EQ(StateBytesPerParam(common::DType::kF32), 4 * f32);
  // bf16 products read a bf16 copy of each weight, made once per step.
  EXPECT_EQ(StateBytesPerParam(common::DType::kBF16),
            4 * f32 + common::DTypeSize(common::DType::kBF16));
  EXPECT_EQ(CheckpointBytesPerParam(), 3 * f32);
}

// The bound is a real checkpoint's data plus the most header a reader accepts: a
// chunk's export (weights, moments, step) is within it and, untied (every parameter
// stored once), no more than that header slack below it.
TEST(MemoryBreakdownTest, AChunksCheckpointIsWithinItsBound) {
  auto backend = *compute::CpuBackend::Create(1);
  for (bool tied : {false, true}) {
    const model::TransformerConfig model{32, 8, 16, 2, 4, tied};
    for (const auto& [begin, end] : {std::pair{0, 2}, std::pair{2, 6}, std::pair{0, 6}}) {
      SCOPED_TRACE(absl::StrCat(begin, "..", end, tied ? " tied" : ""));
      auto chunk = *compute::ModelChunk::Create(model, begin, end, backend.get());
      ASSERT_THAT(chunk->Initialize(1), IsOk());
      auto ckpt = compute::CheckpointOfChunk(*chunk, /*with_optimizer=*/true);
      ASSERT_THAT(ckpt, IsOk());
      const std::string bytes = *model::SerializeCheckpoint(*ckpt);
      const uint64_t bound = MaxChunkCheckpointBytes(static_cast<uint64_t>(chunk->NumParams()));
      EXPECT_LE(bytes.size(), bound);
      if (!tied) {
        EXPECT_LE(bound - bytes.size(), 8 + common::kMaxSafetensorsHeaderBytes);
      }
    }
  }
  EXPECT_EQ(MaxChunkCheckpointBytes(UINT64_MAX), UINT64_MAX);
}

}  // namespace
}  // namespace pipetrain::stage_server
