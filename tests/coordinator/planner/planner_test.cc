#include "coordinator/planner/planner.h"

#include <algorithm>

#include "common/schedule/validator.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

pipetrain::v1::JobSpec Spec() {
  pipetrain::v1::JobSpec spec;
  auto* m = spec.mutable_model();
  m->set_vocab_size(256);
  m->set_seq_len(64);
  m->set_d_model(128);
  m->set_n_heads(4);
  m->set_n_layers(6);
  auto* p = spec.mutable_pipeline();
  p->set_stages(4);
  p->set_micro_batches(8);
  p->set_schedule("1f1b");
  spec.mutable_training()->set_batch_size(16);
  return spec;
}

TEST(PlannerTest, OptionsComeFromTheSpec) {
  auto o = OptionsFromJobSpec(Spec());
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->stages, 4);
  EXPECT_EQ(o->micro_batches, 8);
  EXPECT_EQ(o->chunks, 1);
  EXPECT_EQ(o->schedule, ScheduleKind::kOneFOneB);
  EXPECT_EQ(o->recompute, pipetrain::v1::RECOMPUTE_NEVER);
  EXPECT_EQ(o->model.n_layers, 6);
}

TEST(PlannerTest, SpecErrorsNameTheField) {
  struct Case {
    std::function<void(pipetrain::v1::JobSpec&)> edit;
    const char* field;
  };
  const Case cases[] = {
      {[](auto& s) { s.clear_model(); }, "model"},
      {[](auto& s) { s.mutable_model()->set_n_heads(5); }, "model.n_heads"},
      {[](auto& s) { s.mutable_model()->set_d_model(0); }, "model.d_model"},
      {[](auto& s) { s.mutable_pipeline()->set_stages(0); }, "pipeline.stages"},
      {[](auto& s) { s.mutable_pipeline()->set_micro_batches(-1); }, "pipeline.micro_batches"},
      {[](auto& s) { s.mutable_pipeline()->set_schedule(""); }, "pipeline.schedule"},
      {[](auto& s) { s.mutable_pipeline()->set_schedule("fifo"); }, "pipeline.schedule"},
      {[](auto& s) { s.mutable_pipeline()->set_recompute("sometimes"); }, "pipeline.recompute"},
      {[](auto& s) { s.mutable_pipeline()->set_chunks(2); }, "pipeline.chunks"},
      {[](auto& s) { s.mutable_training()->set_batch_size(12); }, "training.batch_size"},
      {[](auto& s) { s.mutable_training()->set_batch_size(0); }, "training.batch_size"},
      {[](auto& s) {
         s.mutable_pipeline()->set_schedule("interleaved");
         s.mutable_pipeline()->set_chunks(2);
         s.mutable_pipeline()->set_micro_batches(6);
         s.mutable_training()->set_batch_size(12);
       },
       "pipeline.micro_batches"},
      {[](auto& s) { s.mutable_pipeline()->set_replicas(-2); }, "pipeline.replicas"},
      {[](auto& s) { s.mutable_pipeline()->set_replicas(1025); }, "pipeline.replicas"},
      // 16 sequences do not split into 4 replicas x 8 micro-batches.
      {[](auto& s) { s.mutable_pipeline()->set_replicas(4); },
       "training.batch_size: 16 is not divisible by pipeline.replicas 4 x "
       "pipeline.micro_batches 8 = 32"},
  };
  for (const Case& c : cases) {
    pipetrain::v1::JobSpec spec = Spec();
    c.edit(spec);
    EXPECT_THAT(OptionsFromJobSpec(spec),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.field)))
        << c.field;
  }
}

TEST(PlannerTest, ReplicasComeFromTheSpec) {
  pipetrain::v1::JobSpec spec = Spec();
  EXPECT_EQ(OptionsFromJobSpec(spec)->replicas, 1) << "unset";
  spec.mutable_pipeline()->set_replicas(2);
  auto o = OptionsFromJobSpec(spec);
  ASSERT_THAT(o, IsOk());
  EXPECT_EQ(o->replicas, 2);
  EXPECT_EQ(o->batch_size, 16) << "the global batch";
  EXPECT_EQ(o->replica_batch_size(), 8);
}

// The same plan, per replica, as the one-replica plan of that replica's share.
PlanOptions OneStage(int replicas, int per_replica_batch) {
  PlanOptions o;
  o.model = {.vocab_size = 256, .seq_len = 64, .d_model = 128, .n_heads = 4, .n_layers = 2};
  o.stages = 1;
  o.micro_batches = 2;
  o.replicas = replicas;
  o.batch_size = replicas * per_replica_batch;
  o.link_bytes_per_s = 1e9;
  return o;
}

TEST(PlannerTest, OneReplicaIsTodaysPlan) {
  PlanOptions today = OneStage(1, 4);
  auto plan = MakePlan(today);
  ASSERT_THAT(plan, IsOk());
  EXPECT_TRUE(plan->costs.allreduce_stage_s.empty());
  EXPECT_TRUE(plan->simulation.reductions.empty());
  EXPECT_EQ(plan->stages[0].allreduce_bytes, 0);
  EXPECT_EQ(plan->stages[0].allreduce_s, 0);
  EXPECT_EQ(plan->simulation.step_time_without_reduction_s, plan->simulation.step_time_s);
  // A collective rate changes nothing with nobody to reduce with.
  today.collective_bytes_per_s = 1;
  auto same = MakePlan(today);
  ASSERT_THAT(same, IsOk());
  EXPECT_EQ(same->simulation.step_time_s, plan->simulation.step_time_s);
  EXPECT_EQ(same->simulation.bubble_fraction, plan->simulation.bubble_fraction);
  // pipeline.replicas 1 plans as a spec without it, for every schedule.
  for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
    pipetrain::v1::JobSpec unset = Spec();
    unset.mutable_pipeline()->set_schedule(name);
    pipetrain::v1::JobSpec one = unset;
    one.mutable_pipeline()->set_replicas(1);
    auto a = MakePlan(*OptionsFromJobSpec(unset));
    auto b = MakePlan(*OptionsFromJobSpec(one));
    ASSERT_THAT(a, IsOk());
    ASSERT_THAT(b, IsOk());
    EXPECT_EQ(a->simulation.step_time_s, b->simulation.step_time_s) << name;
    EXPECT_EQ(a->simulation.bubble_fraction, b->simulation.bubble_fraction) << name;
    EXPECT_EQ(schedule::ToText(a->programs), schedule::ToText(b->programs)) << name;
    for (size_t s = 0; s < a->stages.size(); ++s) {
      EXPECT_EQ(a->stages[s].peak_memory_bytes(), b->stages[s].peak_memory_bytes()) << name;
    }
  }
}

// On one stage nothing can hide the reduction: R = 2 at equal per-replica work adds
// exactly 2(R-1)/R x 4 bytes per parameter / bandwidth + the call latency to the step,
// and changes neither the memory (the optimizer whole on each copy) nor the programs;
// copies that split the optimizer hold half the moments: 4 bytes a parameter less.
TEST(PlannerTest, TwoReplicasAddTheRingAllReduceToAOneStagePlansStep) {
  auto one = MakePlan(OneStage(1, 4));
  PlanOptions whole = OneStage(2, 4);
  whole.shard_optimizer = false;
  auto two = MakePlan(whole);
  PlanOptions split_options = OneStage(2, 4);
  ASSERT_TRUE(split_options.splits()) << "the default with replicas";
  auto split = MakePlan(split_options);
  ASSERT_THAT(split, IsOk());
  EXPECT_EQ(split->stages[0].state_bytes, one->stages[0].state_bytes - 4.0 * one->stages[0].params);
  EXPECT_EQ(split->stages[0].allreduce_bytes, two->stages[0].allreduce_bytes)
      << "reduce-scatter and all-gather move the all-reduce's bytes";
  ASSERT_THAT(one, IsOk());
  ASSERT_THAT(two, IsOk());
  const double bytes = 4.0 * static_cast<double>(one->stages[0].params);
  EXPECT_EQ(two->stages[0].allreduce_bytes, bytes);
  const double ring_s = 2.0 * (2 - 1) / 2 * bytes / 1e9 + kAllReduceCallLatencyS;
  EXPECT_NEAR(two->stages[0].allreduce_s, ring_s, 1e-15);
  EXPECT_NEAR(two->simulation.step_time_s, one->simulation.step_time_s + ring_s, 1e-12);
  EXPECT_NEAR(two->simulation.step_time_without_reduction_s, one->simulation.step_time_s, 1e-15);
  ASSERT_EQ(two->simulation.reductions.size(), 1u);
  EXPECT_EQ(two->simulation.reductions[0].hidden_fraction, 0);
  EXPECT_EQ(two->stages[0].peak_memory_bytes(), one->stages[0].peak_memory_bytes());
  EXPECT_EQ(schedule::ToText(two->programs), schedule::ToText(one->programs));
  // A collective bandwidth of its own replaces the links' rate.
  PlanOptions fast = OneStage(2, 4);
  fast.collective_bytes_per_s = 4e9;
  auto f = MakePlan(fast);
  ASSERT_THAT(f, IsOk());
  EXPECT_NEAR(f->stages[0].allreduce_s, bytes / 4e9 + kAllReduceCallLatencyS, 1e-15);
}

// More replicas at equal per-replica work never shorten the step, and each stage's
// reduction grows towards (but never reaches) 2 x bytes / bandwidth.
TEST(PlannerTest, StepAndReductionAreMonotoneInReplicas) {
  for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
    double last_step = 0, last_reduce = 0;
    for (int r : {1, 2, 3, 4, 8, 16, 64}) {
      pipetrain::v1::JobSpec spec = Spec();
      spec.mutable_pipeline()->set_schedule(name);
      spec.mutable_pipeline()->set_replicas(r);
      spec.mutable_training()->set_batch_size(8 * r);
      auto o = OptionsFromJobSpec(spec);
      ASSERT_THAT(o, IsOk()) << name << " R " << r;
      o->link_bytes_per_s = 1e9;
      auto plan = MakePlan(*o);
      ASSERT_THAT(plan, IsOk()) << name << " R " << r;
      EXPECT_GE(plan->simulation.step_time_s, last_step) << name << " R " << r;
      const StagePlan& first = plan->stages[0];
      EXPECT_LT(first.allreduce_s, 2 * first.allreduce_bytes / 1e9 + kAllReduceCallLatencyS);
      if (r > 1) {
        EXPECT_GT(first.allreduce_s, last_reduce) << name << " R " << r;
      }
      last_step = plan->simulation.step_time_s;
      last_reduce = first.allreduce_s;
    }
  }
}

TEST(PlannerTest, PlanCoversEveryLayerOnceAndIsValid) {
  for (const char* name : {"gpipe", "1f1b", "interleaved", "zb-h1"}) {
    pipetrain::v1::JobSpec spec = Spec();
    spec.mutable_pipeline()->set_schedule(name);
    if (std::string(name) == "interleaved") spec.mutable_pipeline()->set_chunks(2);
    auto o = OptionsFromJobSpec(spec);
    ASSERT_THAT(o, IsOk());
    auto plan = MakePlan(*o);
    ASSERT_THAT(plan, IsOk()) << name;
    EXPECT_THAT(schedule::Validate(plan->programs), IsOk());
    std::vector<int> owner(o->model.num_pipeline_layers(), 0);
    for (const StagePlan& sp : plan->stages) {
      for (auto [b, e] : sp.chunks) {
        for (int l = b; l < e; ++l) ++owner[l];
      }
      EXPECT_GT(sp.params, 0);
      EXPECT_GT(sp.peak_activation_bytes, 0);
    }
    EXPECT_THAT(owner, ::testing::Each(1)) << name;
    EXPECT_GT(plan->simulation.step_time_s, 0);
  }
}

TEST(PlannerTest, EqualStageCostReproducesTheFormula) {
  auto o = OptionsFromJobSpec(Spec());
  o->equal_stage_cost = true;
  auto plan = MakePlan(*o);
  ASSERT_THAT(plan, IsOk());
  EXPECT_NEAR(plan->simulation.bubble_fraction, 3.0 / 11, 1e-12);
  EXPECT_NEAR(plan->textbook_bubble, 3.0 / 11, 1e-12);
  EXPECT_DOUBLE_EQ(plan->simulation.step_time_s, 33);
}

TEST(PlannerTest, RecomputationChangesMemoryNotOrder) {
  auto never = OptionsFromJobSpec(Spec());
  auto always = *never, except_last = *never;
  always.recompute = pipetrain::v1::RECOMPUTE_ALWAYS;
  except_last.recompute = pipetrain::v1::RECOMPUTE_EXCEPT_LAST;
  auto a = MakePlan(*never), b = MakePlan(always), c = MakePlan(except_last);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(a->programs, b->programs);
  EXPECT_EQ(a->programs, c->programs);
  // Stages holding several micro-batches keep only their inputs; the last stage holds
  // one at a time under 1F1B, and rebuilding it during the backward costs the same,
  // plus the targets (4 bytes a token) it keeps for the rerun.
  for (int s = 0; s < 3; ++s) {
    EXPECT_LT(b->stages[s].peak_activation_bytes, a->stages[s].peak_activation_bytes) << s;
    EXPECT_DOUBLE_EQ(c->stages[s].peak_activation_bytes, b->stages[s].peak_activation_bytes);
  }
  const double tokens = static_cast<double>(never->batch_size) / never->micro_batches * never->model.seq_len;
  EXPECT_DOUBLE_EQ(b->stages[3].peak_activation_bytes,
                   a->stages[3].peak_activation_bytes + 4 * tokens);
  EXPECT_DOUBLE_EQ(c->stages[3].peak_activation_bytes, a->stages[3].peak_activation_bytes);
  EXPECT_GT(b->simulation.step_time_s, a->simulation.step_time_s);  // the forward reruns
}

// training.precision bf16 halves what a stage sends (the activation and its gradient
// travel in bf16); compute stays fp32's; the activations kept only for the backward's
// products are kept in 2 bytes (the model's ChunkActivationBytes in bf16), and the state
// grows by the weights' 2-byte bf16 copy (18 bytes a parameter instead of 16). An
// unknown precision is refused naming the field.
TEST(PlannerTest, Bf16HalvesTheSendTimesAndAddsTheWeightsCopy) {
  auto fp32 = OptionsFromJobSpec(Spec());
  ASSERT_THAT(fp32.status(), IsOk());
  PlanOptions bf16 = *fp32;
  bf16.precision = "bf16";
  auto a = MakePlan(*fp32), b = MakePlan(bf16);
  ASSERT_TRUE(a.ok() && b.ok());
  for (int s = 0; s < 4; ++s) {
    const ChunkCost &x = a->costs.chunks[s][0], &y = b->costs.chunks[s][0];
    EXPECT_DOUBLE_EQ(y.send_activation_s * 2, x.send_activation_s) << s;
    EXPECT_DOUBLE_EQ(y.send_gradient_s * 2, x.send_gradient_s) << s;
    EXPECT_DOUBLE_EQ(y.forward_s, x.forward_s) << s;
    EXPECT_LT(b->stages[s].peak_activation_bytes, a->stages[s].peak_activation_bytes);
    const auto [begin, end] = b->stages[s].chunks[0];
    const bool recompute = b->stages[s].chunk_recompute[0];
    EXPECT_DOUBLE_EQ(
        y.stored_bytes / x.stored_bytes,
        model::ChunkActivationBytes(fp32->model, begin, end, recompute, common::DType::kBF16)
                .stored /
            model::ChunkActivationBytes(fp32->model, begin, end, recompute).stored);
    EXPECT_DOUBLE_EQ(b->stages[s].state_bytes * 16, a->stages[s].state_bytes * 18);
  }
  EXPECT_GT(a->costs.chunks[0][0].send_activation_s, 0);
  EXPECT_LE(b->simulation.step_time_s, a->simulation.step_time_s);
  PlanOptions fp16 = *fp32;
  fp16.precision = "fp16";
  EXPECT_THAT(MakePlan(fp16).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("training.precision"), HasSubstr("fp16"))));
}

// The plan holds recompute_policy.h's answer per chunk, and its own figures follow it:
// with interleaved chunks and except-last, neither chunk of the last stage recomputes.
TEST(PlannerTest, RecomputationIsResolvedPerChunkAndPricedPerChunk) {
  auto o = OptionsFromJobSpec(Spec());
  ASSERT_THAT(o, IsOk());
  o->stages = 2;
  o->chunks = 2;
  o->schedule = ScheduleKind::kInterleaved;
  o->recompute = pipetrain::v1::RECOMPUTE_EXCEPT_LAST;
  auto plan = MakePlan(*o);
  ASSERT_THAT(plan, IsOk());
  const std::vector<std::vector<bool>> expected = ResolveRecompute(o->recompute, 2, 2);
  for (int s = 0; s < 2; ++s) {
    const StagePlan& sp = plan->stages[s];
    EXPECT_EQ(sp.chunk_recompute, expected[s]) << s;
    EXPECT_EQ(sp.recomputes_any(), s == 0);
    for (int c = 0; c < 2; ++c) {
      const ChunkCost& cc = plan->costs.chunks[s][c];
      EXPECT_EQ(cc.recompute_s > 0, sp.chunk_recompute[c]) << s << " " << c;
      const auto [b, e] = sp.chunks[c];
      const model::ChunkMemory memory =
          model::ChunkActivationBytes(o->model, b, e, sp.chunk_recompute[c]);
      EXPECT_DOUBLE_EQ(cc.stored_bytes,
                       memory.stored * (o->batch_size / o->micro_batches) * o->model.seq_len);
    }
  }
  EXPECT_EQ(plan->stages[0].chunk_recompute, (std::vector<bool>{true, true}));
  EXPECT_EQ(plan->stages[1].chunk_recompute, (std::vector<bool>{false, false}));
}

// A Llama stage's peak holds one pair of rotary tables per chunk that holds a block
// (model::ChunkTableBytes, 2 x T x hs/2 fp32), as the stage counts and reports them; a
// stage of only the embedding or only the head holds none, and a GPT-2 stage none.
TEST(PlannerTest, EachChunkWithALlamaBlockAddsOnePairOfRotaryTables) {
  pipetrain::v1::JobSpec spec = Spec();  // T 64, C 128, 4 heads of 32: tables of 64 x 16
  spec.mutable_model()->set_architecture("llama");
  spec.mutable_model()->set_n_kv_heads(2);
  auto o = OptionsFromJobSpec(spec);
  ASSERT_THAT(o, IsOk());
  const double pair = 2 * 64 * 16 * 4;
  o->stages = 8;  // embedding, 6 blocks, head: one layer each
  o->partition = PartitionMode::kCount;
  auto plan = MakePlan(*o);
  ASSERT_THAT(plan, IsOk());
  for (const StagePlan& sp : plan->stages) {
    EXPECT_EQ(sp.table_bytes, sp.stage == 0 || sp.stage == 7 ? 0 : pair) << sp.stage;
    EXPECT_EQ(sp.peak_memory_bytes(),
              sp.state_bytes + sp.table_bytes + sp.snapshot_bytes + sp.peak_activation_bytes);
  }
  // Interleaved: each of a stage's two chunks that holds a block has its own pair.
  o->stages = 2;
  o->chunks = 2;
  o->schedule = ScheduleKind::kInterleaved;
  plan = MakePlan(*o);
  ASSERT_THAT(plan, IsOk());
  for (const StagePlan& sp : plan->stages) {
    double want = 0;
    for (const auto& [b, e] : sp.chunks) want += model::ChunkTableBytes(o->model, b, e);
    EXPECT_EQ(sp.table_bytes, want) << sp.stage;
    EXPECT_EQ(sp.table_bytes, 2 * pair) << "both chunks of 2 layers hold a block";
  }
  // Over a cap, the message names them.
  o->memory_cap_bytes = plan->stages[0].peak_memory_bytes() - 1;
  EXPECT_THAT(MakePlan(*o), StatusIs(absl::StatusCode::kResourceExhausted,
                                     HasSubstr("GiB shared tables")));
  // GPT-2's learned positions are parameters: no tables.
  auto gpt2 = MakePlan(*OptionsFromJobSpec(Spec()));
  ASSERT_THAT(gpt2, IsOk());
  for (const StagePlan& sp : gpt2->stages) EXPECT_EQ(sp.table_bytes, 0) << sp.stage;
}

// Partitioning under a cap counts a part's tables once with its layers' memory.
TEST(PlannerTest, PartMemoryCountsWhatAPartHoldsOnce) {
  MemoryLimit limit;
  limit.weight_bytes = {10, 20, 30};
  limit.activation_bytes = {1, 2, 3};
  limit.in_flight = {2, 1};
  EXPECT_EQ(PartMemory(limit, 0, 0, 2), 30 + 3 * 2);
  limit.chunk_bytes = [](int begin, int end) { return begin < 2 && end > 1 ? 100.0 : 0.0; };
  EXPECT_EQ(PartMemory(limit, 0, 0, 2), 30 + 100 + 3 * 2);
  EXPECT_EQ(PartMemory(limit, 1, 2, 3), 30 + 3);
}

TEST(PlannerTest, TooManyStagesOrTooLittleMemoryAreClearErrors) {
  auto o = OptionsFromJobSpec(Spec());
  o->stages = 9;  // 6 blocks + embedding + head = 8 layers
  EXPECT_THAT(MakePlan(*o),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("pipeline.stages (9)"), HasSubstr("8 pipeline layers"))));
  o->stages = 4;
  o->memory_cap_bytes = 1024 * 1024;  // 1 MiB per stage
  EXPECT_THAT(MakePlan(*o), StatusIs(absl::StatusCode::kResourceExhausted,
                                     AllOf(HasSubstr("does not fit"), HasSubstr("needs"),
                                           HasSubstr("available"))));
  o->schedule = ScheduleKind::kInterleaved;  // checked on the simulated figures
  o->chunks = 2;
  EXPECT_THAT(MakePlan(*o), StatusIs(absl::StatusCode::kResourceExhausted,
                                     AllOf(HasSubstr("stage 0 needs"), HasSubstr("but has"))));
}

// In-memory snapshots: checkpoint.snapshot_every_steps > 0 turns them on; each stage
// counts 2 steps x 12 bytes per parameter of its own and its ring predecessor's layers
// (its own only with one stage), in its peak memory and against the cap.
TEST(PlannerTest, SnapshotsComeFromTheSpec) {
  pipetrain::v1::JobSpec spec = Spec();
  EXPECT_FALSE(OptionsFromJobSpec(spec)->snapshots) << "unset: as the defaults left it, 0";
  spec.mutable_checkpoint()->set_snapshot_every_steps(0);
  EXPECT_FALSE(OptionsFromJobSpec(spec)->snapshots);
  spec.mutable_checkpoint()->set_snapshot_every_steps(5);
  EXPECT_TRUE(OptionsFromJobSpec(spec)->snapshots);
}

TEST(PlannerTest, SnapshotBytesCountTheStageAndItsRingPredecessor) {
  for (int k : {1, 3, 4}) {
    pipetrain::v1::JobSpec spec = Spec();
    spec.mutable_pipeline()->set_stages(k);
    spec.mutable_checkpoint()->set_snapshot_every_steps(1);
    auto o = OptionsFromJobSpec(spec);
    ASSERT_THAT(o, IsOk());
    auto with = MakePlan(*o);
    ASSERT_THAT(with, IsOk());
    o->snapshots = false;
    auto without = MakePlan(*o);
    ASSERT_THAT(without, IsOk());
    for (int s = 0; s < k; ++s) {
      const StagePlan& sp = with->stages[s];
      const int64_t held = k > 1 ? with->stages[(s + k - 1) % k].params : 0;
      EXPECT_EQ(sp.snapshot_bytes, 24.0 * static_cast<double>(sp.params + held)) << "K " << k << " stage " << s;
      EXPECT_EQ(sp.peak_memory_bytes(),
                sp.state_bytes + sp.snapshot_bytes + sp.peak_activation_bytes);
      EXPECT_EQ(without->stages[s].snapshot_bytes, 0);
      EXPECT_EQ(without->stages[s].chunks, sp.chunks) << "without a cap the split is the same";
    }
  }
}

TEST(PlannerTest, SnapshotsCountAgainstTheMemoryCap) {
  pipetrain::v1::JobSpec spec = Spec();
  spec.mutable_pipeline()->set_stages(1);  // one split only: the cap cannot move layers
  auto o = OptionsFromJobSpec(spec);
  ASSERT_THAT(o, IsOk());
  auto plain = MakePlan(*o);
  ASSERT_THAT(plain, IsOk());
  double most = 0;
  for (const StagePlan& sp : plain->stages) most = std::max(most, sp.peak_memory_bytes());
  // Fits without snapshots, not with their 24 bytes per parameter on top.
  o->memory_cap_bytes = most * 1.001;
  EXPECT_THAT(MakePlan(*o), IsOk());
  o->snapshots = true;
  EXPECT_THAT(MakePlan(*o),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("snapshots"), HasSubstr("snapshot_every_steps 0"))));
}

}  // namespace
}  // namespace pipetrain::planner
