// The executor runs planner programs on K in-process stages joined by local channels,
// and training through it is the same as training the whole model on one stage:
// every step's loss and the final weights match the single-layers reference, for every
// schedule, recompute mode and K in {1, 2, 4}. A forward-only (evaluation) step between
// two training steps gives the reference model's losses on its batch and leaves every
// weight, gradient and AdamW moment bit for bit as it was. With global-norm clipping
// (every step clips) K > 1 runs each step in two phases, the optimizer deferred until
// the summed norm comes, and still matches the clipped reference; a deferred step
// applied later is bit for bit one run with the same norm, and out-of-turn calls are
// refused. Also: bad programs are refused, an emulated stage takes the cost model's time
// and reports real sizes, and a stage reports the peak memory the planner predicts.
#include "stage_server/exec/executor.h"

#include <cmath>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "coordinator/planner/forward_only.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage_server/exec/backend_chunk.h"
#include "stage_server/compute/cpu_backend.h"
#include "stage_server/compute/trainer.h"
#include "stage_server/exec/emulated_chunk.h"
#include "stage_server/link/local_channel.h"
#include "stage_server/runtime/memory_breakdown.h"
#include "stage_server/runtime/stage_runtime.h"
#include "tests/testing/in_process_copies.h"
#include "tests/testing/loss_comparison.h"
#include "tests/testing/reference_training.h"
#include "tests/testing/tolerance.h"

namespace pipetrain::stage_server {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using common::DType;
using common::Tensor;

using ::pipetrain::testing::kBatch;
using ::pipetrain::testing::kMicroBatches;
using ::pipetrain::testing::kSeed;
using ::pipetrain::testing::RandomBatch;
using ::pipetrain::testing::Reference;
using ::pipetrain::testing::Rows;
constexpr int kSteps = 3;
model::TransformerConfig Tiny() { return ::pipetrain::testing::TinyModel(); }
compute::OptimizerSettings Adam() { return ::pipetrain::testing::TestAdam(); }
const Reference& SharedReference(float clip, bool tied, common::DType products,
                                 bool llama = false) {
  return ::pipetrain::testing::SharedReference(kSteps, clip, tied, products, llama);
}
// Small enough that every step of the tiny model clips (the tests check that it does).
constexpr float kClip = 0.05f;

struct Case {
  planner::ScheduleKind schedule;
  int stages;
  int chunks;
  pipetrain::v1::RecomputeMode recompute;
  float clip = 0;  // global-norm clipping; with K > 1 each step runs in two phases
  bool tied = false;  // model.tie_embeddings: first and last stage swap gradients
  bool bf16 = false;  // training.precision bf16: every stage's and the reference's products
  bool llama = false;  // the Llama family (grouped-query attention) instead of GPT-2
  common::DType products() const { return bf16 ? common::DType::kBF16 : common::DType::kF32; }
};

std::string Name(const Case& c) {
  return absl::StrCat(planner::ScheduleName(c.schedule), " K=", c.stages, " v=", c.chunks,
                      " recompute=", planner::RecomputeName(c.recompute),
                      c.clip > 0 ? absl::StrCat(" clip=", c.clip) : "", c.tied ? " tied" : "",
                      c.bf16 ? " bf16" : "", c.llama ? " llama" : "");
}

// Every parameter, gradient and AdamW moment of a stage's chunks, and their step
// counts: what an evaluation must leave exactly as it found.
using Snapshot = std::vector<std::vector<float>>;
Snapshot TakeSnapshot(const std::vector<BackendChunk*>& backend_chunks) {
  Snapshot out;
  for (BackendChunk* backend_chunk : backend_chunks) {
    compute::ModelChunk& layers = backend_chunk->layers();
    out.push_back({static_cast<float>(layers.step())});
    for (const model::ParamSpec& p : layers.Params()) {
      out.push_back(*layers.GetParam(p.name));
      out.push_back(*layers.GetGrad(p.name));
      out.push_back(*layers.GetOptimizerMoment(p.name, false));
      out.push_back(*layers.GetOptimizerMoment(p.name, true));
    }
  }
  return out;
}

// The evaluation runs between training steps kEvalAfter and kEvalAfter + 1, on a batch
// no training step uses, under a step number of its own (frames are tagged with it).
constexpr int kEvalAfter = 0;
constexpr uint64_t kEvalStep = 1000;
model::TokenBatch EvalBatch() { return RandomBatch(77); }

// Runs the job on K executors in threads, with an evaluation after step kEvalAfter,
// and checks every step's loss and the final weights against the reference.
void RunPipeline(const Case& c) {
  SCOPED_TRACE(Name(c));
  planner::PlanOptions po;
  const model::TransformerConfig config = ::pipetrain::testing::TinyModel(c.tied, c.llama);
  po.model = config;
  po.stages = c.stages;
  po.micro_batches = kMicroBatches;
  po.chunks = c.chunks;
  po.schedule = c.schedule;
  po.recompute = c.recompute;
  po.batch_size = kBatch;
  po.precision = c.bf16 ? "bf16" : "fp32";  // bf16 keeps some activations in 2 bytes
  auto plan = planner::MakePlan(po);
  ASSERT_THAT(plan.status(), IsOk());

  // One backend per stage, as in separate processes (a backend is not thread-safe).
  std::vector<std::unique_ptr<compute::CpuBackend>> backends;
  auto pool = std::make_shared<common::BufferPool>();
  const int K = c.stages, rows = kBatch / kMicroBatches;
  // Channel s joins stage s (upstream end) to stage (s + 1) mod K.
  std::vector<std::unique_ptr<TensorChannel>> up(K), down(K);
  // A ring when chunks wrap around, or when the tied embedding's gradient goes K-1 <-> 0.
  const int links = c.chunks > 1 || c.tied ? K : K - 1;
  for (int s = 0; s < links; ++s) std::tie(up[s], down[(s + 1) % K]) = MakeLocalChannelPair();

  std::vector<std::unique_ptr<Executor>> executors;
  std::vector<std::vector<BackendChunk*>> backend_chunks(K);
  const DType precision = c.products();
  for (int s = 0; s < K; ++s) {
    const planner::StagePlan& sp = plan->stages[s];
    backends.push_back(*compute::CpuBackend::Create(1));
    compute::CpuBackend* backend = backends.back().get();
    ASSERT_THAT(backend->SetProductOperands(c.products()), IsOk());
    std::vector<std::unique_ptr<ChunkCompute>> chunks;
    for (size_t c = 0; c < sp.chunks.size(); ++c) {
      const auto& [begin, end] = sp.chunks[c];
      compute::ChunkOptions so;
      so.recompute = sp.chunk_recompute[c];
      so.boundary = precision;  // training.precision bf16 holds activations in bf16 too
      auto layers = compute::ModelChunk::Create(config, begin, end, backend, so);
      ASSERT_THAT(layers.status(), IsOk());
      ASSERT_THAT((*layers)->Initialize(kSeed), IsOk());
      auto backend_chunk = BackendChunk::Create(std::move(*layers), rows, pool);
      ASSERT_THAT(backend_chunk.status(), IsOk());
      backend_chunks[s].push_back(backend_chunk->get());
      chunks.push_back(std::move(*backend_chunk));
    }
    ExecutorConfig ec;
    ec.job_id = "job";
    ec.stage = s;
    ec.num_stages = K;
    ec.num_chunks = c.chunks;
    ec.recv_timeout = absl::Seconds(20);
    ec.optimizer = Adam();
    ec.optimizer.grad_clip_norm = c.clip;
    ec.tie_embeddings = c.tied;
    ec.placement = plan->topology().placement;
    executors.push_back(std::make_unique<Executor>(ec, std::move(chunks), up[s].get(),
                                                   down[s].get(), pool));
  }

  // One step of `programs` on every stage at once. With clipping on several stages the
  // optimizer waits (defer_optimizer) for the coordinator's part, done after the join.
  const bool two_phase = c.clip > 0 && K > 1;
  auto run_all = [&](const schedule::Schedule& programs, uint64_t step,
                     const model::TokenBatch& batch) {
    std::vector<absl::StatusOr<StepResult>> results(K, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int s = 0; s < K; ++s) {
      threads.emplace_back([&, s] {
        StepInputs in;
        in.step = step;
        for (int mb = 0; mb < kMicroBatches; ++mb) {
          if (s == 0) in.tokens.push_back(Rows(batch.inputs, mb, rows));
          if (s == plan->topology().HeadStage()) {
            in.targets.push_back(Rows(batch.targets, mb, rows));
          }
        }
        in.defer_optimizer = two_phase && !programs[s].forward_only;
        results[s] = executors[s]->RunStep(programs[s], std::move(in));
      });
    }
    for (auto& t : threads) t.join();
    return results;
  };

  auto eval_programs =
      planner::ForwardOnlySchedule(K, kMicroBatches, c.chunks, plan->topology().placement);
  ASSERT_THAT(eval_programs.status(), IsOk());
  const Reference& ref = SharedReference(c.clip, c.tied, c.products(), c.llama);
  // Every layer does the reference's arithmetic in its order, so losses and weights are
  // the reference's bits (kSameArithmetic). Only the clipping norm is summed in another
  // grouping (in double, by stage); its float clip factor moves only if the two norms
  // straddle a float rounding boundary: their relative difference (measured about 2e-16)
  // over a float's spacing (1.2e-7), about once in 10^9 steps.
  int64_t params = 0;
  for (const model::ParamSpec& p : ref.model->Params()) params += p.num_elements();
  std::vector<double> step_losses;  // compared with the reference's after the loop
  for (int step = 0; step < kSteps; ++step) {
    auto results = run_all(plan->programs, step, RandomBatch(step));
    for (int s = 0; s < K; ++s) ASSERT_THAT(results[s].status(), IsOk()) << "stage " << s;
    double sum_sq = 0;
    for (int s = 0; s < K; ++s) sum_sq += results[s]->grad_norm_sq;
    if (c.clip > 0) {
      // The stages' shares add up to the whole model's norm, and it is over the limit:
      // the same squares (exact in double), summed in double grouped by stage.
      EXPECT_NEAR(std::sqrt(sum_sq), ref.grad_norms[step],
                  ::pipetrain::testing::ReorderedSumTolerance(params + K, 1,
                                                              ::pipetrain::testing::kDoubleEps) *
                      ref.grad_norms[step])
          << "step " << step;
      EXPECT_GT(std::sqrt(sum_sq), c.clip) << "step " << step << " should clip";
    }
    if (two_phase) {
      // The coordinator's part: the global norm to every stage, which then steps.
      for (int s = 0; s < K; ++s) {
        ASSERT_EQ(executors[s]->pending_optimizer_step(), std::optional<uint64_t>(step));
        auto timing = executors[s]->ApplyOptimizer(step, std::sqrt(sum_sq), std::nullopt);
        ASSERT_THAT(timing.status(), IsOk()) << "stage " << s;
        EXPECT_EQ(timing->action.kind, schedule::ActionKind::kOptimizerStep);
        EXPECT_GE(timing->start_us, results[s]->timings.back().end_us);
      }
    }
    const std::vector<float>& losses = results[plan->topology().HeadStage()]->losses;
    ASSERT_EQ(losses.size(), static_cast<size_t>(kMicroBatches));
    double loss = 0;
    for (float l : losses) loss += l;
    loss /= kMicroBatches;
    step_losses.push_back(loss);
    for (int s = 0; s < K; ++s) {
      // Only a recomputing chunk's B and I re-run a forward, inside their own time.
      for (const ActionTiming& t : results[s]->timings) {
        if (!plan->stages[s].chunk_recompute[t.action.chunk] ||
            !schedule::ProducesInputGradient(t.action.kind)) {
          EXPECT_EQ(t.recompute_us, 0) << "stage " << s << " " << schedule::ToString(t.action);
        }
        EXPECT_LE(t.recompute_us, t.end_us - t.start_us) << "stage " << s;
      }
      // The layers hold exactly what the planner predicted for this stage.
      EXPECT_EQ(static_cast<double>(results[s]->peak_activation_bytes),
                plan->stages[s].peak_activation_bytes)
          << "stage " << s;
    }
    if (step != kEvalAfter) continue;

    SCOPED_TRACE("evaluation");
    std::vector<Snapshot> before;
    for (int s = 0; s < K; ++s) before.push_back(TakeSnapshot(backend_chunks[s]));
    const auto eval = run_all(*eval_programs, kEvalStep, EvalBatch());
    for (int s = 0; s < K; ++s) ASSERT_THAT(eval[s].status(), IsOk()) << "stage " << s;
    const std::vector<double> want =
        ::pipetrain::testing::ReferenceEvalLosses(kEvalAfter + 1, EvalBatch(), c.clip, c.tied,
                                                  c.products(), c.llama);
    const int head = plan->topology().HeadStage();
    ASSERT_EQ(eval[head]->losses.size(), want.size());
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      EXPECT_EQ(eval[head]->losses[mb], want[mb]) << "micro-batch " << mb;
    }
    for (int s = 0; s < K; ++s) {
      EXPECT_TRUE(TakeSnapshot(backend_chunks[s]) == before[s])
          << "stage " << s << ": the evaluation changed a weight, gradient or moment";
      EXPECT_EQ(eval[s]->grad_norm_sq, 0.0) << "stage " << s;
      if (s != head) {
        EXPECT_TRUE(eval[s]->losses.empty()) << "stage " << s;
      }
      // One layer's stash at a time: never more than a training step holds.
      EXPECT_GT(eval[s]->peak_activation_bytes, 0u) << "stage " << s;
      EXPECT_LE(static_cast<double>(eval[s]->peak_activation_bytes),
                plan->stages[s].peak_activation_bytes)
          << "stage " << s;
      for (BackendChunk* chunk : backend_chunks[s]) EXPECT_EQ(chunk->layers().in_flight(), 0);
    }
  }
  EXPECT_TRUE(::pipetrain::testing::LossesMatch(
      step_losses, std::vector<double>(ref.losses.begin(), ref.losses.begin() + kSteps),
      ::pipetrain::testing::kSameArithmetic));
  // Final weights, tensor by tensor.
  for (int s = 0; s < K; ++s) {
    for (BackendChunk* backend_chunk : backend_chunks[s]) {
      for (const model::ParamSpec& p : backend_chunk->layers().Params()) {
        auto got = backend_chunk->layers().GetParam(p.name);
        auto want = ref.model->GetParam(p.name);
        ASSERT_THAT(got.status(), IsOk());
        ASSERT_THAT(want.status(), IsOk());
        EXPECT_LE(::pipetrain::testing::RelativeL2Error(*got, *want),
                  ::pipetrain::testing::kSameArithmetic)
            << p.name << " stage " << s << " layers [" << backend_chunk->layers().begin() << ", "
            << backend_chunk->layers().end() << ")";
      }
    }
  }
}

class TransparencyTest : public ::testing::TestWithParam<Case> {};

TEST_P(TransparencyTest, MatchesTheSingleStageReference) { RunPipeline(GetParam()); }

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  const pipetrain::v1::RecomputeMode modes[] = {pipetrain::v1::RECOMPUTE_NEVER,
                                                pipetrain::v1::RECOMPUTE_ALWAYS,
                                                pipetrain::v1::RECOMPUTE_EXCEPT_LAST};
  for (auto mode : modes) {
    for (int K : {1, 2, 4}) {
      cases.push_back({planner::ScheduleKind::kGpipe, K, 1, mode});
      cases.push_back({planner::ScheduleKind::kOneFOneB, K, 1, mode});
      cases.push_back({planner::ScheduleKind::kZbH1, K, 1, mode});
      if (K > 1) cases.push_back({planner::ScheduleKind::kInterleaved, K, 2, mode});
    }
  }
  // Global-norm clipping: one stage clips by its own norm; more stages defer the
  // optimizer and apply it with the sum of their shares.
  for (int K : {1, 2, 4}) {
    cases.push_back({planner::ScheduleKind::kGpipe, K, 1, pipetrain::v1::RECOMPUTE_NEVER, kClip});
    cases.push_back({planner::ScheduleKind::kOneFOneB, K, 1, pipetrain::v1::RECOMPUTE_NEVER, kClip});
  }
  cases.push_back(
      {planner::ScheduleKind::kInterleaved, 2, 2, pipetrain::v1::RECOMPUTE_NEVER, kClip});
  // Tied embeddings: the first and last stage sum their gradients of the shared matrix
  // (locally when one stage holds both), every schedule, with and without clipping.
  const auto never = pipetrain::v1::RECOMPUTE_NEVER;
  for (int K : {1, 2, 4}) {
    cases.push_back({planner::ScheduleKind::kOneFOneB, K, 1, never, 0, true});
    cases.push_back({planner::ScheduleKind::kZbH1, K, 1, never, 0, true});
    cases.push_back({planner::ScheduleKind::kGpipe, K, 1, pipetrain::v1::RECOMPUTE_ALWAYS, kClip, true});
  }
  cases.push_back({planner::ScheduleKind::kInterleaved, 1, 2, never, 0, true});
  cases.push_back({planner::ScheduleKind::kInterleaved, 2, 2, never, kClip, true});
  cases.push_back({planner::ScheduleKind::kInterleaved, 4, 2, never, 0, true});
  // bf16 products (training.precision bf16): every schedule at K = 4, recompute on and
  // off, tied embeddings and clipping, against the one-stage reference in bf16.
  for (auto mode : {never, pipetrain::v1::RECOMPUTE_ALWAYS}) {
    for (auto kind : {planner::ScheduleKind::kGpipe, planner::ScheduleKind::kOneFOneB,
                      planner::ScheduleKind::kZbH1}) {
      cases.push_back({kind, 4, 1, mode, 0, false, true});
    }
    cases.push_back({planner::ScheduleKind::kInterleaved, 4, 2, mode, 0, false, true});
  }
  cases.push_back({planner::ScheduleKind::kOneFOneB, 4, 1, never, kClip, true, true});
  cases.push_back({planner::ScheduleKind::kInterleaved, 4, 2, never, kClip, true, true});
  // Llama (grouped-query attention, rotary positions, SwiGLU): every schedule at K = 4,
  // recompute on and off, untied and tied, clipping, and bf16.
  const auto always = pipetrain::v1::RECOMPUTE_ALWAYS;
  for (auto kind : {planner::ScheduleKind::kGpipe, planner::ScheduleKind::kOneFOneB,
                    planner::ScheduleKind::kZbH1}) {
    cases.push_back({kind, 4, 1, never, 0, false, false, true});
    cases.push_back({kind, 4, 1, always, kClip, true, false, true});
  }
  cases.push_back({planner::ScheduleKind::kInterleaved, 4, 2, never, 0, true, false, true});
  cases.push_back({planner::ScheduleKind::kOneFOneB, 2, 1, never, 0, false, false, true});
  cases.push_back({planner::ScheduleKind::kOneFOneB, 4, 1, never, kClip, true, true, true});
  cases.push_back({planner::ScheduleKind::kZbH1, 4, 1, always, 0, false, true, true});
  // The V placement (stage 0 holds the first and the last chunk, stage K-1 hands its
  // chunk 0's output to its chunk 1 in memory): K = 1 and 2 (M = 4 >= 2K-1), every
  // recompute mode, tied (both ends on stage 0), clipping, bf16 and Llama.
  for (auto kind : {planner::ScheduleKind::kZbV, planner::ScheduleKind::kDualPipeV}) {
    for (auto mode : modes) {
      for (int K : {1, 2}) cases.push_back({kind, K, 2, mode});
    }
    cases.push_back({kind, 2, 2, never, kClip, true});
    cases.push_back({kind, 2, 2, never, 0, true, true});
    cases.push_back({kind, 2, 2, always, kClip, true, false, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Grid, TransparencyTest, ::testing::ValuesIn(AllCases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string n = Name(info.param);
                           for (char& ch : n) if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace pipetrain::stage_server

namespace pipetrain::stage_server {
namespace {

// A one-stage executor over real layers, for the error cases.
struct Single {
  std::unique_ptr<compute::CpuBackend> backend = *compute::CpuBackend::Create(1);
  std::unique_ptr<Executor> executor;
  schedule::StageProgram program;
};

// `bf16`: training.precision bf16 (products and activations).
Single MakeSingle(int stages = 1, int stage = 0,
                  compute::OptimizerSettings optimizer = compute::kStageOptimizerDefaults,
                  bool recompute = false, GradientAverage average = {}, bool bf16 = false) {
  Single s;
  auto pool = std::make_shared<common::BufferPool>();
  const DType precision = bf16 ? DType::kBF16 : DType::kF32;
  EXPECT_THAT(s.backend->SetProductOperands(precision), IsOk());
  auto layers = *compute::ModelChunk::Create(Tiny(), 0, Tiny().num_pipeline_layers(),
                                             s.backend.get(),
                                             {.recompute = recompute, .boundary = precision});
  EXPECT_THAT(layers->Initialize(kSeed), IsOk());
  std::vector<std::unique_ptr<ChunkCompute>> chunks;
  chunks.push_back(*BackendChunk::Create(std::move(layers), 2, pool));
  ExecutorConfig ec;
  ec.job_id = "job-x";
  ec.stage = stage;
  ec.num_stages = stages;
  ec.recv_timeout = absl::Milliseconds(100);
  ec.optimizer = optimizer;
  ec.average_gradients = std::move(average);
  s.executor = std::make_unique<Executor>(ec, std::move(chunks), nullptr, nullptr, pool);
  s.program.stage = stage;
  s.program.num_stages = stages;
  s.program.num_micro_batches = 2;
  s.program.actions = *schedule::ParseActions("F0 F1 B0 B1 OPT");
  return s;
}

StepInputs Inputs(int M, bool tokens, bool targets) {
  StepInputs in;
  const model::TokenBatch b = RandomBatch(0);
  for (int mb = 0; mb < M; ++mb) {
    if (tokens) in.tokens.push_back(Rows(b.inputs, mb, 2));
    if (targets) in.targets.push_back(Rows(b.targets, mb, 2));
  }
  return in;
}

TEST(ExecutorTest, RunsAValidProgram) {
  Single s = MakeSingle();
  auto r = s.executor->RunStep(s.program, Inputs(2, true, true));
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_EQ(r->losses.size(), 2u);
  EXPECT_GT(r->losses[0], 0.0f);
  ASSERT_EQ(r->timings.size(), 5u);
  for (const ActionTiming& t : r->timings) EXPECT_LE(t.start_us, t.end_us);
  EXPECT_GT(r->grad_norm_sq, 0.0);
}

std::vector<std::vector<float>> Weights(Executor& ex) {
  std::vector<std::vector<float>> out;
  compute::ModelChunk& layers = static_cast<BackendChunk&>(ex.chunk(0)).layers();
  for (const model::ParamSpec& p : layers.Params()) out.push_back(*layers.GetParam(p.name));
  return out;
}

compute::ModelChunk& LayersOf(Executor& ex) {
  return static_cast<BackendChunk&>(ex.chunk(0)).layers();
}

// After optimizer step `step` of replicas (`mine`) and the whole batch (`theirs`), which
// started from the same weights: their gradients and weights differ only as the
// arithmetic lets them (tests/testing/tolerance.h). Every gradient is a sum over the
// batch's tokens that the replicas group in two halves; at step 1, from the same
// weights, that regrouping is all that separates them. The weights are within what
// AdamW makes of the gradient differences so far (`drift`, one per tensor).
void ExpectWithinRegroupingAndAdamWDrift(int step, compute::ModelChunk& mine,
                                         compute::ModelChunk& theirs,
                                         std::vector<::pipetrain::testing::AdamWDrift>& drift) {
  const int64_t tokens = int64_t{kBatch} * Tiny().seq_len;
  const std::vector<model::ParamSpec> params = theirs.Params();
  ASSERT_EQ(drift.size(), params.size());
  for (size_t p = 0; p < params.size(); ++p) {
    const std::string& name = params[p].name;
    const auto g_mine = *mine.GetGrad(name), g_theirs = *theirs.GetGrad(name);
    const auto w_mine = *mine.GetParam(name), w_theirs = *theirs.GetParam(name);
    if (step == 1) {
      EXPECT_LE(::pipetrain::testing::RelativeL2Error(g_mine, g_theirs),
                ::pipetrain::testing::ReorderedTensorSumTolerance(tokens))
          << name << ": the averaged gradient is not the whole batch's";
    }
    drift[p].Step(step, g_mine, g_theirs, *mine.GetOptimizerMoment(name, true),
                  *theirs.GetOptimizerMoment(name, true), w_mine, w_theirs);
    for (size_t i = 0; i < w_mine.size(); ++i) {
      ASSERT_LE(std::fabs(double{w_mine[i]} - w_theirs[i]), drift[p].bound()[i])
          << name << "[" << i << "]: the replicas' update differs from the whole batch's "
          << "beyond what AdamW makes of their gradients (" << g_mine[i] << " and "
          << g_theirs[i] << ")";
    }
  }
}

// Two data-parallel replicas, each on half of the batch's micro-batches, with their
// gradients averaged at the optimizer step, end up with the weights of one stage that
// ran the whole batch: equal to each other bit for bit, and to it up to the order of
// the sums (and what AdamW makes of that). In bf16 as in fp32: the averaging is of
// fp32 gradients either way, so the same bound holds.
class ReplicasTest : public ::testing::TestWithParam<bool> {};
INSTANTIATE_TEST_SUITE_P(Precisions, ReplicasTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "bf16" : "fp32"; });

TEST_P(ReplicasTest, ReplicasAveragingTheirGradientsTrainAsOneOnTheWholeBatch) {
  const bool bf16 = GetParam();
  compute::OptimizerSettings adam = Adam();
  Single whole = MakeSingle(1, 0, adam, false, {}, bf16);
  whole.program.num_micro_batches = 4;
  whole.program.actions = *schedule::ParseActions("F0 F1 F2 F3 B0 B1 B2 B3 OPT");
  ::pipetrain::testing::InProcessCopies average(2);
  std::vector<Single> replicas;
  for (int r = 0; r < 2; ++r) {
    replicas.push_back(MakeSingle(1, 0, adam, false, average.AllReduceFor(r), bf16));
  }
  // The whole batch's program on the replicas' weights: what their losses must be.
  Single probe = MakeSingle(1, 0, adam, false, {}, bf16);
  probe.program = whole.program;
  std::vector<::pipetrain::testing::AdamWDrift> drift(
      LayersOf(*whole.executor).Params().size(),
      ::pipetrain::testing::AdamWDrift({.lr = adam.lr, .beta1 = adam.beta1, .beta2 = adam.beta2,
                                        .eps = adam.eps, .weight_decay = adam.weight_decay}));
  for (uint64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const model::TokenBatch batch = RandomBatch(static_cast<int>(step));
    auto whole_batch = [&] {
      StepInputs all;
      all.step = step;
      for (int mb = 0; mb < 4; ++mb) {
        all.tokens.push_back(Rows(batch.inputs, mb, 2));
        all.targets.push_back(Rows(batch.targets, mb, 2));
      }
      return all;
    };
    for (const model::ParamSpec& p : LayersOf(*probe.executor).Params()) {
      ASSERT_THAT(LayersOf(*probe.executor)
                      .SetParam(p.name, *LayersOf(*replicas[0].executor).GetParam(p.name)),
                  IsOk());
    }
    auto on_their_weights = probe.executor->RunStep(probe.program, whole_batch());
    ASSERT_THAT(on_their_weights.status(), IsOk());
    auto want = whole.executor->RunStep(whole.program, whole_batch());
    ASSERT_THAT(want.status(), IsOk());
    std::vector<absl::StatusOr<StepResult>> got(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        StepInputs half;
        half.step = step;
        for (int mb = 2 * r; mb < 2 * r + 2; ++mb) {
          half.tokens.push_back(Rows(batch.inputs, mb, 2));
          half.targets.push_back(Rows(batch.targets, mb, 2));
        }
        got[r] = replicas[r].executor->RunStep(replicas[r].program, std::move(half));
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < 2; ++r) ASSERT_THAT(got[r].status(), IsOk());
    // The losses are each replica's half of the batch's: the same forward on the same
    // weights, so the same bits (at step 1 the whole's own; then the weights differ).
    EXPECT_EQ(got[0]->losses[0], on_their_weights->losses[0]);
    EXPECT_EQ(got[1]->losses[1], on_their_weights->losses[3]);
    if (step == 1) {
      EXPECT_EQ(got[0]->losses[0], want->losses[0]);
      EXPECT_EQ(got[1]->losses[1], want->losses[3]);
    }
    // The optimizer step reports its averaging, within its own time; no other action.
    for (const ActionTiming& t : got[0]->timings) {
      if (t.action.kind == schedule::ActionKind::kOptimizerStep) {
        EXPECT_GT(t.reduce_us, 0);
        EXPECT_LE(t.reduce_us, t.end_us - t.start_us);
      } else {
        EXPECT_EQ(t.reduce_us, 0);
      }
    }
    for (const ActionTiming& t : want->timings) EXPECT_EQ(t.reduce_us, 0) << "one replica";
    const auto w0 = Weights(*replicas[0].executor), w1 = Weights(*replicas[1].executor);
    EXPECT_TRUE(w0 == w1) << "the replicas' weights drifted apart";
    ExpectWithinRegroupingAndAdamWDrift(static_cast<int>(step), LayersOf(*replicas[0].executor),
                                        LayersOf(*whole.executor), drift);
  }
  // Without averaging, one replica's own half gives another update.
  Single alone = MakeSingle(1, 0, adam, false, {}, bf16);
  StepInputs half;
  half.step = 1;
  const model::TokenBatch batch = RandomBatch(1);
  for (int mb = 0; mb < 2; ++mb) {
    half.tokens.push_back(Rows(batch.inputs, mb, 2));
    half.targets.push_back(Rows(batch.targets, mb, 2));
  }
  ASSERT_THAT(alone.executor->RunStep(alone.program, std::move(half)).status(), IsOk());
  Single fresh = MakeSingle(1, 0, adam, false, {}, bf16);
  EXPECT_FALSE(Weights(*alone.executor) == Weights(*fresh.executor));
}

// Stage 0's step result of one 1F1B step on two stages over real layers, with the
// products and activations of `precision`, and stage 1's losses.
struct TwoStageStep {
  StepResult first;
  std::vector<float> losses;
};
// The 1F1B plan of Tiny() on two stages: four micro-batches of two rows.
absl::StatusOr<planner::Plan> TwoStagePlan() {
  planner::PlanOptions po;
  po.model = Tiny();
  po.stages = 2;
  po.micro_batches = 4;
  po.schedule = planner::ScheduleKind::kOneFOneB;
  po.batch_size = 8;
  return planner::MakePlan(po);
}

TwoStageStep RunTwoStages(DType precision) {
  auto plan = TwoStagePlan();
  EXPECT_THAT(plan.status(), IsOk());
  if (!plan.ok()) return {};
  auto pool = std::make_shared<common::BufferPool>();
  auto [up, down] = MakeLocalChannelPair();
  std::vector<std::unique_ptr<compute::CpuBackend>> backends;
  std::vector<std::unique_ptr<Executor>> ex;
  for (int s = 0; s < 2; ++s) {
    backends.push_back(*compute::CpuBackend::Create(1));
    EXPECT_THAT(backends.back()->SetProductOperands(precision), IsOk());
    auto [begin, end] = plan->stages[s].chunks[0];
    auto layers = *compute::ModelChunk::Create(Tiny(), begin, end, backends.back().get(),
                                               {.boundary = precision});
    EXPECT_THAT(layers->Initialize(kSeed), IsOk());
    std::vector<std::unique_ptr<ChunkCompute>> chunks;
    chunks.push_back(*BackendChunk::Create(std::move(layers), 2, pool));
    ExecutorConfig ec;
    ec.job_id = "wire";
    ec.stage = s;
    ec.num_stages = 2;
    ec.recv_timeout = absl::Seconds(20);
    ex.push_back(std::make_unique<Executor>(ec, std::move(chunks), s == 0 ? up.get() : nullptr,
                                            s == 1 ? down.get() : nullptr, pool));
  }
  const model::TokenBatch b = RandomBatch(0);
  std::vector<absl::StatusOr<StepResult>> results(2, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      StepInputs in;
      for (int mb = 0; mb < 4; ++mb) {
        if (s == 0) in.tokens.push_back(Rows(b.inputs, mb, 2));
        if (s == 1) in.targets.push_back(Rows(b.targets, mb, 2));
      }
      results[s] = ex[s]->RunStep(plan->programs[s], std::move(in));
    });
  }
  for (std::thread& t : threads) t.join();
  for (int s = 0; s < 2; ++s) EXPECT_THAT(results[s].status(), IsOk()) << "stage " << s;
  if (!results[0].ok() || !results[1].ok()) return {};
  return {*results[0], results[1]->losses};
}

// training.precision bf16 halves what crosses a stage boundary: each activation and
// gradient is 2 bytes an element, and the losses are still the one-stage bf16 model's.
TEST(ExecutorTest, Bf16StagesSendAndReceiveHalfTheBytesOfFp32) {
  const TwoStageStep fp32 = RunTwoStages(DType::kF32);
  const TwoStageStep bf16 = RunTwoStages(DType::kBF16);
  const uint64_t elements = 2 * Tiny().seq_len * Tiny().d_model;  // one (2, T, C) tensor
  EXPECT_EQ(fp32.first.bytes_sent, 4 * elements * 4);  // 4 activations down
  EXPECT_EQ(fp32.first.bytes_received, 4 * elements * 4);  // 4 gradients up
  EXPECT_EQ(bf16.first.bytes_sent, 4 * elements * 2);
  EXPECT_EQ(bf16.first.bytes_received, 4 * elements * 2);
  // Step 0 of the bf16 reference: its mean loss over the same four micro-batches.
  const Reference& ref = ::pipetrain::testing::SharedReference(1, 0, false, DType::kBF16);
  ASSERT_EQ(bf16.losses.size(), 4u);
  double mean = 0;
  for (float l : bf16.losses) mean += l;
  EXPECT_TRUE(::pipetrain::testing::LossesMatch({mean / 4}, {ref.losses[0]},
                                                ::pipetrain::testing::kSameArithmetic));
}

// An emulated stage's activations travel in the job's precision too.
TEST(ExecutorTest, EmulatedStagesSendActivationsInTheJobsPrecision) {
  auto pool = std::make_shared<common::BufferPool>();
  EmulatedChunk chunk(Tiny(), 0, 2, 2, EmulatedDevice{"test", 1e15}, false, pool,
                      *model::PrecisionNamed("bf16"));
  const Tensor tokens = Rows(RandomBatch(0).inputs, 0, 2);
  auto out = chunk.Forward(0, common::PiecewiseTensor::View(tokens), nullptr);
  ASSERT_THAT(out.status(), IsOk());
  EXPECT_EQ(out->dtype(), DType::kBF16);
  EXPECT_EQ(out->num_bytes(), size_t{2} * Tiny().seq_len * Tiny().d_model * 2);
}

// B and I report the forward they re-ran as recompute_us, within their own time; no
// other action has any, nor any action without recomputation.
TEST(ExecutorTest, BackwardsReportTheirRecomputeTime) {
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    Single s = MakeSingle(1, 0, compute::kStageOptimizerDefaults, recompute);
    s.program.actions = *schedule::ParseActions("F0 F1 B0 I1 W1 OPT");
    auto r = s.executor->RunStep(s.program, Inputs(2, true, true));
    ASSERT_THAT(r.status(), IsOk());
    int64_t total = 0;
    for (const ActionTiming& t : r->timings) {
      SCOPED_TRACE(schedule::ToString(t.action));
      EXPECT_GE(t.recompute_us, 0);
      EXPECT_LE(t.recompute_us, t.end_us - t.start_us);
      if (!schedule::ProducesInputGradient(t.action.kind)) {
        EXPECT_EQ(t.recompute_us, 0);
      }
      total += t.recompute_us;
    }
    if (recompute) {
      EXPECT_GT(total, 0) << "two backwards of the whole model re-ran their forwards";
    } else {
      EXPECT_EQ(total, 0);
    }
  }
}

// Phase 1 (defer_optimizer) then phase 2 (ApplyOptimizer) is the same step as one run
// given the same global norm: bit for bit, over two steps (AdamW's state carries on).
TEST(ExecutorTest, ADeferredStepAppliedLaterEqualsOneRunWithTheSameNorm) {
  compute::OptimizerSettings clipped = Adam();
  clipped.grad_clip_norm = kClip;
  Single direct = MakeSingle(1, 0, clipped), deferred = MakeSingle(1, 0, clipped);
  const std::vector<std::vector<float>> initial = Weights(*deferred.executor);
  for (uint64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    // A norm unlike the stage's own, so that using it (and not the own) shows.
    const double norm = 3.0 * step;
    StepInputs in = Inputs(2, true, true);
    in.step = step;
    in.global_grad_norm = norm;
    in.lr = 0.02f;
    auto want = direct.executor->RunStep(direct.program, std::move(in));
    ASSERT_THAT(want.status(), IsOk());

    in = Inputs(2, true, true);
    in.step = step;
    in.defer_optimizer = true;
    in.lr = 0.02f;
    const std::vector<std::vector<float>> before = Weights(*deferred.executor);
    auto got = deferred.executor->RunStep(deferred.program, std::move(in));
    ASSERT_THAT(got.status(), IsOk());
    EXPECT_EQ(got->grad_norm_sq, want->grad_norm_sq);
    EXPECT_EQ(got->losses, want->losses);
    EXPECT_TRUE(Weights(*deferred.executor) == before) << "phase 1 changed a weight";
    if (step == 1) {
      EXPECT_TRUE(before == initial);
    }
    // Every action but the optimizer's, which phase 2 reports.
    ASSERT_EQ(got->timings.size(), want->timings.size() - 1);
    EXPECT_EQ(deferred.executor->pending_optimizer_step(), std::optional<uint64_t>(step));

    auto timing = deferred.executor->ApplyOptimizer(step, norm, std::nullopt);
    ASSERT_THAT(timing.status(), IsOk());
    EXPECT_EQ(schedule::ToString(timing->action), "OPT");
    EXPECT_FALSE(timing->link);
    EXPECT_GE(timing->start_us, got->timings.back().end_us);
    EXPECT_LE(timing->start_us, timing->end_us);
    EXPECT_FALSE(deferred.executor->pending_optimizer_step().has_value());
    EXPECT_TRUE(Weights(*deferred.executor) == Weights(*direct.executor));
    EXPECT_FALSE(Weights(*deferred.executor) == before);
  }
}

// Out-of-order calls are FAILED_PRECONDITION naming job, stage and step, and change
// nothing; bad values are INVALID_ARGUMENT naming the field.
TEST(ExecutorTest, ApplyingTheOptimizerOutOfTurnIsRefused) {
  Single s = MakeSingle();
  Executor& ex = *s.executor;
  EXPECT_THAT(ex.ApplyOptimizer(1, 1.0, std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("job 'job-x' stage 0 step 1"),
                             HasSubstr("no optimizer step is pending"))));
  StepInputs in = Inputs(2, true, true);
  in.step = 1;
  in.defer_optimizer = true;
  ASSERT_THAT(ex.RunStep(s.program, std::move(in)).status(), IsOk());
  const std::vector<std::vector<float>> pending = Weights(ex);

  // Another step, a forward-only one included, waits for the pending optimizer step.
  for (bool forward_only : {false, true}) {
    schedule::StageProgram p = s.program;
    p.forward_only = forward_only;
    if (forward_only) p.actions = *schedule::ParseActions("F0 F1");
    in = Inputs(2, true, true);
    in.step = 2;
    EXPECT_THAT(ex.RunStep(p, std::move(in)).status(),
                StatusIs(absl::StatusCode::kFailedPrecondition,
                         AllOf(HasSubstr("step 2 of job 'job-x' stage 0"),
                               HasSubstr("optimizer step of step 1 is still pending"))));
  }
  EXPECT_THAT(ex.CheckNoPendingOptimizer("export"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("export of job 'job-x'")));
  EXPECT_THAT(ex.ApplyOptimizer(2, 1.0, std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("job 'job-x' stage 0 step 2"), HasSubstr("step 1's is"))));
  EXPECT_THAT(ex.ApplyOptimizer(1, -1.0, std::nullopt).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field global_grad_norm")));
  EXPECT_TRUE(Weights(ex) == pending) << "a refused call changed the weights";

  ASSERT_THAT(ex.ApplyOptimizer(1, 1.0, std::nullopt).status(), IsOk());
  EXPECT_THAT(ex.ApplyOptimizer(1, 1.0, std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no optimizer step")));
  EXPECT_THAT(ex.CheckNoPendingOptimizer("export"), IsOk());

  // Deferring needs an optimizer step in the program.
  schedule::StageProgram eval = s.program;
  eval.forward_only = true;
  eval.actions = *schedule::ParseActions("F0 F1");
  in = Inputs(2, true, true);
  in.step = 2;
  in.defer_optimizer = true;
  EXPECT_THAT(ex.RunStep(eval, std::move(in)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("field defer_optimizer")));
  in = Inputs(2, true, true);
  in.step = 2;
  EXPECT_THAT(ex.RunStep(s.program, std::move(in)).status(), IsOk());
}

TEST(ExecutorTest, RefusesBadProgramsBeforeRunningThem) {
  Single s = MakeSingle();
  s.program.actions = *schedule::ParseActions("F0 F0 B0 F1 B1 OPT");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("stage 0 position 1 (F0)"), HasSubstr("duplicate forward"))));
  s.program.actions = *schedule::ParseActions("B0 F0 F1 B1 OPT");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("comes before the forward")));
  s.program.actions = *schedule::ParseActions("F0 F1 B0 OPT");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing backward B1")));
  // The validator's rules, which the executor relies on rather than repeating.
  s.program.actions = *schedule::ParseActions("F0 F1 W0 I0 B1 OPT");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("weight gradient before the input gradient")));
  s.program.actions = *schedule::ParseActions("F0 F1 F2 B0 B1 B2 OPT");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("out of range")));
  s.program.actions = *schedule::ParseActions("F0 F1 B0 B1 OPT");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(1, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("tokens has 1 micro-batches")));
  s.program.stage = 3;
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("stage 3")));
  // After refusals the executor still runs a good program.
  s.program.stage = 0;
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(), IsOk());
}

TEST(ExecutorTest, ForwardOnlyProgramsRunTheirForwardsAndNothingElse) {
  Single s = MakeSingle();
  s.program.forward_only = true;
  s.program.actions = *schedule::ParseActions("F1 F0");
  auto r = s.executor->RunStep(s.program, Inputs(2, true, true));
  ASSERT_THAT(r.status(), IsOk());
  ASSERT_EQ(r->losses.size(), 2u);
  EXPECT_GT(r->losses[1], 0.0f);
  EXPECT_EQ(r->timings.size(), 2u);
  EXPECT_EQ(r->grad_norm_sq, 0.0);
  // A backward or an optimizer step has no place in it, and every forward must run.
  s.program.actions = *schedule::ParseActions("F0 F1 B0 B1");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("stage 0 position 2 (B0)"), HasSubstr("forward-only"))));
  s.program.actions = *schedule::ParseActions("F0 F1 OPT");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("position 2 (OPT)")));
  s.program.actions = *schedule::ParseActions("F0");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("missing forward F1")));
  // The same executor goes on training.
  s.program.forward_only = false;
  s.program.actions = *schedule::ParseActions("F0 F1 B0 B1 OPT");
  EXPECT_THAT(s.executor->RunStep(s.program, Inputs(2, true, true)).status(), IsOk());
}

TEST(ExecutorTest, AMissingNeighbourTensorTimesOutNamingTheAction) {
  auto pool = std::make_shared<common::BufferPool>();
  auto backend = *compute::CpuBackend::Create(1);
  auto layers =
      *compute::ModelChunk::Create(Tiny(), 3, Tiny().num_pipeline_layers(), backend.get());
  ASSERT_THAT(layers->Initialize(kSeed), IsOk());
  std::vector<std::unique_ptr<ChunkCompute>> chunks;
  chunks.push_back(*BackendChunk::Create(std::move(layers), 2, pool));
  auto [up, down] = MakeLocalChannelPair();
  ExecutorConfig ec;
  ec.job_id = "job-y";
  ec.stage = 1;
  ec.num_stages = 2;
  ec.recv_timeout = absl::Milliseconds(100);
  Executor ex(ec, std::move(chunks), nullptr, down.get(), pool);
  schedule::StageProgram p;
  p.stage = 1;
  p.num_stages = 2;
  p.num_micro_batches = 1;
  p.actions = *schedule::ParseActions("RECV_F0 F0 B0 SEND_B0 OPT");
  StepInputs in = Inputs(1, false, true);
  in.step = 9;
  in.defer_optimizer = true;
  EXPECT_THAT(ex.RunStep(p, std::move(in)).status(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr("job 'job-y' stage 1 step 9: position 0 (RECV_F0)"),
                             HasSubstr("micro-batch 0"))));
  // A failed deferred step leaves no optimizer step pending.
  EXPECT_FALSE(ex.pending_optimizer_step().has_value());
  EXPECT_THAT(ex.ApplyOptimizer(9, 1.0, std::nullopt).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("stage 1 step 9")));
}

// The emulated device takes the cost model's time, moves real sizes and holds the
// activations the planner predicts.
TEST(ExecutorTest, EmulatedStagesFollowTheCostModel) {
  auto plan = TwoStagePlan();
  ASSERT_THAT(plan.status(), IsOk());
  // Slow enough that each forward takes ~2 ms.
  const double flops = model::CostOfLayer(Tiny(), 1).forward_flops * 2 * Tiny().seq_len * 4 / 2e-3;
  const EmulatedDevice device{"test", flops};
  auto pool = std::make_shared<common::BufferPool>();
  auto [up, down] = MakeLocalChannelPair();
  std::vector<std::unique_ptr<Executor>> ex;
  std::vector<EmulatedChunk*> backend_chunks;
  for (int s = 0; s < 2; ++s) {
    auto [begin, end] = plan->stages[s].chunks[0];
    auto backend_chunk =
        std::make_unique<EmulatedChunk>(Tiny(), begin, end, 2, device, false, pool);
    backend_chunks.push_back(backend_chunk.get());
    std::vector<std::unique_ptr<ChunkCompute>> chunks;
    chunks.push_back(std::move(backend_chunk));
    ExecutorConfig ec;
    ec.job_id = "emu";
    ec.stage = s;
    ec.num_stages = 2;
    ex.push_back(std::make_unique<Executor>(ec, std::move(chunks), s == 0 ? up.get() : nullptr,
                                            s == 1 ? down.get() : nullptr, pool));
  }
  const model::TokenBatch b = RandomBatch(0);
  std::vector<absl::StatusOr<StepResult>> results(2, absl::UnknownError("not run"));
  std::thread t0([&] {
    StepInputs in;
    for (int mb = 0; mb < 4; ++mb) in.tokens.push_back(Rows(b.inputs, mb, 2));
    results[0] = ex[0]->RunStep(plan->programs[0], std::move(in));
  });
  std::thread t1([&] {
    StepInputs in;
    for (int mb = 0; mb < 4; ++mb) in.targets.push_back(Rows(b.targets, mb, 2));
    results[1] = ex[1]->RunStep(plan->programs[1], std::move(in));
  });
  t0.join();
  t1.join();
  for (int s = 0; s < 2; ++s) {
    ASSERT_THAT(results[s].status(), IsOk());
    EXPECT_DOUBLE_EQ(static_cast<double>(results[s]->peak_activation_bytes),
                     plan->stages[s].peak_activation_bytes)
        << "stage " << s;
    for (const ActionTiming& t : results[s]->timings) {
      if (t.action.kind == schedule::ActionKind::kForward) {
        EXPECT_GE(t.end_us - t.start_us,
                  static_cast<int64_t>(backend_chunks[s]->forward_s() * 1e6 * 0.95));
      }
    }
  }
  // Real sizes on the wire: 4 activations (2, T, C) f32 down, 4 gradients up.
  const uint64_t tensor = 2 * Tiny().seq_len * Tiny().d_model * 4;
  EXPECT_EQ(results[0]->bytes_sent, 4 * tensor);
  EXPECT_EQ(results[0]->bytes_received, 4 * tensor);

  // An evaluation: the same forwards, activations down and nothing back up.
  auto eval = planner::ForwardOnlySchedule(2, 4, 1);
  ASSERT_THAT(eval.status(), IsOk());
  std::thread e0([&] {
    StepInputs in;
    in.step = 1;
    for (int mb = 0; mb < 4; ++mb) in.tokens.push_back(Rows(b.inputs, mb, 2));
    results[0] = ex[0]->RunStep((*eval)[0], std::move(in));
  });
  std::thread e1([&] {
    StepInputs in;
    in.step = 1;
    for (int mb = 0; mb < 4; ++mb) in.targets.push_back(Rows(b.targets, mb, 2));
    results[1] = ex[1]->RunStep((*eval)[1], std::move(in));
  });
  e0.join();
  e1.join();
  for (int s = 0; s < 2; ++s) {
    ASSERT_THAT(results[s].status(), IsOk());
    EXPECT_GT(results[s]->peak_activation_bytes, 0u);
    EXPECT_LT(static_cast<double>(results[s]->peak_activation_bytes),
              plan->stages[s].peak_activation_bytes)
        << "stage " << s;
  }
  EXPECT_EQ(results[1]->losses.size(), 4u);
  EXPECT_EQ(results[0]->bytes_sent, 4 * tensor);
  EXPECT_EQ(results[0]->bytes_received, 0u);
}

// An emulated stage reports the modelled recompute share of B and I: its forward's
// time when recomputing, else none.
TEST(ExecutorTest, EmulatedBackwardsReportTheModelledRecompute) {
  const double flops = model::CostOfLayer(Tiny(), 1).forward_flops * 2 * Tiny().seq_len * 4 / 2e-3;
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "no recompute");
    auto pool = std::make_shared<common::BufferPool>();
    auto chunk = std::make_unique<EmulatedChunk>(Tiny(), 0, Tiny().num_pipeline_layers(), 2,
                                                 EmulatedDevice{"test", flops}, recompute, pool);
    const int64_t forward_us = static_cast<int64_t>(chunk->forward_s() * 1e6);
    ASSERT_GT(forward_us, 0);
    std::vector<std::unique_ptr<ChunkCompute>> chunks;
    chunks.push_back(std::move(chunk));
    ExecutorConfig ec;
    ec.job_id = "emu";
    Executor ex(ec, std::move(chunks), nullptr, nullptr, pool);
    schedule::StageProgram program;
    program.num_micro_batches = 2;
    program.actions = *schedule::ParseActions("F0 F1 B0 I1 W1 OPT");
    auto r = ex.RunStep(program, Inputs(2, true, true));
    ASSERT_THAT(r.status(), IsOk());
    ASSERT_EQ(r->timings.size(), 6u);
    for (const ActionTiming& t : r->timings) {
      SCOPED_TRACE(schedule::ToString(t.action));
      const bool recomputes = recompute && schedule::ProducesInputGradient(t.action.kind);
      EXPECT_EQ(t.recompute_us, recomputes ? forward_us : 0);
    }
  }
}

// What a stage reports as its peak memory is the planner's prediction to the byte, part
// by part: the state, the tables its chunks' layers share (Llama's rotary angles, one
// pair per chunk; none for GPT-2) and the activations, in both precisions. One stage
// runs in process through StageRuntime, as a stage server runs it.
TEST(ExecutorTest, AStagesReportedPeakMemoryIsThePlannersPrediction) {
  for (const bool llama : {false, true}) {
    for (const char* precision : {"fp32", "bf16"}) {
      SCOPED_TRACE(absl::StrCat(llama ? "llama " : "gpt2 ", precision));
      planner::PlanOptions po;
      po.model = ::pipetrain::testing::TinyModel(/*tied=*/false, llama);
      po.micro_batches = kMicroBatches;
      po.schedule = planner::ScheduleKind::kGpipe;
      po.batch_size = kBatch;
      po.precision = precision;
      auto plan = planner::MakePlan(po);
      ASSERT_THAT(plan.status(), IsOk());
      const planner::StagePlan& sp = plan->stages[0];
      JobConfig config;
      config.job_id = "solo";
      config.model = po.model;
      config.chunks = sp.chunks;
      config.chunk_recompute = sp.chunk_recompute;
      config.precision = *model::PrecisionNamed(precision);
      config.micro_batch_size = kBatch / kMicroBatches;
      config.seed = kSeed;
      const MemoryBreakdown need = MemoryOf(config, DeviceSpec::Kind::kCpu, false);
      EXPECT_EQ(static_cast<double>(need.state), sp.state_bytes);
      EXPECT_EQ(static_cast<double>(need.tables), sp.table_bytes);
      const model::TransformerConfig& m = po.model;
      EXPECT_EQ(need.tables, llama ? 2u * m.seq_len * (m.head_dim() / 2) * 4 : 0u);

      RuntimeOptions options;
      options.device.kind = DeviceSpec::Kind::kCpu;
      StageRuntime runtime(options);
      ASSERT_THAT(runtime.Configure(config).status(), IsOk());
      StepRequest request;
      request.job_id = "solo";
      request.program = plan->programs[0];
      const model::TokenBatch b = RandomBatch(0);
      for (int mb = 0; mb < kMicroBatches; ++mb) {
        request.inputs.tokens.push_back(Rows(b.inputs, mb, config.micro_batch_size));
        request.inputs.targets.push_back(Rows(b.targets, mb, config.micro_batch_size));
      }
      auto report = runtime.RunStep(std::move(request));
      ASSERT_THAT(report.status(), IsOk());
      EXPECT_EQ(static_cast<double>(report->result.peak_activation_bytes),
                sp.peak_activation_bytes);
      EXPECT_EQ(static_cast<double>(report->peak_memory_bytes), sp.peak_memory_bytes());
      EXPECT_EQ(sp.peak_memory_bytes(),
                sp.state_bytes + sp.table_bytes + sp.peak_activation_bytes);
    }
  }
}

}  // namespace
}  // namespace pipetrain::stage_server
