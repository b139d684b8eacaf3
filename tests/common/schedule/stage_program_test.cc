#include "common/schedule/stage_program.h"

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::schedule {
namespace {

using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

Schedule TwoStages() {
  StageProgram a{0, 2, 2, 2, "interleaved", {}, 3};
  a.actions = {Forward(0), {ActionKind::kSendActivation, 0, 0}, Forward(1, 1), OptimizerStep()};
  StageProgram b{1, 2, 2, 2, "interleaved", {}, 1};
  b.actions = {{ActionKind::kRecvActivation, 0, 0}, BackwardInput(1), BackwardWeight(1, 1)};
  return {a, b};
}

TEST(StageProgramTest, ProtoRoundTrip) {
  for (const StageProgram& p : TwoStages()) {
    pipetrain::v1::StageProgram proto = ToProto(p);
    EXPECT_EQ(proto.actions_size(), static_cast<int>(p.actions.size()));
    auto back = FromProto(proto);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, p);
  }
}

TEST(StageProgramTest, FromProtoRejectsUnknownKindsNamingTheAction) {
  pipetrain::v1::StageProgram proto = ToProto(TwoStages()[0]);
  proto.mutable_actions(2)->set_kind(pipetrain::v1::ACTION_KIND_UNSPECIFIED);
  EXPECT_THAT(FromProto(proto),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("actions[2].kind")));
}

TEST(StageProgramTest, ActionFromProtoRoundTripsAndNamesItsField) {
  const Action a{ActionKind::kSendGradient, 3, 1};
  auto back = ActionFromProto(ActionToProto(a));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, a);
  pipetrain::v1::Action bad;
  EXPECT_THAT(ActionFromProto(bad, "events[4].action"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("events[4].action.kind")));
}

TEST(StageProgramTest, FromProtoTreatsZeroChunksAsOne) {
  pipetrain::v1::StageProgram proto;
  proto.set_num_stages(1);
  proto.set_num_micro_batches(1);
  auto p = FromProto(proto);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->num_chunks, 1);
}

TEST(StageProgramTest, TextRoundTrip) {
  const Schedule s = TwoStages();
  const std::string text = ToText(s);
  EXPECT_EQ(text,
            "schedule interleaved stages 2 micro_batches 2 chunks 2\n"
            "stage 0 max_in_flight 3: F0 SEND_F0 F1@1 OPT\n"
            "stage 1 max_in_flight 1: RECV_F0 I1 W1@1\n");
  auto back = ParseScheduleText("# a comment\n\n" + text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, s);
}

TEST(StageProgramTest, ForwardOnlyRoundTripsThroughProtoAndText) {
  StageProgram p{0, 2, 1, 1, "eval", {Forward(0), {ActionKind::kSendActivation, 0, 0}}, 1};
  p.forward_only = true;
  EXPECT_TRUE(ToProto(p).forward_only());
  auto back = FromProto(ToProto(p));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, p);
  StageProgram q{1, 2, 1, 1, "eval", {{ActionKind::kRecvActivation, 0, 0}, Forward(0)}, 1};
  q.forward_only = true;
  const std::string text = ToText({p, q});
  EXPECT_EQ(text,
            "schedule eval stages 2 micro_batches 1 chunks 1 forward_only\n"
            "stage 0 max_in_flight 1: F0 SEND_F0\n"
            "stage 1 max_in_flight 1: RECV_F0 F0\n");
  auto parsed = ParseScheduleText(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, (Schedule{p, q}));
  // Training schedules keep their eight-word header; a stray ninth word is an error.
  EXPECT_THAT(ToText(TwoStages()), ::testing::Not(HasSubstr("forward_only")));
  EXPECT_THAT(ParseScheduleText("schedule x stages 1 micro_batches 1 chunks 1 backward_only\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
}

TEST(StageProgramTest, TextErrorsNameTheLine) {
  EXPECT_THAT(ParseScheduleText(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseScheduleText("schedule x stages 2\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
  // A header without programs (tests/fuzz/corpus/schedule/header_only: the rest of
  // the text a comment) would parse to an empty schedule that prints back as "".
  EXPECT_THAT(ParseScheduleText("schedule gpipe stages 2 micro_batches 3 chunks 1\n"
                                "# stage 0 max_in_flight 3: F0 SEND_F0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no 'stage S")));
  // chunks 0 (tests/fuzz/corpus/schedule/chunks_zero) read back from the proto form
  // as 1, where proto3's 0 means unset; the text form has no unset.
  for (const char* header : {"schedule x stages 2 micro_batches 3 chunks 0\n",
                             "schedule x stages 0 micro_batches 3 chunks 1\n",
                             "schedule x stages 2 micro_batches -1 chunks 1\n"}) {
    EXPECT_THAT(ParseScheduleText(std::string(header) + "stage 0 max_in_flight 1: F0\n"),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr("line 1: "), HasSubstr("must be >= 1"))))
        << header;
  }
  // stage -2 (tests/fuzz/corpus/schedule/negative_stage) cannot go into the proto form,
  // whose numbers are unsigned; nor can a negative max_in_flight.
  for (const char* line : {"stage -2 max_in_flight 2: F0\n", "stage 0 max_in_flight -1: F0\n"}) {
    EXPECT_THAT(
        ParseScheduleText(std::string("schedule x stages 2 micro_batches 1 chunks 1\n") + line),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr("line 2: "), HasSubstr("must be >= 0"))))
        << line;
  }
  EXPECT_THAT(ParseScheduleText("schedule x stages 1 micro_batches 1 chunks 1\nstage 0: F0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
  EXPECT_THAT(ParseScheduleText(
                  "schedule x stages 1 micro_batches 1 chunks 1\nstage 0 max_in_flight 1: F0 Z0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2: action 'Z0'")));
}

TEST(StageProgramTest, LoopedChunksWrapFromTheLastStageToTheFirst) {
  const Topology t{4, 2, Placement::kLooped};
  EXPECT_EQ(t.Virtual(3, 0), 3);
  EXPECT_EQ(t.Virtual(0, 1), 4);
  EXPECT_EQ(t.StageOf(4), 0);
  EXPECT_EQ(t.ChunkOf(4), 1);
  EXPECT_EQ(t.StageOf(7), 3);
  EXPECT_EQ(t.HeadStage(), 3);
  EXPECT_EQ(t.HopAfter(2), Hop::kNext);
  EXPECT_EQ(t.HopAfter(3), Hop::kNext);  // around the ring, 3 -> 0
  for (int s = 0; s < 4; ++s) {
    EXPECT_TRUE(LinkNeeds(t, s, false).next) << s;
    EXPECT_TRUE(LinkNeeds(t, s, false).prev) << s;
  }
}

TEST(StageProgramTest, VChunksTurnOnTheLastStageAndEndOnTheFirst) {
  const Topology t{4, 2, Placement::kV};
  // Stage s holds virtual stages s and 7 - s.
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(t.Virtual(s, 0), s);
    EXPECT_EQ(t.Virtual(s, 1), 7 - s);
    EXPECT_EQ(t.StageOf(7 - s), s);
    EXPECT_EQ(t.ChunkOf(7 - s), 1);
  }
  EXPECT_EQ(t.HeadStage(), 0);
  EXPECT_EQ(t.HeadChunk(), 1);
  EXPECT_EQ(t.HopAfter(0), Hop::kNext);
  EXPECT_EQ(t.HopAfter(3), Hop::kSelf);  // stage 3's chunk 0 to its chunk 1
  EXPECT_EQ(t.HopAfter(4), Hop::kPrev);  // stage 3 back to stage 2
  // No ring: the first stage has no upstream link and the last no downstream one,
  // and tied embeddings (both ends on stage 0) add none.
  EXPECT_FALSE(LinkNeeds(t, 0, true).prev);
  EXPECT_TRUE(LinkNeeds(t, 0, true).next);
  EXPECT_FALSE(LinkNeeds(t, 3, true).next);
  EXPECT_TRUE(LinkNeeds(t, 3, true).prev);
  // With looped chunks the tied embedding needs the ring between stage 0 and K-1.
  const Topology plain{4, 1, Placement::kLooped};
  EXPECT_FALSE(LinkNeeds(plain, 0, false).prev);
  EXPECT_TRUE(LinkNeeds(plain, 0, true).prev);
  EXPECT_TRUE(LinkNeeds(plain, 3, true).next);
}

TEST(StageProgramTest, PlacementTravelsInTheTextAndProtoForms) {
  const std::string text =
      "schedule zb-v stages 2 micro_batches 1 chunks 2 placement v\n"
      "stage 0 max_in_flight 2: F0 F0@1 I0@1 I0 W0@1 W0 OPT\n";
  absl::StatusOr<Schedule> s = ParseScheduleText(text);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)[0].placement, Placement::kV);
  EXPECT_EQ(ToText(*s), text);
  absl::StatusOr<StageProgram> back = FromProto(ToProto((*s)[0]));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, (*s)[0]);
  // Looped, the default, is not written; a placement no one knows is refused by name.
  EXPECT_THAT(ParseScheduleText("schedule x stages 1 micro_batches 1 chunks 1 placement w\n"
                                "stage 0 max_in_flight 1: F0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown placement 'w'")));
  EXPECT_THAT(ParseScheduleText("schedule x stages 1 micro_batches 1 chunks 1 forward_only v\n"
                                "stage 0 max_in_flight 1: F0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
  absl::StatusOr<Schedule> eval = ParseScheduleText(
      "schedule e stages 1 micro_batches 1 chunks 2 placement v forward_only\n"
      "stage 0 max_in_flight 1: F0 F0@1\n");
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_TRUE((*eval)[0].forward_only);
  EXPECT_EQ((*eval)[0].placement, Placement::kV);
}

}  // namespace
}  // namespace pipetrain::schedule
