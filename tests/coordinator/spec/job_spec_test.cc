#include "coordinator/spec/job_spec.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/escaping.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

std::string ReadExample() {
  std::ifstream in(std::string(PIPETRAIN_EXAMPLES_DIR) + "/tiny-gpt.json");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

pb::JobSpec Example() {
  auto spec = ParseJobSpec(ReadExample());
  EXPECT_THAT(spec, IsOk());
  return WithDefaults(*spec);
}

TEST(JobSpecTest, ExampleParsesAndValidates) {
  auto spec = ParseJobSpec(ReadExample());
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->name(), "tiny-gpt on the King James Bible");
  EXPECT_EQ(spec->model().n_layers(), 4);
  EXPECT_EQ(spec->pipeline().stages(), 4);
  EXPECT_EQ(spec->pipeline().schedule(), "1f1b");
  EXPECT_FLOAT_EQ(spec->training().lr(), 0.003f);
  EXPECT_TRUE(spec->data().has_validation_fraction());
  EXPECT_EQ(spec->checkpoint().every_steps(), 100);
  EXPECT_THAT(ValidateJobSpec(WithDefaults(*spec)), IsOk());
}

TEST(JobSpecTest, AcceptsLowerCamelNames) {
  auto spec = ParseJobSpec(R"({"pipeline": {"microBatches": 3}, "initFrom": "ckpt"})");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->pipeline().micro_batches(), 3);
  EXPECT_EQ(spec->init_from(), "ckpt");
}

TEST(JobSpecTest, NamesEveryUnknownFieldByPath) {
  auto spec = ParseJobSpec(
      R"({"nmae": "x", "pipeline": {"stagse": 4, "micro_batches": 2},
          "training": {"lr": 0.1, "momentum": 0.9}})");
  EXPECT_THAT(spec, StatusIs(kInvalid, AllOf(HasSubstr("unknown field 'nmae'"),
                                             HasSubstr("did you mean 'name'?"),
                                             HasSubstr("unknown field 'pipeline.stagse' (known: "
                                                       "stages, micro_batches, schedule"),
                                             HasSubstr("did you mean 'stages'?"),
                                             HasSubstr("unknown field 'training.momentum'"))));
}

TEST(JobSpecTest, TypeErrorsNameTheField) {
  EXPECT_THAT(ParseJobSpec(R"({"pipeline": {"stages": "four"}})"),
              StatusIs(kInvalid, HasSubstr("pipeline.stages: expected a whole number, got "
                                           "string \"four\"")));
  EXPECT_THAT(ParseJobSpec(R"({"name": 42, "training": {"lr": true}})"),
              StatusIs(kInvalid, AllOf(HasSubstr("name: expected a string"),
                                       HasSubstr("training.lr: expected a number"))));
  EXPECT_THAT(ParseJobSpec(R"({"model": 3})"),
              StatusIs(kInvalid, HasSubstr("model: expected an object")));
  // Quoted numbers are the proto JSON mapping's form for 64-bit integers.
  EXPECT_THAT(ParseJobSpec(R"({"training": {"seed": "7"}})"), IsOk());
  EXPECT_THAT(ParseJobSpec(R"({"pipeline": {"stages": 2.5}})"),
              StatusIs(kInvalid, HasSubstr("pipeline.stages: expected a whole number")));
  EXPECT_THAT(ParseJobSpec(R"({"training": {"seed": -1}})"),
              StatusIs(kInvalid, HasSubstr("training.seed: expected a whole number >= 0")));
  // Out of range is left to protobuf; its message is reworded to start with the field.
  EXPECT_THAT(ParseJobSpec(R"({"pipeline": {"stages": 1e20}})"),
              StatusIs(kInvalid, HasSubstr("pipeline.stages: invalid value")));
}

TEST(JobSpecTest, MalformedJsonSaysWhere) {
  EXPECT_THAT(ParseJobSpec("{\n  \"name\": \"x\",\n  oops\n}"),
              StatusIs(kInvalid, AllOf(HasSubstr("malformed JSON at line 3"),
                                       HasSubstr("(byte "))));
  EXPECT_THAT(ParseJobSpec("[1, 2]"), StatusIs(kInvalid, HasSubstr("one JSON object")));
  EXPECT_THAT(ParseJobSpec(" \n"), StatusIs(kInvalid, HasSubstr("the job spec is empty")));
}

TEST(JobSpecTest, OverridesSetNumbersStringsAndCreateObjects) {
  auto text = ApplyOverrides(R"({"pipeline": {"stages": 4}, "name": "a"})",
                             {"pipeline.stages=2", "pipeline.schedule=gpipe",
                              "training.lr=0.5", "checkpoint.every_steps=7", "name=2024",
                              "data.corpus=\"quoted.txt\"", "pipeline.recompute=always"});
  ASSERT_THAT(text, IsOk());
  auto spec = ParseJobSpec(*text);
  ASSERT_THAT(spec, IsOk()) << *text;
  EXPECT_EQ(spec->pipeline().stages(), 2);
  EXPECT_EQ(spec->pipeline().schedule(), "gpipe");
  EXPECT_EQ(spec->pipeline().recompute(), "always");
  EXPECT_FLOAT_EQ(spec->training().lr(), 0.5f);
  EXPECT_EQ(spec->checkpoint().every_steps(), 7);
  EXPECT_EQ(spec->name(), "2024");  // a string field keeps the text as typed
  EXPECT_EQ(spec->data().corpus(), "quoted.txt");
}

TEST(JobSpecTest, OverrideErrorsNameTheOverride) {
  EXPECT_THAT(ApplyOverrides("{}", {"pipeline.stages"}),
              StatusIs(kInvalid, AllOf(HasSubstr("--set 'pipeline.stages'"),
                                       HasSubstr("no '='"))));
  EXPECT_THAT(ApplyOverrides("{}", {"pipeline..stages=2"}),
              StatusIs(kInvalid, HasSubstr("not a field path")));
  EXPECT_THAT(ApplyOverrides(R"({"training": {"lr": 0.1}})", {"training.lr.x=1"}),
              StatusIs(kInvalid, HasSubstr("training.lr is a number, not an object")));
  EXPECT_THAT(ApplyOverrides("{oops", {"a=1"}), StatusIs(kInvalid, HasSubstr("malformed JSON")));
}

// Found by tests/fuzz/job_spec_fuzz: bytes that are not UTF-8 in a value or a field
// path made the JSON writer throw (std::terminate in the CLI). Now a status.
TEST(JobSpecTest, OverrideThatIsNotUtf8IsRefused) {
  for (const std::string& bad : {std::string("data.corpus=kjv\xff.txt"),
                                std::string("d_m\xef" "del=1"), std::string("name=\xc0\xaf"),
                                std::string("name=\xed\xa0\x80"), std::string("name=\xe2\x82")}) {
    EXPECT_THAT(ApplyOverrides("{}", {bad}),
                StatusIs(kInvalid, AllOf(HasSubstr("--set '"), HasSubstr("not valid UTF-8"))))
        << absl::CHexEscape(bad);
  }
  // Well-formed multi-byte text is kept as typed.
  auto text = ApplyOverrides("{}", {"name=caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"});
  ASSERT_THAT(text, IsOk());
  auto spec = ParseJobSpec(*text);
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->name(), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
}

TEST(JobSpecTest, OverrideIntoUnknownFieldIsReportedByTheParse) {
  auto text = ApplyOverrides("{}", {"pipeline.stagse=2"});
  ASSERT_THAT(text, IsOk());
  EXPECT_THAT(ParseJobSpec(*text), StatusIs(kInvalid, HasSubstr("'pipeline.stagse'")));
}

TEST(JobSpecTest, DefaultsFillOnlyWhatIsUnset) {
  pb::JobSpec spec;
  spec.mutable_pipeline()->set_stages(3);
  spec.mutable_data()->set_corpus("/data/books/kjv.txt");
  pb::JobSpec d = WithDefaults(spec);
  EXPECT_EQ(d.pipeline().schedule(), "1f1b");
  EXPECT_EQ(d.pipeline().chunks(), 1);
  EXPECT_EQ(d.pipeline().recompute(), "never");
  EXPECT_EQ(d.pipeline().micro_batches(), 3);
  EXPECT_EQ(d.pipeline().replicas(), 1);
  EXPECT_EQ(d.checkpoint().snapshot_every_steps(), 1);
  EXPECT_EQ(d.fault_tolerance().max_restarts(), 3);
  EXPECT_EQ(d.fault_tolerance().wait_for_stages_s(), 60);
  // An explicit 0 is kept: no restarts, no snapshots.
  spec.mutable_fault_tolerance()->set_max_restarts(0);
  spec.mutable_checkpoint()->set_snapshot_every_steps(0);
  EXPECT_EQ(WithDefaults(spec).fault_tolerance().max_restarts(), 0);
  EXPECT_EQ(WithDefaults(spec).checkpoint().snapshot_every_steps(), 0);
  EXPECT_FLOAT_EQ(d.training().beta1(), 0.9f);
  EXPECT_FLOAT_EQ(d.training().beta2(), 0.95f);
  EXPECT_FLOAT_EQ(d.training().weight_decay(), 0.1f);
  EXPECT_FLOAT_EQ(d.data().validation_fraction(), 0.05f);
  EXPECT_EQ(d.name(), "kjv.txt");

  spec.mutable_pipeline()->set_schedule("interleaved");
  spec.mutable_training()->set_weight_decay(0);  // explicit 0 stays 0
  spec.mutable_data()->set_validation_fraction(0);
  spec.set_name("mine");
  spec.mutable_pipeline()->set_replicas(4);
  d = WithDefaults(spec);
  EXPECT_EQ(d.pipeline().chunks(), 2);
  EXPECT_EQ(d.pipeline().replicas(), 4);
  EXPECT_FLOAT_EQ(d.training().weight_decay(), 0);
  EXPECT_FLOAT_EQ(d.data().validation_fraction(), 0);
  EXPECT_EQ(d.name(), "mine");
}

// Token files instead of the example's corpus.
void UseTokens(pb::JobSpec& s) {
  s.mutable_data()->clear_corpus();
  s.mutable_data()->add_tokens("/data/fineweb_train_*.bin");
  s.mutable_data()->set_format("llmc");
}

TEST(JobSpecTest, TokensAreOnePathOrAList) {
  auto one = ParseJobSpec(R"({"data": {"tokens": "a.bin", "validation_tokens": "val.bin"}})");
  ASSERT_THAT(one, IsOk());
  EXPECT_THAT(one->data().tokens(), ::testing::ElementsAre("a.bin"));
  EXPECT_THAT(one->data().validation_tokens(), ::testing::ElementsAre("val.bin"));
  auto many = ParseJobSpec(
      R"({"data": {"tokens": ["data/train_*.bin", "extra.bin"], "format": "nanogpt"}})");
  ASSERT_THAT(many, IsOk());
  EXPECT_THAT(many->data().tokens(), ::testing::ElementsAre("data/train_*.bin", "extra.bin"));
  EXPECT_EQ(many->data().format(), "nanogpt");
  EXPECT_THAT(ParseJobSpec(R"({"data": {"tokens": 3}})"),
              StatusIs(kInvalid, HasSubstr("data.tokens: expected a list")));
  EXPECT_THAT(ParseJobSpec(R"({"data": {"tokens": ["a.bin", 2]}})"),
              StatusIs(kInvalid, HasSubstr("data.tokens[1]: expected a string")));
}

// `json` with `sets` applied, parsed (an empty spec, with a failure, if either fails).
pb::JobSpec Overridden(absl::string_view json, const std::vector<std::string>& sets) {
  auto text = ApplyOverrides(json, sets);
  EXPECT_THAT(text, IsOk());
  absl::StatusOr<pb::JobSpec> spec =
      text.ok() ? ParseJobSpec(*text) : absl::StatusOr<pb::JobSpec>(text.status());
  EXPECT_THAT(spec, IsOk()) << (text.ok() ? *text : "");
  return spec.ok() ? *spec : pb::JobSpec();
}

TEST(JobSpecTest, SetTakesOneTokenFileOrAList) {
  pb::JobSpec spec = Overridden(R"({"data": {"corpus": "kjv.txt"}})",
                                {"data.corpus=\"\"", "data.tokens=/data/train_*.bin"});
  EXPECT_EQ(spec.data().corpus(), "");
  EXPECT_THAT(spec.data().tokens(), ::testing::ElementsAre("/data/train_*.bin"));
  spec = Overridden("{}", {R"(data.tokens=["a.bin","b.bin"])", "data.validation_tokens=v.bin"});
  EXPECT_THAT(spec.data().tokens(), ::testing::ElementsAre("a.bin", "b.bin"));
  EXPECT_THAT(spec.data().validation_tokens(), ::testing::ElementsAre("v.bin"));
}

TEST(JobSpecTest, TokenDataDefaultsAndValidates) {
  pb::JobSpec spec = Example();
  spec.clear_name();
  spec.mutable_data()->clear_validation_fraction();
  spec.mutable_data()->clear_corpus();
  spec.mutable_data()->add_tokens("/data/fineweb_train_*.bin");
  pb::JobSpec d = WithDefaults(spec);
  EXPECT_EQ(d.data().format(), "llmc");
  EXPECT_EQ(d.name(), "fineweb_train_*.bin");
  EXPECT_FLOAT_EQ(d.data().validation_fraction(), 0.05f);
  EXPECT_THAT(ValidateJobSpec(d), IsOk());
  // With validation files nothing of the training stream is held out.
  spec.mutable_data()->add_validation_tokens("/data/fineweb_val_000000.bin");
  spec.mutable_data()->set_format("nanogpt");
  d = WithDefaults(spec);
  EXPECT_FALSE(d.data().has_validation_fraction());
  EXPECT_EQ(d.data().format(), "nanogpt");
  EXPECT_THAT(ValidateJobSpec(d), IsOk());
  // A text keeps no format.
  EXPECT_EQ(Example().data().format(), "");
}

// The example with a cosine decay to `min_lr`.
void Decaying(pb::JobSpec& s, float min_lr) {
  s.mutable_training()->set_lr_schedule("cosine");
  s.mutable_training()->set_min_lr(min_lr);
}

struct Rule {
  std::string name;
  std::function<void(pb::JobSpec&)> mutate;
  std::string expected;  // part of the message, naming the field
};

TEST(JobSpecTest, EveryValidationRuleNamesItsField) {
  const std::vector<Rule> rules = {
      {"model missing", [](pb::JobSpec& s) { s.clear_model(); }, "model: missing"},
      {"model shape", [](pb::JobSpec& s) { s.mutable_model()->set_n_heads(3); }, "model.n_heads"},
      {"schedule", [](pb::JobSpec& s) { s.mutable_pipeline()->set_schedule("zigzag"); },
       "pipeline.schedule: unknown schedule 'zigzag' (expected gpipe, 1f1b, interleaved, "
       "zb-h1, zb-v or dualpipe-v)"},
      {"recompute", [](pb::JobSpec& s) { s.mutable_pipeline()->set_recompute("sometimes"); },
       "pipeline.recompute: unknown mode 'sometimes' (expected never, always or except-last)"},
      {"stages zero", [](pb::JobSpec& s) { s.mutable_pipeline()->set_stages(0); },
       "pipeline.stages"},
      {"stages > layers",
       [](pb::JobSpec& s) {
         s.mutable_pipeline()->set_stages(8);
         s.mutable_pipeline()->set_micro_batches(8);
       },
       "pipeline.stages: 8 is more than the model's 6 pipeline layers"},
      {"batch not divisible", [](pb::JobSpec& s) { s.mutable_training()->set_batch_size(10); },
       "pipeline.micro_batches"},
      {"batch zero", [](pb::JobSpec& s) { s.mutable_training()->set_batch_size(0); },
       "training.batch_size"},
      {"steps", [](pb::JobSpec& s) { s.mutable_training()->set_steps(0); },
       "training.steps: must be > 0"},
      {"lr zero", [](pb::JobSpec& s) { s.mutable_training()->set_lr(0); }, "training.lr"},
      {"lr inf", [](pb::JobSpec& s) { s.mutable_training()->set_lr(INFINITY); }, "training.lr"},
      {"beta1", [](pb::JobSpec& s) { s.mutable_training()->set_beta1(1); },
       "training.beta1: must be in [0, 1)"},
      {"beta2", [](pb::JobSpec& s) { s.mutable_training()->set_beta2(-0.1f); },
       "training.beta2"},
      {"weight decay", [](pb::JobSpec& s) { s.mutable_training()->set_weight_decay(-1); },
       "training.weight_decay: must be >= 0"},
      {"clip negative", [](pb::JobSpec& s) { s.mutable_training()->set_grad_clip_norm(-1); },
       "training.grad_clip_norm: must be >= 0"},
      {"warmup", [](pb::JobSpec& s) { s.mutable_training()->set_warmup_steps(-5); },
       "training.warmup_steps"},
      {"precision", [](pb::JobSpec& s) { s.mutable_training()->set_precision("fp16"); },
       "training.precision: unknown precision 'fp16'; accepted: fp32, bf16"},
      {"lr schedule", [](pb::JobSpec& s) { s.mutable_training()->set_lr_schedule("cosin"); },
       "training.lr_schedule: unknown schedule 'cosin'; accepted: constant, cosine, linear"},
      {"min_lr negative", [](pb::JobSpec& s) { Decaying(s, -1e-5f); },
       "training.min_lr: must be >= 0 (got -1e-05)"},
      {"min_lr NaN", [](pb::JobSpec& s) { Decaying(s, NAN); }, "training.min_lr: must be >= 0"},
      {"min_lr inf", [](pb::JobSpec& s) { Decaying(s, INFINITY); },
       "training.min_lr: must be >= 0 (got inf)"},
      {"min_lr above lr", [](pb::JobSpec& s) { Decaying(s, 0.01f); },
       "training.min_lr: must be <= training.lr (got 0.01 > 0.003)"},
      {"min_lr with constant",
       [](pb::JobSpec& s) {
         s.mutable_training()->clear_lr_schedule();  // the example's is cosine
         s.mutable_training()->set_min_lr(3e-4f);
       },
       "training.min_lr: is where a decaying schedule ends, but training.lr_schedule is "
       "'constant' (the default)"},
      {"min_lr with explicit constant",
       [](pb::JobSpec& s) {
         s.mutable_training()->set_lr_schedule("constant");
         s.mutable_training()->set_min_lr(3e-4f);
       },
       "training.min_lr: is where a decaying schedule ends"},
      {"decay without steps after the warm-up",
       [](pb::JobSpec& s) {
         Decaying(s, 0);
         s.mutable_training()->set_warmup_steps(300);
       },
       "training.warmup_steps: must be < training.steps (300) with training.lr_schedule "
       "'cosine' (got 300)"},
      {"corpus", [](pb::JobSpec& s) { s.mutable_data()->clear_corpus(); },
       "data.corpus: missing; give the path of a text file the coordinator can read"},
      {"corpus and tokens", [](pb::JobSpec& s) { s.mutable_data()->add_tokens("a.bin"); },
       "data.corpus and data.tokens: both given"},
      {"format with corpus", [](pb::JobSpec& s) { s.mutable_data()->set_format("llmc"); },
       "data.format: is the format of data.tokens"},
      {"validation tokens with corpus",
       [](pb::JobSpec& s) { s.mutable_data()->add_validation_tokens("val.bin"); },
       "data.validation_tokens: goes with data.tokens"},
      {"unknown format",
       [](pb::JobSpec& s) {
         UseTokens(s);
         s.mutable_data()->set_format("gpt2");
       },
       "data.format: unknown token file format 'gpt2'"},
      {"empty token path",
       [](pb::JobSpec& s) {
         UseTokens(s);
         s.mutable_data()->add_tokens("");
       },
       "data.tokens[1]: empty"},
      {"empty validation token path",
       [](pb::JobSpec& s) {
         UseTokens(s);
         s.mutable_data()->add_validation_tokens("");
       },
       "data.validation_tokens[0]: empty"},
      {"validation tokens and fraction",
       [](pb::JobSpec& s) {
         UseTokens(s);
         s.mutable_data()->add_validation_tokens("val.bin");
       },
       "data.validation_fraction and data.validation_tokens: both given"},
      {"validation fraction", [](pb::JobSpec& s) { s.mutable_data()->set_validation_fraction(1); },
       "data.validation_fraction"},
      {"validate every", [](pb::JobSpec& s) { s.mutable_data()->set_validate_every_steps(-1); },
       "data.validate_every_steps"},
      {"checkpoint", [](pb::JobSpec& s) { s.mutable_checkpoint()->set_every_steps(-1); },
       "checkpoint.every_steps"},
      {"snapshots", [](pb::JobSpec& s) { s.mutable_checkpoint()->set_snapshot_every_steps(-2); },
       "checkpoint.snapshot_every_steps: must be >= 0 (got -2)"},
      {"restarts", [](pb::JobSpec& s) { s.mutable_fault_tolerance()->set_max_restarts(-1); },
       "fault_tolerance.max_restarts: must be in [0, 1000] (got -1)"},
      {"restarts too many",
       [](pb::JobSpec& s) { s.mutable_fault_tolerance()->set_max_restarts(1001); },
       "fault_tolerance.max_restarts: must be in [0, 1000] (got 1001)"},
      {"wait", [](pb::JobSpec& s) { s.mutable_fault_tolerance()->set_wait_for_stages_s(-5); },
       "fault_tolerance.wait_for_stages_s: must be in [0, 86400] seconds (got -5)"},
      {"replicas negative", [](pb::JobSpec& s) { s.mutable_pipeline()->set_replicas(-1); },
       "pipeline.replicas: must be in [1, 1024] (got -1)"},
      {"replicas too many", [](pb::JobSpec& s) { s.mutable_pipeline()->set_replicas(1025); },
       "pipeline.replicas: must be in [1, 1024] (got 1025)"},
      {"replicas split",
       [](pb::JobSpec& s) {
         s.mutable_training()->set_batch_size(12);
         s.mutable_pipeline()->set_micro_batches(4);
         s.mutable_pipeline()->set_replicas(2);
       },
       "training.batch_size: 12 is not divisible by pipeline.replicas 2 x "
       "pipeline.micro_batches 4 = 8; each replica takes batch_size / replicas sequences in "
       "micro_batches micro-batches"},
  };
  for (const Rule& rule : rules) {
    pb::JobSpec spec = Example();
    rule.mutate(spec);
    EXPECT_THAT(ValidateJobSpec(spec), StatusIs(kInvalid, HasSubstr(rule.expected))) << rule.name;
  }
}

TEST(JobSpecTest, LrScheduleAndMinLrParseFromJsonAndSet) {
  auto spec = ParseJobSpec(
      R"({"training": {"lr": 0.003, "warmup_steps": 10, "lr_schedule": "cosine",
                       "min_lr": 0.0003}})");
  ASSERT_THAT(spec, IsOk());
  EXPECT_EQ(spec->training().lr_schedule(), "cosine");
  EXPECT_FLOAT_EQ(spec->training().min_lr(), 3e-4f);
  auto camel = ParseJobSpec(R"({"training": {"lrSchedule": "linear", "minLr": 0}})");
  ASSERT_THAT(camel, IsOk());
  EXPECT_EQ(camel->training().lr_schedule(), "linear");
  pb::JobSpec set = Overridden(ReadExample(), {"training.lr_schedule=linear",
                                               "training.min_lr=3e-5"});
  EXPECT_EQ(set.training().lr_schedule(), "linear");
  EXPECT_FLOAT_EQ(set.training().min_lr(), 3e-5f);
  EXPECT_THAT(ValidateJobSpec(WithDefaults(set)), IsOk());
  EXPECT_THAT(ParseJobSpec(R"({"training": {"lr_schedule": 2, "min_lr": true}})"),
              StatusIs(kInvalid, AllOf(HasSubstr("training.lr_schedule: expected a string"),
                                       HasSubstr("training.min_lr: expected a number"))));
  EXPECT_THAT(ParseJobSpec(R"({"training": {"min_lr": "low"}})"),
              StatusIs(kInvalid, HasSubstr("training.min_lr: invalid value")));
  EXPECT_THAT(ParseJobSpec(R"({"training": {"lr_shedule": "cosine"}})"),
              StatusIs(kInvalid, HasSubstr("did you mean 'lr_schedule'?")));
}

// Every schedule validates, the default one (left out) included; a decay to 0 is one.
TEST(JobSpecTest, EveryScheduleIsAccepted) {
  for (const char* name : {"", "constant", "cosine", "linear"}) {
    pb::JobSpec spec = Example();
    spec.mutable_training()->set_lr_schedule(name);
    spec.mutable_training()->clear_min_lr();  // the example's ends its cosine at lr / 10
    spec.mutable_training()->set_warmup_steps(299);  // one step left to decay over
    EXPECT_THAT(ValidateJobSpec(spec), IsOk()) << name;
    if (std::string(name) == "cosine" || std::string(name) == "linear") {
      spec.mutable_training()->set_min_lr(0.003f);  // min_lr == lr: a flat "decay"
      EXPECT_THAT(ValidateJobSpec(spec), IsOk()) << name;
    }
  }
}

// A job from a checkpoint has run steps before its own: the warm-up may outlast them
// (`pipetrain resume` of a job stopped inside its warm-up, with few steps left).
TEST(JobSpecTest, AResumedDecayMayHaveFewerStepsThanTheWarmUp) {
  pb::JobSpec spec = Example();
  Decaying(spec, 0);
  spec.mutable_training()->set_warmup_steps(400);
  spec.set_init_from("/state/checkpoints/job-000001/step-200");
  EXPECT_THAT(ValidateJobSpec(spec), IsOk());
}

// The coordinator clips by the norm over the whole model (two phases per step), so
// any number of stages may clip.
TEST(JobSpecTest, ClippingIsFineOnAnyNumberOfStages) {
  for (int stages : {1, 2, 4}) {
    pb::JobSpec spec = Example();
    spec.mutable_pipeline()->set_stages(stages);
    spec.mutable_pipeline()->set_micro_batches(4);
    spec.mutable_training()->set_grad_clip_norm(1);
    EXPECT_THAT(ValidateJobSpec(spec), IsOk()) << stages << " stages";
  }
}

// Replicas that split the batch evenly are accepted; a bad split names the counts.
TEST(JobSpecTest, ReplicasThatSplitTheBatchAreAccepted) {
  pb::JobSpec spec = Example();  // batch 16, M 8
  EXPECT_THAT(ValidateJobSpec(spec), IsOk()) << "replicas left out";
  spec.mutable_pipeline()->set_replicas(1);
  EXPECT_THAT(ValidateJobSpec(spec), IsOk()) << "replicas 1";
  spec.mutable_pipeline()->set_replicas(2);  // 16 = 2 x 8: a good split
  EXPECT_THAT(ValidateJobSpec(spec), IsOk()) << "replicas 2";
  spec.mutable_pipeline()->set_replicas(4);  // 16 / (4 x 8)
  EXPECT_THAT(ValidateJobSpec(spec),
              StatusIs(kInvalid, HasSubstr("training.batch_size: 16 is not divisible by "
                                           "pipeline.replicas 4 x pipeline.micro_batches 8 = 32")));
}

TEST(JobSpecTest, ToJsonUsesSnakeCaseAndRoundTrips) {
  pb::JobSpec spec = Example();
  const std::string text = JobSpecToJson(spec);
  EXPECT_THAT(text, HasSubstr("\"micro_batches\": 8"));
  EXPECT_THAT(text, HasSubstr("\"grad_clip_norm\": 0"));  // zero values are printed
  EXPECT_THAT(text, Not(HasSubstr("microBatches")));
  auto back = ParseJobSpec(text);
  ASSERT_THAT(back, IsOk());
  EXPECT_EQ(back->SerializeAsString(), spec.SerializeAsString());
}

}  // namespace
}  // namespace pipetrain::coordinator
