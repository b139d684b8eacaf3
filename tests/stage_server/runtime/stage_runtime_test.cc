// StageRuntime in process: what Configure refuses before it allocates, and what an
// import is refused by its declared size before a byte is buffered. The integration
// tests (stage_cluster_test) drive the same through a stage server.
#include "stage_server/runtime/stage_runtime.h"

#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/stage.pb.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/stage_service.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

RuntimeOptions Cpu(uint64_t memory_limit_bytes) {
  RuntimeOptions o;
  o.device.kind = DeviceSpec::Kind::kCpu;
  o.memory_limit_bytes = memory_limit_bytes;
  return o;
}

JobConfig TinyWholeModel(int micro_batch_size) {
  JobConfig c;
  c.job_id = "j1";
  c.model = model::TransformerConfig{8, 4, 4, 2, 1, false};
  c.chunks = {{0, c.model.num_pipeline_layers()}};
  c.micro_batch_size = micro_batch_size;
  return c;
}

// Found by tests/fuzz/configure_fuzz (corpus/configure/huge_micro_batch_size): a
// request whose weights fit a 16 MiB stage but whose micro_batch_size (~6 million
// rows) made BackendChunk allocate 6 GB of micro-batch buffers, past the limit.
TEST(StageRuntimeTest, MicroBatchBuffersCountAgainstTheMemoryLimit) {
  const unsigned char kReproducer[] = {
      0x0a, 0x02, 0x6a, 0x31, 0x10, 0x01, 0x18, 0x02, 0x22, 0x0c, 0x08, 0x08, 0x10, 0x3f,
      0x18, 0x04, 0x20, 0x02, 0x28, 0x01, 0x30, 0x01, 0x2a, 0x04, 0x10, 0x02, 0x18, 0x03,
      0x30, 0x09, 0x3a, 0x05, 0x0d, 0x6f, 0x29, 0x83, 0x3a, 0x42, 0x0b, 0x31, 0x32, 0x37,
      0x2e, 0x12, 0x31, 0x3d, 0x30, 0x6f, 0x3a, 0x32, 0x60, 0xff, 0xff, 0xff, 0x02, 0x6a,
      0x01, 0x73};
  pipetrain::v1::ConfigureRequest request;
  ASSERT_TRUE(request.ParseFromArray(kReproducer, sizeof(kReproducer)));
  auto config = JobConfigFromProto(request);
  ASSERT_TRUE(config.ok()) << config.status();
  StageRuntime runtime(Cpu(uint64_t{16} << 20));
  EXPECT_THAT(runtime.Configure(*config),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("job 'j1' stage 1"), HasSubstr("micro-batch buffers"),
                             HasSubstr("micro_batch_size 6291455"), HasSubstr("--memory-limit"))));
  EXPECT_FALSE(runtime.configured());
}

TEST(StageRuntimeTest, TheLimitIsStatePlusBuffersExactly) {
  const JobConfig config = TinyWholeModel(2);
  const uint64_t state = StateBytes(config);
  const uint64_t buffers =
      BackendChunk::BufferBytes(config.model, 0, config.model.num_pipeline_layers(), 2);
  // Tokens in and targets (2 x 4 int32 each) and the head's 4-byte loss.
  EXPECT_EQ(buffers, 2 * 4 * 4 + 2 * 4 * 4 + 4u);
  StageRuntime tight(Cpu(state + buffers - 1));
  EXPECT_THAT(tight.Configure(config), StatusIs(absl::StatusCode::kResourceExhausted));
  StageRuntime enough(Cpu(state + buffers));
  EXPECT_TRUE(enough.Configure(config).ok());
  EXPECT_TRUE(enough.configured());
}

// Copies that split the optimizer: the limit counts their moments' piece (StateBytes of
// the split config), and a stage with fewer parameters than copies is refused at
// Configure, naming the job and the stage, before anything is allocated.
TEST(StageRuntimeTest, CopiesThatSplitTheOptimizerCountTheirPieceAndMustHaveOne) {
  JobConfig config = TinyWholeModel(2);
  config.replicas = 2;
  config.replica = 1;
  config.rendezvous_prefix = "run-1";
  config.shard_optimizer = true;
  const uint64_t state = StateBytes(config);
  const uint64_t buffers =
      BackendChunk::BufferBytes(config.model, 0, config.model.num_pipeline_layers(), 2);
  JobConfig whole = config;
  whole.shard_optimizer = false;
  EXPECT_LT(state, StateBytes(whole));
  RuntimeOptions tight_options = Cpu(state + buffers - 1), enough_options = Cpu(state + buffers);
  tight_options.coordinator_address = enough_options.coordinator_address = "127.0.0.1:1";
  StageRuntime tight(tight_options);
  EXPECT_THAT(tight.Configure(config), StatusIs(absl::StatusCode::kResourceExhausted));
  StageRuntime enough(enough_options);
  EXPECT_THAT(enough.Configure(config).status(), IsOk());
  // More copies than the stage has parameters.
  config.replicas = static_cast<int>(ParamsOf(config)) + 1;
  StageRuntime refusing(enough_options);
  EXPECT_THAT(refusing.Configure(config).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("job 'j1' stage 0"), HasSubstr("pipeline.shard_optimizer"))));
  EXPECT_FALSE(refusing.configured());
}

// A Llama chunk's rotary tables count too, once per chunk: 2 x T x hs/2 fp32.
TEST(StageRuntimeTest, TheLimitIsStateTablesAndBuffersExactlyForLlama) {
  JobConfig config = TinyWholeModel(2);
  config.model.family = "llama";
  config.model.n_kv_heads = 1;
  config.model.ffn_dim = 8;
  config.model.rope_theta = 10000;
  config.model.norm_eps = 1e-5;
  const uint64_t state = StateBytes(config);
  const uint64_t tables = TableBytes(config);
  EXPECT_EQ(tables, 2u * 4 * 1 * 4);  // T 4, heads of 2
  const uint64_t buffers =
      BackendChunk::BufferBytes(config.model, 0, config.model.num_pipeline_layers(), 2);
  StageRuntime tight(Cpu(state + tables + buffers - 1));
  EXPECT_THAT(tight.Configure(config),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr(absl::StrCat(tables, " for the layers' shared tables"))));
  StageRuntime enough(Cpu(state + tables + buffers));
  EXPECT_THAT(enough.Configure(config).status(), IsOk());
}

TEST(StageRuntimeTest, BufferBytesSaturatesInsteadOfOverflowing) {
  constexpr int kBig = std::numeric_limits<int>::max();
  const model::TransformerConfig huge{8, kBig, kBig, 1, 1, false};
  // A middle chunk holds activations both ways: 4 x rows x T x C bytes each.
  EXPECT_EQ(BackendChunk::BufferBytes(huge, 1, 2, kBig), std::numeric_limits<uint64_t>::max());
  const model::TransformerConfig small{8, 4, 4, 2, 2, false};
  EXPECT_EQ(BackendChunk::BufferBytes(small, 1, 2, 3), 4u * 4 * (3 * 4 * 4));
}

// StateBytes in closed form: each range's layers' parameters x 16 bytes (18 in bf16), as
// the sum over layers; a range past the model (before Configure validates it) counts only
// the layers that exist (found by tests/fuzz/configure_fuzz, corpus/configure/timeout-many-layers:
// sizing a range of 2^31 layers one layer at a time took minutes).
TEST(StageRuntimeTest, StateBytesIsTheLayersParametersTimesSixteen) {
  JobConfig config;
  config.model = model::TransformerConfig{97, 7, 24, 3, 5, false};
  const int n = config.model.num_pipeline_layers();
  const auto by_layer = [&](int begin, int end) {
    uint64_t params = 0;
    for (int l = begin; l < end; ++l) params += model::CostOfLayer(config.model, l).params;
    return params * 16;
  };
  for (const auto& [begin, end] : std::vector<std::pair<int, int>>{
           {0, n}, {0, 1}, {1, 2}, {2, 5}, {n - 1, n}, {0, 3}, {3, n}}) {
    config.chunks = {{begin, end}};
    EXPECT_EQ(StateBytes(config), by_layer(begin, end)) << begin << ".." << end;
  }
  config.chunks = {{0, 2}, {4, n}};  // two chunks, as a V > 1 stage holds
  EXPECT_EQ(StateBytes(config), by_layer(0, 2) + by_layer(4, n));
  config.chunks = {{-5, std::numeric_limits<int>::max()}};
  EXPECT_EQ(StateBytes(config), by_layer(0, n));
  config.chunks = {{3, 2}};
  EXPECT_EQ(StateBytes(config), 0u);
  // bf16 products add each weight's 2-byte bf16 copy: 18 bytes a parameter.
  config.precision = *model::PrecisionNamed("bf16");
  config.chunks = {{0, n}};
  EXPECT_EQ(StateBytes(config), by_layer(0, n) / 16 * 18);
}

// A ConfigureRequest's optimizer: beta1, beta2 and eps left 0 take the stage's defaults
// (kStageOptimizerDefaults: beta2 0.95, not torch's 0.999); the rest pass as they are.
TEST(StageRuntimeTest, OptimizerFieldsLeftZeroTakeTheStagesDefaults) {
  pipetrain::v1::OptimizerConfig o;
  compute::OptimizerSettings got = OptimizerFromProto(o);
  EXPECT_EQ(got.beta1, 0.9f);
  EXPECT_EQ(got.beta2, 0.95f);
  EXPECT_EQ(got.eps, 1e-8f);
  EXPECT_EQ(got.lr, 0.0f);
  EXPECT_EQ(got.weight_decay, 0.0f);
  EXPECT_EQ(got.grad_clip_norm, 0.0f);
  o.set_lr(0.5f);
  o.set_beta1(0.8f);
  o.set_beta2(0.99f);
  o.set_eps(1e-6f);
  o.set_weight_decay(0.1f);
  o.set_grad_clip_norm(2.0f);
  got = OptimizerFromProto(o);
  EXPECT_EQ(got.lr, 0.5f);
  EXPECT_EQ(got.beta1, 0.8f);
  EXPECT_EQ(got.beta2, 0.99f);
  EXPECT_EQ(got.eps, 1e-6f);
  EXPECT_EQ(got.weight_decay, 0.1f);
  EXPECT_EQ(got.grad_clip_norm, 2.0f);
  // What a JobConfig holds before a request sets it is the same.
  EXPECT_EQ(JobConfig().optimizer.beta2, 0.95f);
  EXPECT_EQ(compute::OptimizerSettings().beta2, 0.999f) << "the trainer's, torch's";
}

// Both limits give one message shape: the bytes needed, each part that counts against
// the limit with its field, and the limit by name.
TEST(StageRuntimeTest, AConfigureOverTheLimitNamesEveryPartThatCountsAndTheLimit) {
  JobConfig config = TinyWholeModel(2);
  config.snapshot_reserve_bytes = 1000;
  const MemoryBreakdown need = MemoryOf(config, DeviceSpec::Kind::kCpu, false);
  StageRuntime runtime(Cpu(need.state + need.buffers + need.reserve - 1));
  EXPECT_THAT(
      runtime.Configure(config),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("configure of job 'j1' stage 0: needs "),
                     HasSubstr(absl::StrCat(need.state + need.buffers + need.reserve, " bytes")),
                     HasSubstr(absl::StrCat(need.state, " for weights, gradients")),
                     HasSubstr(absl::StrCat(need.buffers, " for micro-batch buffers")),
                     HasSubstr("1000 for in-memory snapshots (field snapshot_reserve_bytes)"),
                     HasSubstr(absl::StrCat("this stage has ", need.Total() - need.activations - 1,
                                            " (--memory-limit)")),
                     HasSubstr("turn snapshots off"))));
  EXPECT_FALSE(runtime.configured());
}

// A configured CPU job: its chunk's real export passes AdmitImport; a declared size past
// the largest checkpoint the chunk can have (48 GiB, as the hostile-input battery sent)
// is INVALID_ARGUMENT naming total_bytes, job, chunk, that size and the stage's memory.
TEST(StageRuntimeTest, AnImportLargerThanTheChunksLargestCheckpointIsRefusedUpFront) {
  StageRuntime runtime(Cpu(uint64_t{1} << 30));
  const JobConfig config = TinyWholeModel(2);
  ASSERT_THAT(runtime.Configure(config), IsOk());
  absl::StatusOr<std::string> exported = runtime.ExportChunk("j1", 0);
  ASSERT_THAT(exported, IsOk());
  EXPECT_THAT(runtime.AdmitImport("j1", 0, exported->size()), IsOk());
  const uint64_t largest = MaxChunkCheckpointBytes(ParamsOf(config));
  EXPECT_THAT(runtime.AdmitImport("j1", 0, largest), IsOk());
  for (uint64_t total : {largest + 1, uint64_t{48} << 30}) {
    EXPECT_THAT(runtime.AdmitImport("j1", 0, total),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("import of job 'j1' chunk 0"),
                               HasSubstr(absl::StrCat("field total_bytes ", total)),
                               HasSubstr(absl::StrCat(largest, " bytes")),
                               HasSubstr(absl::StrCat("this stage has ", uint64_t{1} << 30,
                                                      " bytes of memory (--memory-limit)")))));
  }
  // What the job or chunk alone refuses comes first, whatever the size.
  EXPECT_THAT(runtime.AdmitImport("other", 0, uint64_t{48} << 30),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("job 'j1'")));
  EXPECT_THAT(runtime.AdmitImport("j1", 1, 10),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field chunk 1")));
  StageRuntime unconfigured(Cpu(0));
  EXPECT_THAT(unconfigured.AdmitImport("j1", 0, 10),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no job")));
}

}  // namespace
}  // namespace pipetrain::stage_server
