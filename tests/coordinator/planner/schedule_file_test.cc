// pipeline.schedule_file: a hand-written schedule is planned exactly as the generated
// one it copies, and every kind of fault is refused before anything runs, naming the
// stage and the action and showing the validator's table.
#include "coordinator/planner/schedule_file.h"

#include <string>

#include "absl/strings/str_replace.h"
#include "common/schedule/validator.h"
#include "common/testing/status_matchers.h"
#include "coordinator/planner/generators.h"
#include "coordinator/planner/lowering.h"
#include "coordinator/planner/planner.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::planner {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace pb = ::pipetrain::v1;

std::string Text(ScheduleKind kind, int k, int m, int v) {
  return schedule::ToText(*Generate(kind, k, m, v));
}

pb::JobSpec Spec(int k, int m) {
  pb::JobSpec spec;
  pb::ModelConfig* model = spec.mutable_model();
  model->set_vocab_size(64);
  model->set_seq_len(16);
  model->set_d_model(32);
  model->set_n_heads(4);
  model->set_n_layers(6);
  spec.mutable_pipeline()->set_stages(k);
  spec.mutable_pipeline()->set_micro_batches(m);
  spec.mutable_training()->set_batch_size(2 * m);
  spec.mutable_training()->set_steps(1);
  return spec;
}

// The file form of every schedule of the table plans to the same programs, placement
// and memory as the schedule itself: a file runs like a generated schedule.
TEST(ScheduleFileTest, AGeneratedScheduleWrittenToAFilePlansTheSame) {
  for (const ScheduleEntry& e : ScheduleTable()) {
    const ScheduleKind kind = *ParseScheduleKind(e.name);
    const int k = 2, m = 4, v = e.chunked ? 2 : 1;
    SCOPED_TRACE(e.name);
    pb::JobSpec named = Spec(k, m), file = Spec(k, m);
    named.mutable_pipeline()->set_schedule(e.name);
    named.mutable_pipeline()->set_chunks(v);
    file.mutable_pipeline()->set_schedule_file("mine.txt");
    file.mutable_pipeline()->set_schedule_program(Text(kind, k, m, v));
    absl::StatusOr<PlanOptions> a = OptionsFromJobSpec(named), b = OptionsFromJobSpec(file);
    ASSERT_THAT(a.status(), IsOk());
    ASSERT_THAT(b.status(), IsOk());
    EXPECT_EQ(b->chunks, v);  // from the file's header
    absl::StatusOr<Plan> pa = MakePlan(*a), pb_ = MakePlan(*b);
    ASSERT_THAT(pa.status(), IsOk());
    ASSERT_THAT(pb_.status(), IsOk());
    EXPECT_EQ(pa->programs, pb_->programs);
    EXPECT_EQ(pa->topology().placement, pb_->topology().placement);
    EXPECT_EQ(pa->simulation.step_time_s, pb_->simulation.step_time_s);
    for (int s = 0; s < k; ++s) {
      EXPECT_EQ(pa->stages[s].chunks, pb_->stages[s].chunks);
      EXPECT_EQ(pa->stages[s].peak_activation_bytes, pb_->stages[s].peak_activation_bytes);
    }
    EXPECT_EQ(ScheduleLabel(*b), absl::StrCat(e.name, " (pipeline.schedule_file)"));
  }
}

// 1F1B at K = 2, M = 2 written by hand, with one fault each.
constexpr char kGood[] =
    "schedule mine stages 2 micro_batches 2 chunks 1\n"
    "stage 0 max_in_flight 2: F0 F1 B0 B1 OPT\n"
    "stage 1 max_in_flight 1: F0 B0 F1 B1 OPT\n";

std::string With(const std::string& from, const std::string& to) {
  return absl::StrReplaceAll(kGood, {{from, to}});
}

TEST(ScheduleFileTest, AGoodFileIsAccepted) {
  EXPECT_THAT(ParseScheduleFile(kGood, 2, 2, 1).status(), IsOk());
}

TEST(ScheduleFileTest, FaultsAreRefusedNamingTheStageAndTheAction) {
  struct Case {
    std::string text;
    std::vector<std::string> says;
  };
  const Case cases[] = {
      // A backward before its forward, with the table and the cell marked.
      {With("stage 1 max_in_flight 1: F0 B0", "stage 1 max_in_flight 1: B0 F0"),
       {"stage 1 position 0 (B0)", "[B0]", "position"}},
      // A micro-batch's forward twice.
      {With("F0 F1 B0 B1", "F0 F0 B0 B1"), {"stage 0 position 1 (F0)", "duplicate forward"}},
      // A backward missing.
      {With("F1 B1 OPT\n", "F1 OPT\n"), {"stage 1", "missing backward B1"}},
      // Stage 0 waits for B0's gradient before sending F1, stage 1 for F1 before it
      // runs B0: a deadlock.
      {"schedule mine stages 2 micro_batches 2 chunks 1\n"
       "stage 0 max_in_flight 2: F0 B0 F1 B1 OPT\n"
       "stage 1 max_in_flight 2: F0 F1 B0 B1 OPT\n",
       {"deadlock", "waits for stage"}},
      // More activations than the stage declares.
      {With("stage 0 max_in_flight 2", "stage 0 max_in_flight 1"),
       {"stage 0 position 1 (F1)", "above this stage's bound of 1"}},
      // A bound not declared.
      {With("stage 0 max_in_flight 2", "stage 0 max_in_flight 0"),
       {"stage 0 declares no memory bound"}},
      // Sends written by hand.
      {With("F0 F1 B0", "F0 SEND_F0 F1 B0"), {"stage 0 position 1 (SEND_F0)", "compute actions only"}},
      // No optimizer step.
      {With("F1 B1 OPT\n", "F1 B1\n"), {"stage 1 does not end with OPT"}},
      // A stage missing.
      {"schedule mine stages 2 micro_batches 2 chunks 1\nstage 0 max_in_flight 2: F0 F1 B0 B1 OPT\n",
       {"1 stage programs for 2 stages"}},
      // Not the job's shape.
      {With("micro_batches 2", "micro_batches 3"), {"the file is for 3 where pipeline.micro_batches is 2"}},
      // Not the text form.
      {"stage 0: F0\n", {"line 1"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<schedule::Schedule> s = ParseScheduleFile(c.text, 2, 2, 1);
    ASSERT_THAT(s.status(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     HasSubstr("pipeline.schedule_file: ")));
    for (const std::string& say : c.says) EXPECT_THAT(s.status().message(), HasSubstr(say));
  }
}

TEST(ScheduleFileTest, TheSpecGivesOneScheduleAndTheCoordinatorReadsNoPath) {
  pb::JobSpec both = Spec(2, 2);
  both.mutable_pipeline()->set_schedule("1f1b");
  both.mutable_pipeline()->set_schedule_file("mine.txt");
  both.mutable_pipeline()->set_schedule_program(kGood);
  EXPECT_THAT(OptionsFromJobSpec(both).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("pipeline.schedule and pipeline.schedule_file: give one")));
  pb::JobSpec unread = Spec(2, 2);
  unread.mutable_pipeline()->set_schedule_file("mine.txt");
  EXPECT_THAT(OptionsFromJobSpec(unread).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("pipeline.schedule_file: 'mine.txt' was not read"),
                             HasSubstr("pipetrain submit"))));
  // A K the file was not written for.
  pb::JobSpec other = Spec(4, 2);
  other.mutable_pipeline()->set_schedule_file("mine.txt");
  other.mutable_pipeline()->set_schedule_program(kGood);
  EXPECT_THAT(OptionsFromJobSpec(other).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("the file is for 2 where pipeline.stages is 4")));
}

}  // namespace
}  // namespace pipetrain::planner
