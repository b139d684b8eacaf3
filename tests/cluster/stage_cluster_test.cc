// Integration: real pipetrain-stage processes on 127.0.0.1 (port 0), configured from a
// plan and driven over gRPC without a coordinator. For K = 1, 2, 4, every schedule and
// every recompute mode, 5 steps give the losses and final weights of the single-stage
// reference (and a recomputing stage reports its recompute time), and an evaluation
// (forward-only step) between training steps reports the reference's losses and
// changes nothing. Faults: a neighbour killed mid-step fails the
// step with UNAVAILABLE naming it, within the deadline, and the survivor serves the
// next job (also a downstream survivor whose next step waits for the lost upstream); a job over the memory limit is refused before anything is allocated; a
// deferred optimizer step waits for ApplyOptimizer and blocks the job's other calls.
// Snapshots: K = 3 stages keep their own and their predecessor's two newest steps,
// equal to ExportChunk's bytes, listed while a step waits on a dead neighbour; a wrong
// peer_secret is refused, Configure drops them, --memory-limit counts their reserve.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/frame_proto.h"
#include "common/model/checkpoint.h"
#include "common/testing/status_matchers.h"
#include "coordinator/planner/forward_only.h"
#include "coordinator/planner/planner.h"
#include "coordinator/rendezvous/rendezvous_service.h"
#include "coordinator/rendezvous/rendezvous_store.h"
#include "coordinator/stages/stage_client.h"
#include "coordinator/runner/stage_configure.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/stage.grpc.pb.h"
#include "stage_server/exec/backend_chunk.h"
#include "tests/testing/loss_comparison.h"
#include "tests/testing/reference_training.h"
#include "tests/testing/tolerance.h"
#include "tests/testing/subprocess.h"

namespace pipetrain {
namespace {

using ::pipetrain::testing::kBatch;
using ::pipetrain::testing::kMicroBatches;
using ::pipetrain::testing::Subprocess;
using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace std::chrono_literals;
namespace pb = ::pipetrain::v1;

constexpr int kSteps = 5;

struct Stage {
  std::unique_ptr<Subprocess> process;
  std::string address;
  std::unique_ptr<pb::Stage::Stub> stub;
};

Stage StartStage(std::vector<std::string> extra = {}) {
  std::vector<std::string> argv = {std::string(PIPETRAIN_BIN_DIR) + "/pipetrain-stage",
                                   "--listen", "127.0.0.1:0", "--device", "cpu"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Stage s;
  auto p = Subprocess::Start(argv);
  EXPECT_TRUE(p.ok()) << p.status();
  s.process = std::make_unique<Subprocess>(std::move(*p));
  auto line = s.process->WaitForLine("stage listening on ", 30s);
  EXPECT_TRUE(line.ok()) << line.status();
  s.address = line->substr(line->rfind(' ') + 1);
  s.stub = pb::Stage::NewStub(grpc::CreateChannel(s.address, grpc::InsecureChannelCredentials()));
  return s;
}

template <typename Request, typename Response, typename Call>
grpc::Status Call3(Call call, const Request& req, Response* resp,
                   std::chrono::seconds deadline = 60s) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  return call(&ctx, req, resp);
}

planner::Plan MakeTestPlan(planner::ScheduleKind kind, int K, int v, pb::RecomputeMode mode) {
  planner::PlanOptions po;
  po.model = testing::TinyModel();
  po.stages = K;
  po.micro_batches = kMicroBatches;
  po.chunks = v;
  po.schedule = kind;
  po.recompute = mode;
  po.batch_size = kBatch;
  auto plan = planner::MakePlan(po);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

// The coordinator's own request (coordinator/runner/stage_configure.h), with the tests' seed and
// AdamW settings and small frames, so that every tensor crosses in several.
pb::ConfigureRequest ConfigureFor(const planner::Plan& plan, const std::string& job, int s,
                                  const std::vector<Stage>& stages) {
  coordinator::StageWiring wiring{job, {}, "secret-" + job, 20000};
  for (const Stage& stage : stages) wiring.addresses.push_back(stage.address);
  const compute::OptimizerSettings adam = testing::TestAdam();
  pb::OptimizerConfig optimizer;
  optimizer.set_lr(adam.lr);
  optimizer.set_beta1(adam.beta1);
  optimizer.set_beta2(adam.beta2);
  optimizer.set_eps(adam.eps);
  optimizer.set_weight_decay(adam.weight_decay);
  pb::ConfigureRequest r =
      coordinator::BuildConfigureRequest(plan, s, testing::kSeed, optimizer, wiring);
  r.set_frame_bytes(1000);
  return r;
}

// Runs one step of `programs` on `batch` on stages [0, K) at once; returns each
// stage's response status.
std::vector<grpc::Status> RunStep(const schedule::Schedule& programs, const std::string& job,
                                  int step, const model::TokenBatch& batch,
                                  std::vector<Stage>& stages, std::vector<pb::RunStepResponse>& out,
                                  bool defer_optimizer = false, bool snapshot = false) {
  const int K = static_cast<int>(programs.size()), rows = kBatch / kMicroBatches;
  std::vector<grpc::Status> status(K);
  out.assign(K, {});
  std::vector<std::thread> threads;
  for (int s = 0; s < K; ++s) {
    threads.emplace_back([&, s] {
      pb::RunStepRequest req;
      req.set_job_id(job);
      req.set_step(step);
      *req.mutable_program() = schedule::ToProto(programs[s]);
      req.set_defer_optimizer(defer_optimizer);
      req.set_snapshot(snapshot);
      for (int mb = 0; mb < kMicroBatches; ++mb) {
        if (s == 0) common::TensorToProto(testing::Rows(batch.inputs, mb, rows), req.add_tokens());
        if (s == programs[0].topology().HeadStage()) {
          common::TensorToProto(testing::Rows(batch.targets, mb, rows), req.add_targets());
        }
      }
      status[s] = Call3([&](grpc::ClientContext* c, const pb::RunStepRequest& q, pb::RunStepResponse* r) {
        return stages[s].stub->RunStep(c, q, r);
      }, req, &out[s]);
    });
  }
  for (auto& t : threads) t.join();
  return status;
}

// A training step of the plan, on the step's own batch.
std::vector<grpc::Status> RunStep(const planner::Plan& plan, const std::string& job, int step,
                                  std::vector<Stage>& stages,
                                  std::vector<pb::RunStepResponse>& out) {
  return RunStep(plan.programs, job, step, testing::RandomBatch(step), stages, out);
}

double MeanLoss(const pb::RunStepResponse& head) {
  double loss = 0;
  for (float l : head.losses()) loss += l;
  return loss / kMicroBatches;
}

std::string Export(Stage& stage, const std::string& job, int chunk) {
  grpc::ClientContext ctx;
  pb::ExportChunkRequest req;
  req.set_job_id(job);
  req.set_chunk(chunk);
  auto reader = stage.stub->ExportChunk(&ctx, req);
  std::string bytes;
  pb::ChunkPiece piece;
  while (reader->Read(&piece)) bytes += piece.data();
  grpc::Status st = reader->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
  return bytes;
}

grpc::Status Import(Stage& stage, const std::string& job, int chunk, const std::string& bytes) {
  grpc::ClientContext ctx;
  pb::ImportChunkResponse resp;
  auto writer = stage.stub->ImportChunk(&ctx, &resp);
  constexpr size_t kPiece = 10000;  // several pieces
  for (size_t at = 0; at < bytes.size(); at += kPiece) {
    pb::ChunkPiece piece;
    piece.set_job_id(job);
    piece.set_chunk(chunk);
    piece.set_offset(at);
    piece.set_total_bytes(bytes.size());
    piece.set_data(bytes.substr(at, kPiece));
    if (!writer->Write(piece)) break;
  }
  writer->WritesDone();
  return writer->Finish();
}

class StageClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    stages_ = new std::vector<Stage>();
    for (int i = 0; i < 4; ++i) stages_->push_back(StartStage());
  }
  static void TearDownTestSuite() {
    for (Stage& s : *stages_) {
      s.process->Signal(SIGTERM);
      EXPECT_TRUE(s.process->Wait(20s).ok());
    }
    delete stages_;
  }
  static std::vector<Stage>* stages_;
};
std::vector<Stage>* StageClusterTest::stages_ = nullptr;

TEST_F(StageClusterTest, EverySchedulePlanAndRecomputeModeMatchesTheReference) {
  const testing::Reference& ref = testing::SharedReference(kSteps);
  const pb::RecomputeMode modes[] = {pb::RECOMPUTE_NEVER, pb::RECOMPUTE_ALWAYS,
                                     pb::RECOMPUTE_EXCEPT_LAST};
  int job_number = 0;
  for (pb::RecomputeMode mode : modes) {
    for (int K : {1, 2, 4}) {
      for (auto kind : {planner::ScheduleKind::kGpipe, planner::ScheduleKind::kOneFOneB,
                        planner::ScheduleKind::kInterleaved, planner::ScheduleKind::kZbH1,
                        planner::ScheduleKind::kZbV, planner::ScheduleKind::kDualPipeV}) {
        const bool v_shaped = planner::EntryOf(kind).placement == schedule::Placement::kV;
        const int v = planner::EntryOf(kind).chunked ? 2 : 1;
        if (kind == planner::ScheduleKind::kInterleaved && K == 1) continue;
        if (v_shaped && kMicroBatches < 2 * K - 1) continue;  // the V needs M >= 2K-1
        const std::string job = absl::StrCat("job-", ++job_number);
        SCOPED_TRACE(absl::StrCat(job, " ", planner::ScheduleName(kind), " K=", K,
                                  " recompute=", planner::RecomputeName(mode)));
        const planner::Plan plan = MakeTestPlan(kind, K, v, mode);
        for (int s = 0; s < K; ++s) {
          pb::ConfigureResponse resp;
          grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                                      pb::ConfigureResponse* r) {
            return (*stages_)[s].stub->Configure(c, q, r);
          }, ConfigureFor(plan, job, s, *stages_), &resp);
          ASSERT_TRUE(st.ok()) << st.error_message();
        }
        std::vector<double> losses;  // per step, compared with the reference's below
        int64_t recompute_us = 0;    // what every B and I reported re-running
        for (int step = 0; step < kSteps; ++step) {
          std::vector<pb::RunStepResponse> out;
          auto status = RunStep(plan, job, step, *stages_, out);
          for (int s = 0; s < K; ++s) ASSERT_TRUE(status[s].ok()) << "stage " << s << ": " << status[s].error_message();
          double loss = 0;
          for (float l : out[plan.topology().HeadStage()].losses()) loss += l;
          loss /= kMicroBatches;
          losses.push_back(loss);
          for (int s = 0; s < K; ++s) {
            EXPECT_EQ(static_cast<double>(out[s].peak_activation_bytes()),
                      plan.stages[s].peak_activation_bytes) << "stage " << s;
            for (const pb::ActionTiming& t : out[s].timings()) {
              if (t.action().kind() != pb::BACKWARD && t.action().kind() != pb::BACKWARD_INPUT) {
                EXPECT_EQ(t.recompute_us(), 0) << "stage " << s;
              }
              recompute_us += t.recompute_us();
            }
          }
        }
        // The stages' recompute time comes through the service's answer.
        bool recomputes = false;
        for (const planner::StagePlan& sp : plan.stages) recomputes |= sp.recomputes_any();
        if (!recomputes) {
          EXPECT_EQ(recompute_us, 0);
        } else {
          EXPECT_GT(recompute_us, 0);
        }
        EXPECT_TRUE(testing::LossesMatch(
            losses, std::vector<double>(ref.losses.begin(), ref.losses.begin() + kSteps),
            testing::kSameArithmetic));
        // Final weights, pulled from every chunk of every stage.
        int tensors = 0;
        for (int s = 0; s < K; ++s) {
          for (size_t c = 0; c < plan.stages[s].chunks.size(); ++c) {
            const std::string bytes = Export((*stages_)[s], job, c);
            auto ckpt = model::ParseCheckpoint(bytes, absl::StrCat("stage ", s, " chunk ", c));
            ASSERT_TRUE(ckpt.ok()) << ckpt.status();
            for (const auto& [name, tensor] : ckpt->params) {
              auto want = ref.model->GetParam(name);
              ASSERT_TRUE(want.ok()) << name;
              auto got = tensor.data<float>();
              EXPECT_LE(testing::RelativeL2Error({got.begin(), got.end()}, *want),
                        testing::kSameArithmetic)
                  << name;
              ++tensors;
            }
          }
        }
        EXPECT_EQ(tensors, 2 + 12 * testing::TinyModel().n_layers + 3);
      }
    }
  }
}

// training.precision reaches the stages through ConfigureRequest.precision: four stages
// in bf16 give the one-stage bf16 reference's losses bit for bit (and not fp32's), move
// half the bytes of the same fp32 job between them (GetStats' last step), and a
// precision the table does not have is refused naming the field and the accepted ones.
TEST_F(StageClusterTest, ABf16JobOnFourStagesGivesTheOneStageBf16Losses) {
  const testing::Reference& ref =
      testing::SharedReference(kSteps, 0, false, common::DType::kBF16);
  const testing::Reference& fp32 = testing::SharedReference(kSteps);
  const planner::Plan plan =
      MakeTestPlan(planner::ScheduleKind::kOneFOneB, 4, 1, pb::RECOMPUTE_NEVER);
  auto configure = [&](const std::string& job, int s, const std::string& precision) {
    pb::ConfigureRequest q = ConfigureFor(plan, job, s, *stages_);
    q.set_precision(precision);
    pb::ConfigureResponse resp;
    return Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& req,
                     pb::ConfigureResponse* r) { return (*stages_)[s].stub->Configure(c, req, r); },
                 q, &resp);
  };
  const grpc::Status refused = configure("job-fp16", 0, "fp16");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("field precision: unknown precision 'fp16'"));
  EXPECT_THAT(refused.error_message(), HasSubstr("accepted: fp32, bf16"));
  for (int s = 0; s < 4; ++s) {
    const grpc::Status st = configure("job-bf16", s, "bf16");
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<pb::RunStepResponse> out;
    auto status = RunStep(plan, "job-bf16", step, *stages_, out);
    for (int s = 0; s < 4; ++s) ASSERT_TRUE(status[s].ok()) << "stage " << s;
    double loss = 0;
    for (float l : out[3].losses()) loss += l;
    losses.push_back(loss / kMicroBatches);
  }
  EXPECT_TRUE(testing::LossesMatch(
      losses, std::vector<double>(ref.losses.begin(), ref.losses.begin() + kSteps),
      testing::kSameArithmetic));
  EXPECT_NE(losses, std::vector<double>(fp32.losses.begin(), fp32.losses.begin() + kSteps))
      << "the bf16 job trained as fp32 does";

  auto stats_of = [&](int s) {
    pb::StageStats stats;
    const grpc::Status st = Call3(
        [&](grpc::ClientContext* c, const pb::GetStatsRequest& q, pb::StageStats* r) {
          return (*stages_)[s].stub->GetStats(c, q, r);
        },
        pb::GetStatsRequest(), &stats);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return stats;
  };
  auto last_step_bytes = [&](int s) {
    const pb::StageStats stats = stats_of(s);
    return std::pair{stats.last_step_bytes_sent(), stats.last_step_bytes_received()};
  };
  std::vector<std::pair<uint64_t, uint64_t>> bf16_bytes;
  for (int s = 0; s < 4; ++s) bf16_bytes.push_back(last_step_bytes(s));
  // The same plan in fp32, one step. Its links are made at that step: none before.
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(configure("job-fp32", s, "fp32").ok());
  for (int s = 0; s < 4; ++s) EXPECT_EQ(stats_of(s).links_size(), 0) << "stage " << s;
  std::vector<pb::RunStepResponse> out;
  auto status = RunStep(plan, "job-fp32", 0, *stages_, out);
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(status[s].ok()) << "stage " << s;
  const uint64_t activation = uint64_t{kBatch / kMicroBatches} * testing::TinyModel().seq_len *
                              testing::TinyModel().d_model;  // elements of one (B, T, C)
  for (int s = 0; s < 4; ++s) {
    const auto [sent, received] = last_step_bytes(s);
    const uint64_t tensors = s == 0 || s == 3 ? kMicroBatches : 2 * kMicroBatches;
    EXPECT_EQ(sent, tensors * activation * 4)
        << "stage " << s << ": fp32 activations down and gradients up";
    EXPECT_EQ(bf16_bytes[s].first * 2, sent) << "stage " << s;
    EXPECT_EQ(bf16_bytes[s].second * 2, received) << "stage " << s;
    EXPECT_EQ(sent, out[s].bytes_sent()) << "stage " << s << ": the RunStep's figure";
    // GetStats names each link's neighbour, its paths (the stages share this host: the
    // handshake put both directions on shared memory) and its bytes, which add up to the
    // step's; these 1 KiB tensors are under LinkShm::kMinTensorBytes, so the stream
    // carried them all.
    const pb::StageStats stats = stats_of(s);
    ASSERT_EQ(stats.links_size(), s == 0 || s == 3 ? 1 : 2) << "stage " << s;
    uint64_t link_bytes = 0;
    for (const pb::LinkPath& link : stats.links()) {
      EXPECT_EQ(std::abs(link.peer_stage() - s), 1) << "stage " << s;
      EXPECT_THAT(link.sending(), HasSubstr("shared memory (")) << "stage " << s;
      EXPECT_THAT(link.receiving(), HasSubstr("shared memory (")) << "stage " << s;
      EXPECT_EQ(link.bytes_sent_same_host(), 0u) << "stage " << s;
      link_bytes += link.bytes_sent();
    }
    EXPECT_EQ(link_bytes, sent) << "stage " << s;
  }
}

// Real processes carry the forward_only flag from the proto to the executor: K = 2,
// interleaved (the ring link too), an evaluation between training steps 0 and 1.
TEST_F(StageClusterTest, AnEvaluationBetweenStepsReportsTheReferenceLossAndChangesNothing) {
  const testing::Reference& ref = testing::SharedReference(kSteps);
  const planner::Plan plan = MakeTestPlan(planner::ScheduleKind::kInterleaved, 2, 2,
                                          pb::RECOMPUTE_NEVER);
  auto eval = planner::ForwardOnlySchedule(2, kMicroBatches, 2);
  ASSERT_TRUE(eval.ok()) << eval.status();
  const std::string job = "eval-job";
  for (int s = 0; s < 2; ++s) {
    pb::ConfigureResponse resp;
    grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                                pb::ConfigureResponse* r) {
      return (*stages_)[s].stub->Configure(c, q, r);
    }, ConfigureFor(plan, job, s, *stages_), &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  // Step numbers increase across training and evaluation; the batches are training
  // steps 0, 1, 2's and one of the evaluation's own.
  std::vector<pb::RunStepResponse> out;
  auto check_ok = [&](const std::vector<grpc::Status>& status) {
    for (int s = 0; s < 2; ++s) {
      ASSERT_TRUE(status[s].ok()) << "stage " << s << ": " << status[s].error_message();
    }
  };
  check_ok(RunStep(plan.programs, job, 0, testing::RandomBatch(0), *stages_, out));
  EXPECT_EQ(MeanLoss(out[1]), ref.losses[0]);
  auto chunk_state = [&] {
    std::string all;
    for (int s = 0; s < 2; ++s) {
      all += Export((*stages_)[s], job, 0) + Export((*stages_)[s], job, 1);
    }
    return all;
  };
  const std::string before = chunk_state();

  const model::TokenBatch held_out = testing::RandomBatch(77);
  check_ok(RunStep(*eval, job, 1, held_out, *stages_, out));
  const std::vector<double> want = testing::ReferenceEvalLosses(1, held_out);
  ASSERT_EQ(out[1].losses_size(), kMicroBatches);
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    EXPECT_EQ(out[1].losses(mb), want[mb]) << "micro-batch " << mb;
  }
  EXPECT_EQ(out[0].losses_size(), 0);
  // The chunk_state (weights, AdamW moments and step) are byte for byte what they were.
  EXPECT_TRUE(chunk_state() == before);

  for (int step = 1; step < 3; ++step) {
    check_ok(RunStep(plan.programs, job, step + 1, testing::RandomBatch(step), *stages_, out));
    EXPECT_EQ(MeanLoss(out[1]), ref.losses[step]) << "step " << step;
  }
}

// Two new stage processes configured for `plan` as job `job`, step 0 run on both.
void StartTwoStageJob(const planner::Plan& plan, const std::string& job, std::vector<Stage>& stages,
                      std::vector<pb::RunStepResponse>& out) {
  stages.push_back(StartStage());
  stages.push_back(StartStage());
  for (int s = 0; s < 2; ++s) {
    pb::ConfigureResponse resp;
    grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                                pb::ConfigureResponse* r) { return stages[s].stub->Configure(c, q, r); },
                            ConfigureFor(plan, job, s, stages), &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  for (const grpc::Status& st : RunStep(plan, job, 0, stages, out)) ASSERT_TRUE(st.ok()) << st.error_message();
}

TEST(StageFaultTest, AKilledNeighbourFailsTheStepWithUnavailableNotAHang) {
  std::vector<Stage> stages;
  const planner::Plan plan = MakeTestPlan(planner::ScheduleKind::kOneFOneB, 2, 1, pb::RECOMPUTE_NEVER);
  std::vector<pb::RunStepResponse> out;
  ASSERT_NO_FATAL_FAILURE(StartTwoStageJob(plan, "fault", stages, out));

  // Step 1: stage 1 dies while stage 0 runs its program.
  pb::RunStepRequest req;
  req.set_job_id("fault");
  req.set_step(1);
  *req.mutable_program() = schedule::ToProto(plan.programs[0]);
  const model::TokenBatch batch = testing::RandomBatch(1);
  for (int mb = 0; mb < kMicroBatches; ++mb) {
    common::TensorToProto(testing::Rows(batch.inputs, mb, kBatch / kMicroBatches), req.add_tokens());
  }
  std::thread killer([&] {
    std::this_thread::sleep_for(300ms);
    stages[1].process->Signal(SIGKILL);
  });
  const auto start = std::chrono::steady_clock::now();
  pb::RunStepResponse resp;
  grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::RunStepRequest& q, pb::RunStepResponse* r) {
    return stages[0].stub->RunStep(c, q, r);
  }, req, &resp);
  killer.join();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_THAT(st.error_message(), AllOf(HasSubstr("stage 1"), HasSubstr("step 1"), HasSubstr("micro-batch")));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s) << "failed well within the 20 s deadline";

  // The survivor stays healthy and runs the next job alone.
  const planner::Plan solo = MakeTestPlan(planner::ScheduleKind::kOneFOneB, 1, 1, pb::RECOMPUTE_NEVER);
  pb::ConfigureResponse cresp;
  st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q, pb::ConfigureResponse* r) {
    return stages[0].stub->Configure(c, q, r);
  }, ConfigureFor(solo, "after-fault", 0, stages), &cresp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::vector<Stage> one;
  one.push_back(std::move(stages[0]));
  for (const grpc::Status& s : RunStep(solo, "after-fault", 0, one, out)) EXPECT_TRUE(s.ok()) << s.error_message();
  one[0].process->Signal(SIGTERM);
  EXPECT_TRUE(one[0].process->Wait(20s).ok());
}

// The downstream survivor of a killed upstream stage: its next step waits for the
// upstream to connect again (a failed link is rebuilt), and a Configure for the next
// job ends that wait at once and is served, not a crash or a 20 s hang.
TEST(StageFaultTest, AfterItsUpstreamDiesAWaitingStepEndsAtConfigureAndTheStageServes) {
  std::vector<Stage> stages;
  const planner::Plan plan = MakeTestPlan(planner::ScheduleKind::kOneFOneB, 2, 1, pb::RECOMPUTE_NEVER);
  std::vector<pb::RunStepResponse> out;
  ASSERT_NO_FATAL_FAILURE(StartTwoStageJob(plan, "lost-upstream", stages, out));
  stages[0].process->Signal(SIGKILL);
  ASSERT_TRUE(stages[0].process->Wait(20s).ok());

  auto step_on_survivor = [&](int step) {
    pb::RunStepRequest req;
    req.set_job_id("lost-upstream");
    req.set_step(step);
    *req.mutable_program() = schedule::ToProto(plan.programs[1]);
    const model::TokenBatch batch = testing::RandomBatch(step);
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      common::TensorToProto(testing::Rows(batch.targets, mb, kBatch / kMicroBatches), req.add_targets());
    }
    pb::RunStepResponse resp;
    return Call3([&](grpc::ClientContext* c, const pb::RunStepRequest& q, pb::RunStepResponse* r) {
      return stages[1].stub->RunStep(c, q, r);
    }, req, &resp);
  };
  // Step 1 finds its link from stage 0 broken and rebuilds it: it waits for stage 0 to
  // connect again.
  grpc::Status waiting;
  std::chrono::steady_clock::time_point waiting_ended;
  std::thread step1([&] {
    waiting = step_on_survivor(1);
    waiting_ended = std::chrono::steady_clock::now();
  });
  std::this_thread::sleep_for(500ms);
  const planner::Plan solo = MakeTestPlan(planner::ScheduleKind::kOneFOneB, 1, 1, pb::RECOMPUTE_NEVER);
  std::vector<Stage> one;
  one.push_back(std::move(stages[1]));
  const auto configure_sent = std::chrono::steady_clock::now();
  pb::ConfigureResponse cresp;
  grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                              pb::ConfigureResponse* r) { return one[0].stub->Configure(c, q, r); },
                          ConfigureFor(solo, "after-lost-upstream", 0, one), &cresp);
  const auto configured = std::chrono::steady_clock::now();
  step1.join();
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_LT(configured - configure_sent, 10s) << "the waiting step's 20 s deadline held it";
  EXPECT_FALSE(waiting.ok()) << "stage 0 never came back";
  EXPECT_LT(waiting_ended - configure_sent, 10s);
  for (const grpc::Status& s : RunStep(solo, "after-lost-upstream", 0, one, out)) {
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  one[0].process->Signal(SIGTERM);
  EXPECT_TRUE(one[0].process->Wait(20s).ok());
}

// Two data-parallel replicas of one stage (each a one-stage pipeline) meeting through a
// rendezvous server as the coordinator serves it, configured, step 0 run on both.
class ReplicaFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    builder_.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder_.RegisterService(&rendezvous_);
    server_ = builder_.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port_ > 0);
    for (int r = 0; r < 2; ++r) {
      replicas_.push_back(StartStage({"--coordinator", absl::StrCat("127.0.0.1:", port_)}));
    }
    address0_ = replicas_[0].address;
    for (int r = 0; r < 2; ++r) {
      // No neighbour addresses are used by a one-stage pipeline.
      pb::ConfigureRequest req = ConfigureFor(plan_, "replicas", 0, replicas_);
      req.set_replica(r);
      req.set_replicas(2);
      req.set_rendezvous_prefix("run-1");
      pb::ConfigureResponse resp;
      grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                                  pb::ConfigureResponse* rr) { return replicas_[r].stub->Configure(c, q, rr); },
                              req, &resp);
      ASSERT_TRUE(st.ok()) << st.error_message();
    }
    grpc::Status first[2];
    std::thread other([&] { first[1] = StepOn(1, 0); });
    first[0] = StepOn(0, 0);
    other.join();
    ASSERT_TRUE(first[0].ok()) << first[0].error_message();
    ASSERT_TRUE(first[1].ok()) << first[1].error_message();
  }
  void TearDown() override { server_->Shutdown(); }

  grpc::Status StepOn(int r, int step) {
    std::vector<Stage> one;
    one.push_back(std::move(replicas_[r]));
    std::vector<pb::RunStepResponse> out;
    grpc::Status st = RunStep(plan_, "replicas", step, one, out)[0];
    replicas_[r] = std::move(one[0]);
    return st;
  }

  // Replica 0 alone runs step 1 (so it waits in the all-reduce for replica 1) while
  // `meanwhile` runs, a second after the step began; the step's status and how long
  // after `meanwhile` began it ended.
  std::pair<grpc::Status, std::chrono::steady_clock::duration> StepAloneWhile(
      const std::function<void()>& meanwhile) {
    grpc::Status waited;
    std::chrono::steady_clock::time_point ended;
    std::thread alone([&] {
      waited = StepOn(0, 1);
      ended = std::chrono::steady_clock::now();
    });
    std::this_thread::sleep_for(1s);
    const auto began = std::chrono::steady_clock::now();
    meanwhile();
    alone.join();
    return {waited, ended - began};
  }

  // Replica 0 runs a job of its own: it still serves. (Through a stub of its own: a
  // step of the replicas' job may be using replicas_[0] meanwhile.)
  void ExpectReplica0ServesAnotherJob() {
    std::vector<Stage> one(1);
    one[0].address = address0_;
    one[0].stub = pb::Stage::NewStub(grpc::CreateChannel(address0_, grpc::InsecureChannelCredentials()));
    pb::ConfigureResponse cresp;
    grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                                pb::ConfigureResponse* r) { return one[0].stub->Configure(c, q, r); },
                            ConfigureFor(plan_, "after-replicas", 0, one), &cresp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    std::vector<pb::RunStepResponse> out;
    for (const grpc::Status& s : RunStep(plan_, "after-replicas", 0, one, out)) {
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
  }

  const planner::Plan plan_ = MakeTestPlan(planner::ScheduleKind::kOneFOneB, 1, 1, pb::RECOMPUTE_NEVER);
  coordinator::RendezvousStore store_;
  coordinator::RendezvousService rendezvous_{&store_};
  grpc::ServerBuilder builder_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::vector<Stage> replicas_;
  std::string address0_;
};

// Replica 1 killed while replica 0 waits in the all-reduce: replica 0's step fails at
// once (not at its 20 s deadline), naming the job, stage, step, the averaging and the
// replicas, and replica 0 serves the next job.
TEST_F(ReplicaFaultTest, AReplicaKilledMidReductionFailsItsCopysStepWithinTheDeadline) {
  auto [waited, took] = StepAloneWhile([&] { replicas_[1].process->Signal(SIGKILL); });
  EXPECT_FALSE(waited.ok());
  EXPECT_LT(took, 10s) << "the 20 s deadline, not the peer's death, ended it";
  EXPECT_THAT(waited.error_message(),
              AllOf(HasSubstr("job 'replicas'"), HasSubstr("stage 0"), HasSubstr("step 1"),
                    HasSubstr("averaging the gradients over the replicas"), HasSubstr("replica")))
      << waited.error_message();
  ExpectReplica0ServesAnotherJob();
}

// Replica 1 alive but never running step 1 (its pipeline lost another stage): a
// Configure of replica 0 (the recovery's) ends the wait at once instead of waiting for
// the all-reduce's deadline, and is served.
TEST_F(ReplicaFaultTest, AConfigureEndsAStepWaitingInTheAllReduce) {
  std::chrono::steady_clock::duration configure_took{};
  auto [waited, took] = StepAloneWhile([&] {
    const auto start = std::chrono::steady_clock::now();
    ExpectReplica0ServesAnotherJob();
    configure_took = std::chrono::steady_clock::now() - start;
  });
  EXPECT_EQ(waited.error_code(), grpc::StatusCode::ABORTED) << waited.error_message();
  EXPECT_THAT(waited.error_message(), HasSubstr("configured again"));
  EXPECT_LT(took, 10s);
  EXPECT_LT(configure_took, 10s) << "the 20 s all-reduce deadline held the Configure";
}

// The same two replicas (their fixture's connected stages) on gloo, configured afresh for
// a job that all-reduces and then for one whose copies split the optimizer
// (shard_optimizer): each replica on batches of its own, the same losses bit for bit
// (with two replicas a sum has one order), the copies' norms adding up to the
// replicas', and each copy reporting about half the replicas' optimizer bytes.
class ReplicaSplitTest : public ReplicaFaultTest {
 protected:
  struct Run {
    std::vector<std::vector<float>> losses;  // per step, per replica: its micro-batches'
    std::vector<double> norm_sq;             // per step, the replicas' grad_norm_sq summed
    uint64_t optimizer_bytes = 0;            // replica 0's, from Configure
  };
  Run Train(const std::string& job, bool split) {
    Run run;
    for (int r = 0; r < 2; ++r) {
      pb::ConfigureRequest req = ConfigureFor(plan_, job, 0, replicas_);
      req.set_replica(r);
      req.set_replicas(2);
      req.set_rendezvous_prefix("run-" + job);
      req.set_shard_optimizer(split);
      pb::ConfigureResponse resp;
      grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                                  pb::ConfigureResponse* rr) { return replicas_[r].stub->Configure(c, q, rr); },
                              req, &resp);
      EXPECT_TRUE(st.ok()) << st.error_message();
      if (r == 0) run.optimizer_bytes = resp.optimizer_bytes();
    }
    for (int step = 0; step < 3; ++step) {
      std::vector<pb::RunStepResponse> out[2];
      grpc::Status status[2];
      std::vector<std::thread> threads;
      for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          std::vector<Stage> one;
          one.push_back(std::move(replicas_[r]));
          status[r] = RunStep(plan_.programs, job, step, testing::RandomBatch(100 * r + step),
                              one, out[r])[0];
          replicas_[r] = std::move(one[0]);
        });
      }
      for (std::thread& t : threads) t.join();
      run.losses.emplace_back();
      run.norm_sq.push_back(0);
      for (int r = 0; r < 2; ++r) {
        EXPECT_TRUE(status[r].ok()) << job << " step " << step << ": " << status[r].error_message();
        if (!status[r].ok()) return run;
        run.losses.back().insert(run.losses.back().end(), out[r][0].losses().begin(),
                                 out[r][0].losses().end());
        run.norm_sq.back() += out[r][0].grad_norm_sq();
      }
    }
    return run;
  }
};

TEST_F(ReplicaSplitTest, CopiesSplittingTheOptimizerTrainAsAllReducingReplicas) {
  const Run whole = Train("whole", false);
  const Run split = Train("split", true);
  ASSERT_EQ(split.losses.size(), whole.losses.size());
  for (size_t step = 0; step < whole.losses.size(); ++step) {
    EXPECT_EQ(split.losses[step], whole.losses[step]) << "step " << step;
    // Each replica reports the whole (averaged) gradient's norm; each copy its pieces'.
    EXPECT_NEAR(split.norm_sq[step], whole.norm_sq[step] / 2, 1e-12 * whole.norm_sq[step]);
  }
  EXPECT_LE(split.optimizer_bytes, whole.optimizer_bytes / 2 + 8 * 16);
  EXPECT_GE(split.optimizer_bytes, whole.optimizer_bytes / 2 - 8 * 16);
}

TEST(StageFaultTest, ChunksExportAndImportWithOptimizerStateToResumeExactly) {
  std::vector<Stage> stages;
  stages.push_back(StartStage());
  stages.push_back(StartStage());
  const planner::Plan plan = MakeTestPlan(planner::ScheduleKind::kOneFOneB, 2, 1, pb::RECOMPUTE_NEVER);
  auto configure = [&](const std::string& job, uint64_t seed) {
    for (int s = 0; s < 2; ++s) {
      pb::ConfigureRequest req = ConfigureFor(plan, job, s, stages);
      req.set_seed(seed);
      pb::ConfigureResponse resp;
      grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                                  pb::ConfigureResponse* r) { return stages[s].stub->Configure(c, q, r); },
                              req, &resp);
      ASSERT_TRUE(st.ok()) << st.error_message();
    }
  };
  configure("first", testing::kSeed);
  std::vector<pb::RunStepResponse> out;
  for (int step = 0; step < 2; ++step) {
    for (const grpc::Status& st : RunStep(plan, "first", step, stages, out)) ASSERT_TRUE(st.ok());
  }
  const std::string shard0 = Export(stages[0], "first", 0), shard1 = Export(stages[1], "first", 0);
  ASSERT_FALSE(shard0.empty());

  // A fresh job with other weights takes the chunk_state and continues where the first left.
  configure("resumed", 999);
  {
    // A declared size past the largest checkpoint the chunk can have (48 GiB, as the
    // hostile-input battery sent) is refused before a byte is buffered.
    grpc::ClientContext ctx;
    pb::ImportChunkResponse resp;
    auto writer = stages[0].stub->ImportChunk(&ctx, &resp);
    pb::ChunkPiece piece;
    piece.set_job_id("resumed");
    piece.set_total_bytes(uint64_t{48} << 30);
    piece.set_data(shard0.substr(0, 100));
    writer->Write(piece);
    writer->WritesDone();
    const grpc::Status huge = writer->Finish();
    EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << huge.error_message();
    EXPECT_THAT(huge.error_message(), AllOf(HasSubstr("import of job 'resumed' chunk 0"),
                                            HasSubstr("field total_bytes 51539607552"),
                                            HasSubstr("bytes of memory")));
  }
  EXPECT_EQ(Import(stages[1], "resumed", 0, shard0).error_code(), grpc::StatusCode::INVALID_ARGUMENT)
      << "stage 0's layers do not fit stage 1";
  grpc::Status imported = Import(stages[0], "resumed", 0, shard0);
  ASSERT_TRUE(imported.ok()) << imported.error_message() << stages[0].process->stderr_text();
  ASSERT_TRUE(Import(stages[1], "resumed", 0, shard1).ok());
  for (const grpc::Status& st : RunStep(plan, "resumed", 2, stages, out)) ASSERT_TRUE(st.ok()) << st.error_message();
  double loss = 0;
  for (float l : out[1].losses()) loss += l;
  loss /= kMicroBatches;
  const testing::Reference& ref = testing::SharedReference(kSteps);
  EXPECT_EQ(loss, ref.losses[2]) << "the third step after a restore";
  for (Stage& s : stages) {
    s.process->Signal(SIGTERM);
    EXPECT_TRUE(s.process->Wait(20s).ok());
  }
}

// Over gRPC: a deferred step holds its optimizer step until ApplyOptimizer, and while
// it does, steps and exports are FAILED_PRECONDITION naming job, stage and step; a
// re-configure of the job itself (a job restarted after a lost stage) or another job
// may still take the stage, dropping the pending step.
TEST(StageFaultTest, ADeferredOptimizerStepWaitsForApplyOptimizer) {
  std::vector<Stage> stages;
  stages.push_back(StartStage());
  const planner::Plan plan = MakeTestPlan(planner::ScheduleKind::kGpipe, 1, 1, pb::RECOMPUTE_NEVER);
  auto configure = [&](const std::string& job) {
    pb::ConfigureResponse resp;
    return Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                     pb::ConfigureResponse* r) { return stages[0].stub->Configure(c, q, r); },
                 ConfigureFor(plan, job, 0, stages), &resp);
  };
  auto apply = [&](int step, pb::ApplyOptimizerResponse* resp) {
    pb::ApplyOptimizerRequest req;
    req.set_job_id("held");
    req.set_step(step);
    req.set_global_grad_norm(1.5);
    return Call3([&](grpc::ClientContext* c, const pb::ApplyOptimizerRequest& q,
                     pb::ApplyOptimizerResponse* r) { return stages[0].stub->ApplyOptimizer(c, q, r); },
                 req, resp);
  };
  auto expect_refused = [](const grpc::Status& st, const std::string& what) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    EXPECT_THAT(st.error_message(), ::testing::HasSubstr(what));
  };
  ASSERT_TRUE(configure("held").ok());
  pb::ApplyOptimizerResponse applied;
  expect_refused(apply(0, &applied), "job 'held' stage 0 step 0: no optimizer step is pending");

  std::vector<pb::RunStepResponse> out;
  for (const grpc::Status& st : RunStep(plan.programs, "held", 0, testing::RandomBatch(0), stages,
                                        out, /*defer_optimizer=*/true)) {
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  EXPECT_GT(out[0].grad_norm_sq(), 0);
  for (const pb::ActionTiming& t : out[0].timings()) {
    EXPECT_NE(t.action().kind(), pb::OPTIMIZER_STEP) << "it has not run yet";
  }
  std::vector<pb::RunStepResponse> refused;
  expect_refused(RunStep(plan, "held", 1, stages, refused)[0],
                 "step 1 of job 'held' stage 0: the optimizer step of step 0 is still pending");
  {
    grpc::ClientContext ctx;
    pb::ExportChunkRequest req;
    req.set_job_id("held");
    auto reader = stages[0].stub->ExportChunk(&ctx, req);
    pb::ChunkPiece piece;
    while (reader->Read(&piece)) {}
    expect_refused(reader->Finish(), "export of job 'held' stage 0");
  }
  expect_refused(apply(1, &applied), "step 0's is");

  grpc::Status st = apply(0, &applied);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(applied.timing().action().kind(), pb::OPTIMIZER_STEP);
  EXPECT_EQ(applied.timing().lane(), "compute");
  ASSERT_GT(out[0].timings_size(), 0);
  EXPECT_GE(applied.timing().start_us(), out[0].timings(out[0].timings_size() - 1).end_us());
  expect_refused(apply(0, &applied), "no optimizer step is pending");
  EXPECT_FALSE(Export(stages[0], "held", 0).empty());
  for (const grpc::Status& s : RunStep(plan, "held", 1, stages, out)) EXPECT_TRUE(s.ok());

  // A pending step of one job does not keep another job off the stage.
  for (const grpc::Status& s : RunStep(plan.programs, "held", 2, testing::RandomBatch(2), stages,
                                       out, /*defer_optimizer=*/true)) {
    ASSERT_TRUE(s.ok());
  }
  EXPECT_TRUE(configure("held").ok()) << "the job itself, restarted, drops its pending step";
  expect_refused(apply(2, &applied), "no optimizer step is pending");
  for (const grpc::Status& s : RunStep(plan.programs, "held", 0, testing::RandomBatch(0), stages,
                                       out, /*defer_optimizer=*/true)) {
    ASSERT_TRUE(s.ok());
  }
  EXPECT_TRUE(configure("next").ok());
  stages[0].process->Signal(SIGTERM);
  EXPECT_TRUE(stages[0].process->Wait(20s).ok());
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const Stage& stage) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(stage.address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("pipetrain.v1.Stage");
  grpc::health::v1::HealthCheckResponse resp;
  grpc::Status st = stub->Check(&ctx, req, &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return resp.status();
}

TEST(StageFaultTest, HealthIsNotServingUntilConfigured) {
  std::vector<Stage> stages;
  stages.push_back(StartStage());
  EXPECT_EQ(Health(stages[0]), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  const planner::Plan plan = MakeTestPlan(planner::ScheduleKind::kGpipe, 1, 1, pb::RECOMPUTE_NEVER);
  pb::ConfigureResponse resp;
  grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q, pb::ConfigureResponse* r) {
    return stages[0].stub->Configure(c, q, r);
  }, ConfigureFor(plan, "healthy", 0, stages), &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(Health(stages[0]), grpc::health::v1::HealthCheckResponse::SERVING);
  stages[0].process->Signal(SIGTERM);
  EXPECT_TRUE(stages[0].process->Wait(20s).ok());
}

TEST(StageFaultTest, ConfigureOverTheMemoryLimitIsRefusedBeforeAllocation) {
  Stage stage = StartStage({"--memory-limit", "100000"});
  const planner::Plan plan = MakeTestPlan(planner::ScheduleKind::kOneFOneB, 1, 1, pb::RECOMPUTE_NEVER);
  pb::ConfigureResponse resp;
  std::vector<Stage> stages;
  stages.push_back(std::move(stage));
  grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q, pb::ConfigureResponse* r) {
    return stages[0].stub->Configure(c, q, r);
  }, ConfigureFor(plan, "too-big", 0, stages), &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), AllOf(HasSubstr("needs"), HasSubstr("100000"), HasSubstr("--memory-limit")));
  // Nothing was configured: a step is refused, and stats show no job.
  pb::StageStats stats;
  st = Call3([&](grpc::ClientContext* c, const pb::GetStatsRequest& q, pb::StageStats* r) {
    return stages[0].stub->GetStats(c, q, r);
  }, pb::GetStatsRequest(), &stats);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(stats.job_id(), "");
  // Bad input changes nothing and the server keeps serving: a malformed configure.
  pb::ConfigureRequest bad = ConfigureFor(plan, "bad", 0, stages);
  bad.mutable_chunks(0)->set_end_layer(99);
  st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q, pb::ConfigureResponse* r) {
    return stages[0].stub->Configure(c, q, r);
  }, bad, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("chunks[0]"));
  stages[0].process->Signal(SIGTERM);
  EXPECT_TRUE(stages[0].process->Wait(20s).ok());
}

// Snapshots --------------------------------------------------------------------------

std::map<std::pair<int64_t, bool>, pb::SnapshotInfo> ByStepAndHeld(
    const std::vector<pb::SnapshotInfo>& list) {
  std::map<std::pair<int64_t, bool>, pb::SnapshotInfo> out;
  for (const pb::SnapshotInfo& i : list) out[{i.step(), i.held()}] = i;
  return out;
}

// Polls until `done` holds for the stage's list, or 20 s pass; returns the last list.
std::vector<pb::SnapshotInfo> WaitForSnapshots(
    coordinator::StageClient& client, const std::string& job,
    const std::function<bool(const std::vector<pb::SnapshotInfo>&)>& done) {
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  std::vector<pb::SnapshotInfo> list;
  while (std::chrono::steady_clock::now() < deadline) {
    auto got = client.ListSnapshots(job, absl::Seconds(5));
    EXPECT_TRUE(got.ok()) << got.status();
    if (got.ok()) list = *got;
    if (done(list)) break;
    std::this_thread::sleep_for(50ms);
  }
  return list;
}

grpc::Status PushSnapshot(Stage& stage, const std::string& job, const std::string& secret,
                          int owner, int64_t step, const std::string& bytes) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  pb::HoldSnapshotResponse resp;
  auto writer = stage.stub->HoldSnapshot(&ctx, &resp);
  pb::SnapshotPiece piece;
  piece.set_job_id(job);
  piece.set_peer_secret(secret);
  piece.mutable_info()->set_owner_stage(owner);
  piece.mutable_info()->set_step(step);
  piece.mutable_info()->set_bytes(bytes.size());
  piece.mutable_info()->set_held(true);
  piece.mutable_info()->set_begin_layer(0);
  piece.mutable_info()->set_end_layer(1);
  piece.mutable_info()->set_num_stages(3);
  piece.set_data(bytes);
  writer->Write(piece);
  writer->WritesDone();
  return writer->Finish();
}

TEST(StageSnapshotTest, ThreeStagesKeepTheirOwnAndTheirPredecessorsTwoNewestSteps) {
  constexpr int K = 3;
  std::vector<Stage> stages;
  for (int s = 0; s < K; ++s) stages.push_back(StartStage());
  planner::PlanOptions po;
  po.model = testing::TinyModel();
  po.stages = K;
  po.micro_batches = kMicroBatches;
  po.schedule = planner::ScheduleKind::kOneFOneB;
  po.batch_size = kBatch;
  po.snapshots = true;
  auto made = planner::MakePlan(po);
  ASSERT_TRUE(made.ok()) << made.status();
  const planner::Plan& plan = *made;
  const std::string job = "snap";
  for (int s = 0; s < K; ++s) {
    pb::ConfigureRequest req = ConfigureFor(plan, job, s, stages);
    EXPECT_EQ(req.snapshot_peer_address(), stages[(s + 1) % K].address);
    EXPECT_GT(req.snapshot_reserve_bytes(), 0u);
    req.set_recv_deadline_ms(3000);  // the stuck step below waits this long
    pb::ConfigureResponse resp;
    grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                                pb::ConfigureResponse* r) { return stages[s].stub->Configure(c, q, r); },
                            req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  std::vector<std::unique_ptr<coordinator::StageClient>> clients;
  for (const Stage& stage : stages) {
    clients.push_back(std::make_unique<coordinator::StageClient>(stage.address, common::RpcSecurity()));
  }

  // Steps 1..3 with snapshots; each stage's ExportChunk right after each step.
  std::map<std::pair<int, int64_t>, std::string> exported;  // (stage, step) -> bytes
  auto ex = [&](int s, int64_t step) -> const std::string& { return exported[{s, step}]; };
  std::vector<pb::RunStepResponse> out;
  for (int64_t step = 1; step <= 3; ++step) {
    for (const grpc::Status& st : RunStep(plan.programs, job, static_cast<int>(step),
                                          testing::RandomBatch(static_cast<int>(step)), stages, out,
                                          /*defer_optimizer=*/false, /*snapshot=*/true)) {
      ASSERT_TRUE(st.ok()) << st.error_message();
    }
    for (int s = 0; s < K; ++s) {
      EXPECT_EQ(out[s].snapshot_step(), step) << "stage " << s;
      EXPECT_GT(out[s].snapshot_bytes(), 0u) << "stage " << s;
      exported[{s, step}] = Export(stages[s], job, 0);
    }
  }

  for (int s = 0; s < K; ++s) {
    const int pred = (s + K - 1) % K;
    // The copies travel in the background: wait until the newest arrived.
    const auto list = WaitForSnapshots(*clients[s], job, [&](const auto& l) {
      return ByStepAndHeld(l).contains({3, true});
    });
    const auto by = ByStepAndHeld(list);
    ASSERT_EQ(list.size(), 4u) << "own and held, steps 2 and 3, on stage " << s;
    uint64_t total = 0;
    for (int64_t step : {2, 3}) {
      ASSERT_TRUE(by.contains({step, false}) && by.contains({step, true})) << "stage " << s;
      const pb::SnapshotInfo& own = by.at({step, false});
      const pb::SnapshotInfo& held = by.at({step, true});
      EXPECT_EQ(own.owner_stage(), s);
      EXPECT_EQ(held.owner_stage(), pred);
      EXPECT_EQ(own.begin_layer(), plan.stages[s].chunks[0].first);
      EXPECT_EQ(held.end_layer(), plan.stages[pred].chunks[0].second);
      EXPECT_EQ(held.num_stages(), K);
      EXPECT_EQ(own.bytes(), ex(s, step).size());
      total += own.bytes() + held.bytes();

      // The held copy is the owner's state at that step, AdamW's step count included.
      auto blob = clients[s]->FetchSnapshot(job, pred, 0, step, absl::Seconds(10));
      ASSERT_TRUE(blob.ok()) << blob.status();
      EXPECT_TRUE(*blob == ex(pred, step)) << "stage " << s << " step " << step;
      auto own_blob = clients[s]->FetchSnapshot(job, s, 0, step, absl::Seconds(10));
      ASSERT_TRUE(own_blob.ok()) << own_blob.status();
      EXPECT_TRUE(*own_blob == ex(s, step));
      auto ckpt = model::ParseCheckpoint(*blob, "held snapshot");
      ASSERT_TRUE(ckpt.ok()) << ckpt.status();
      ASSERT_TRUE(ckpt->optimizer.has_value());
      EXPECT_EQ(ckpt->optimizer->step, step);
      // The planner's 12 bytes per parameter: weights and the two moments.
      size_t tensor_bytes = 0;
      for (const model::ParamMap* m : {&ckpt->params, &ckpt->optimizer->m, &ckpt->optimizer->v}) {
        for (const auto& [name, t] : *m) tensor_bytes += t.num_bytes();
      }
      EXPECT_EQ(tensor_bytes, 12 * plan.stages[pred].params);
    }
    EXPECT_FALSE(ex(pred, 2) == ex(pred, 3)) << "the steps differ";
    // Step 1 was dropped.
    auto old = clients[s]->FetchSnapshot(job, pred, 0, 1, absl::Seconds(10));
    EXPECT_EQ(old.status().code(), absl::StatusCode::kNotFound) << old.status();
    pb::StageStats stats;
    ASSERT_TRUE(Call3([&](grpc::ClientContext* c, const pb::GetStatsRequest& q, pb::StageStats* r) {
                  return stages[s].stub->GetStats(c, q, r);
                }, pb::GetStatsRequest(), &stats).ok());
    EXPECT_EQ(stats.memory_used_bytes(), static_cast<uint64_t>(plan.stages[s].state_bytes) + total)
        << "GetStats counts the snapshots";
  }

  // Other jobs are not answered; pushes need the job's secret, from the predecessor.
  EXPECT_EQ(clients[0]->ListSnapshots("other", absl::Seconds(5)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  grpc::Status pushed = PushSnapshot(stages[1], job, "wrong", 0, 4, "x");
  EXPECT_EQ(pushed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << pushed.error_message();
  EXPECT_THAT(pushed.error_message(), HasSubstr("peer_secret"));
  pushed = PushSnapshot(stages[1], job, "secret-" + job, 2, 4, "x");
  EXPECT_EQ(pushed.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << pushed.error_message();
  EXPECT_THAT(pushed.error_message(), HasSubstr("stage 0's"));
  EXPECT_EQ(ByStepAndHeld(*clients[1]->ListSnapshots(job, absl::Seconds(5))).size(), 4u)
      << "refused pushes change nothing";

  // Stage 2 dies; stage 0 runs step 4 alone and waits for stage 1's gradients (up to
  // 3 s): both survivors still list what they hold while that step is stuck.
  stages[2].process->Signal(SIGKILL);
  ASSERT_TRUE(stages[2].process->Wait(20s).ok());
  std::thread stuck([&] {
    pb::RunStepRequest req;
    req.set_job_id(job);
    req.set_step(4);
    req.set_snapshot(true);
    *req.mutable_program() = schedule::ToProto(plan.programs[0]);
    const model::TokenBatch batch = testing::RandomBatch(4);
    for (int mb = 0; mb < kMicroBatches; ++mb) {
      common::TensorToProto(testing::Rows(batch.inputs, mb, kBatch / kMicroBatches), req.add_tokens());
    }
    pb::RunStepResponse resp;
    grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::RunStepRequest& q,
                                pb::RunStepResponse* r) { return stages[0].stub->RunStep(c, q, r); },
                            req, &resp);
    EXPECT_FALSE(st.ok()) << "no gradient comes back";
  });
  std::this_thread::sleep_for(500ms);
  for (int s : {0, 1}) {
    const auto start = std::chrono::steady_clock::now();
    auto list = clients[s]->ListSnapshots(job, absl::Seconds(2));
    ASSERT_TRUE(list.ok()) << list.status();
    EXPECT_EQ(list->size(), 4u);
    auto blob = clients[s]->FetchSnapshot(job, (s + K - 1) % K, 0, 3, absl::Seconds(2));
    ASSERT_TRUE(blob.ok()) << blob.status();
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1500ms) << "did not wait for the step";
  }
  stuck.join();

  // A Configure of the job again drops its snapshots.
  pb::ConfigureResponse cresp;
  grpc::Status st = Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                              pb::ConfigureResponse* r) { return stages[1].stub->Configure(c, q, r); },
                          ConfigureFor(plan, job, 1, stages), &cresp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  auto after = clients[1]->ListSnapshots(job, absl::Seconds(5));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->empty());
  for (int s : {0, 1}) {
    stages[s].process->Signal(SIGTERM);
    EXPECT_TRUE(stages[s].process->Wait(20s).ok());
  }
}

// One stage: the snapshot reserve counts against --memory-limit at Configure, and a
// deferred step's snapshot is taken at ApplyOptimizer, kept here only (no peer).
TEST(StageSnapshotTest, TheReserveCountsAgainstTheMemoryLimitAndADeferredStepSnapshotsAtApply) {
  planner::PlanOptions po;
  po.model = testing::TinyModel();
  po.micro_batches = kMicroBatches;
  po.schedule = planner::ScheduleKind::kGpipe;
  po.batch_size = kBatch;
  po.snapshots = true;
  auto made = planner::MakePlan(po);
  ASSERT_TRUE(made.ok()) << made.status();
  const planner::Plan& plan = *made;
  const uint64_t state = static_cast<uint64_t>(plan.stages[0].state_bytes);
  const uint64_t reserve = static_cast<uint64_t>(plan.stages[0].snapshot_bytes);
  // The one stage holds every layer; its micro-batch buffers count too.
  const uint64_t buffers = stage_server::BackendChunk::BufferBytes(
      po.model, 0, po.model.num_pipeline_layers(), kBatch / kMicroBatches);
  std::vector<Stage> stages;
  stages.push_back(StartStage({"--memory-limit", absl::StrCat(state + reserve + buffers)}));
  auto configure = [&](uint64_t with_reserve) {
    pb::ConfigureRequest req = ConfigureFor(plan, "solo", 0, stages);
    EXPECT_EQ(req.snapshot_peer_address(), "") << "one stage has no peer";
    EXPECT_EQ(req.snapshot_reserve_bytes(), reserve);
    req.set_snapshot_reserve_bytes(with_reserve);
    pb::ConfigureResponse resp;
    return Call3([&](grpc::ClientContext* c, const pb::ConfigureRequest& q,
                     pb::ConfigureResponse* r) { return stages[0].stub->Configure(c, q, r); },
                 req, &resp);
  };
  grpc::Status st = configure(reserve + 1);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_THAT(st.error_message(), AllOf(HasSubstr(absl::StrCat(reserve + 1)),
                                        HasSubstr("snapshot_reserve_bytes"),
                                        HasSubstr("--memory-limit")));
  st = configure(reserve);
  ASSERT_TRUE(st.ok()) << st.error_message();

  std::vector<pb::RunStepResponse> out;
  for (const grpc::Status& s : RunStep(plan.programs, "solo", 1, testing::RandomBatch(1), stages, out,
                                       /*defer_optimizer=*/true, /*snapshot=*/true)) {
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  EXPECT_EQ(out[0].snapshot_step(), 0) << "not before the optimizer step is applied";
  EXPECT_EQ(out[0].snapshot_bytes(), 0u);
  pb::ApplyOptimizerRequest apply;
  apply.set_job_id("solo");
  apply.set_step(1);
  apply.set_global_grad_norm(1.0);
  pb::ApplyOptimizerResponse applied;
  st = Call3([&](grpc::ClientContext* c, const pb::ApplyOptimizerRequest& q,
                 pb::ApplyOptimizerResponse* r) { return stages[0].stub->ApplyOptimizer(c, q, r); },
             apply, &applied);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(applied.snapshot_step(), 1);
  const std::string exported = Export(stages[0], "solo", 0);
  EXPECT_EQ(applied.snapshot_bytes(), exported.size());
  coordinator::StageClient client(stages[0].address, common::RpcSecurity());
  auto list = client.ListSnapshots("solo", absl::Seconds(5));
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_FALSE((*list)[0].held());
  auto blob = client.FetchSnapshot("solo", 0, 0, 1, absl::Seconds(5));
  ASSERT_TRUE(blob.ok()) << blob.status();
  EXPECT_TRUE(*blob == exported);
  stages[0].process->Signal(SIGTERM);
  EXPECT_TRUE(stages[0].process->Wait(20s).ok());
}

}  // namespace
}  // namespace pipetrain
