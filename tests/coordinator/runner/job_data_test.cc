// A job's data: a text corpus splits and samples as it always did; token files (globs,
// a separate validation file) give the training and validation streams; and every bad
// file or short part fails with a message naming the field and the file.
#include "coordinator/runner/job_data.h"

#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "coordinator/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"
#include "tests/testing/token_files.h"

namespace pipetrain::coordinator {
namespace {

namespace pb = ::pipetrain::v1;
using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::LlmcBytes;
using ::pipetrain::testing::NanoGptBytes;
using ::pipetrain::testing::RandomTokens;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

pb::JobSpec Spec(int vocab) {
  pb::JobSpec spec;
  pb::ModelConfig* m = spec.mutable_model();
  m->set_vocab_size(vocab);
  m->set_seq_len(16);
  m->set_d_model(32);
  m->set_n_heads(2);
  m->set_n_layers(2);
  spec.mutable_data()->set_validate_every_steps(2);
  return spec;
}

model::TransformerConfig Config(const pb::JobSpec& spec) {
  return {spec.model().vocab_size(), spec.model().seq_len(), 32, 2, 2};
}

std::vector<int32_t> Stream(const TokenWindow& w) {
  std::vector<int32_t> out(w.size());
  w.Copy(0, w.size(), out.data());
  return out;
}

// The text splits as before (the tail of 5% held out) and its training batches are
// SampleBatch's over the head of the text, byte for byte.
TEST(JobDataTest, TextCorpusSplitsAndSamplesAsBefore) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + (i * 7) % 26));
  WriteFileOrDie(dir.File("corpus.txt"), text);
  pb::JobSpec spec = Spec(256);
  spec.mutable_data()->set_corpus(dir.File("corpus.txt"));
  spec = WithDefaults(spec);
  auto d = LoadJobData(spec);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->train.size(), 950);
  EXPECT_EQ(d->validation.size(), 50);
  auto ours = TrainingBatch(*d, Config(spec), 4, 7, 3);
  auto head = model::SampleBatch(absl::string_view(text).substr(0, 950), Config(spec), 4, 7, 3);
  ASSERT_THAT(ours, IsOk());
  ASSERT_THAT(head, IsOk());
  EXPECT_EQ(ours->inputs, head->inputs);
  EXPECT_EQ(ours->targets, head->targets);
  auto val = ValidationBatch(*d, Config(spec), 2, 7);
  auto tail = model::SampleBatch(absl::string_view(text).substr(950), Config(spec), 2, 7, 0);
  ASSERT_THAT(val, IsOk());
  EXPECT_EQ(val->inputs, tail->inputs);
}

TEST(JobDataTest, TokenFilesGiveTheirStreamAndItsTail) {
  TempDir dir;
  const std::vector<uint16_t> a = RandomTokens(300, 512, 1), b = RandomTokens(100, 512, 2);
  WriteFileOrDie(dir.File("train_000.bin"), LlmcBytes(a));
  WriteFileOrDie(dir.File("train_001.bin"), LlmcBytes(b));
  pb::JobSpec spec = Spec(512);
  spec.mutable_data()->add_tokens(dir.File("train_*.bin"));
  spec = WithDefaults(spec);
  auto d = LoadJobData(spec);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->train.size(), 380);  // 5% of 400 held out
  EXPECT_EQ(d->validation.size(), 20);
  std::vector<int32_t> all(a.begin(), a.end());
  all.insert(all.end(), b.begin(), b.end());
  EXPECT_EQ(Stream(d->train), std::vector<int32_t>(all.begin(), all.begin() + 380));
  EXPECT_EQ(Stream(d->validation), std::vector<int32_t>(all.begin() + 380, all.end()));
  EXPECT_THAT(TrainingBatch(*d, Config(spec), 4, 7, 1), IsOk());
  EXPECT_THAT(ValidationBatch(*d, Config(spec), 4, 7), IsOk());
}

TEST(JobDataTest, ValidationFilesLeaveTheWholeStreamToTraining) {
  TempDir dir;
  WriteFileOrDie(dir.File("train.bin"), NanoGptBytes(RandomTokens(200, 512, 1)));
  WriteFileOrDie(dir.File("val.bin"), NanoGptBytes(RandomTokens(40, 512, 2)));
  pb::JobSpec spec = Spec(512);
  spec.mutable_data()->add_tokens(dir.File("train.bin"));
  spec.mutable_data()->add_validation_tokens(dir.File("val.bin"));
  spec.mutable_data()->set_format("nanogpt");
  spec = WithDefaults(spec);
  auto d = LoadJobData(spec);
  ASSERT_THAT(d, IsOk());
  EXPECT_EQ(d->train.size(), 200);
  EXPECT_EQ(d->validation.size(), 40);
  EXPECT_EQ(d->validation_field, "data.validation_tokens");
}

struct BadData {
  std::string name;
  std::function<void(pb::DataSpec&, const TempDir&)> set;
  std::vector<std::string> says;
};

TEST(JobDataTest, BadDataNamesTheFieldAndTheFile) {
  TempDir dir;
  WriteFileOrDie(dir.File("good.bin"), LlmcBytes(RandomTokens(400, 512, 1)));
  WriteFileOrDie(dir.File("raw.bin"), NanoGptBytes(RandomTokens(1000, 512, 1)));
  std::vector<uint16_t> with_big = RandomTokens(400, 512, 1);
  with_big[123] = 600;
  WriteFileOrDie(dir.File("big_id.bin"), LlmcBytes(with_big));
  WriteFileOrDie(dir.File("short.bin"), LlmcBytes(RandomTokens(16, 512, 1)));
  const std::vector<BadData> cases = {
      {"raw file as llm.c",
       [](pb::DataSpec& d, const TempDir& t) { d.add_tokens(t.File("raw.bin")); },
       {"data.tokens: '", "raw.bin': wrong magic", "data.format: \"nanogpt\""}},
      {"id out of the vocabulary",
       [](pb::DataSpec& d, const TempDir& t) {
         d.add_tokens(t.File("good.bin"));
         d.add_tokens(t.File("big_id.bin"));
       },
       {"data.tokens: '", "big_id.bin': token 123 is 600", "model.vocab_size = 512"}},
      {"pattern without a match",
       [](pb::DataSpec& d, const TempDir& t) { d.add_tokens(t.File("fineweb_*.bin")); },
       {"data.tokens: pattern '", "fineweb_*.bin' matches no file"}},
      {"missing file",
       [](pb::DataSpec& d, const TempDir& t) { d.add_tokens(t.File("nope.bin")); },
       {"data.tokens: token file cannot read ", "nope.bin: No such file"}},
      {"shorter than a sequence",
       [](pb::DataSpec& d, const TempDir& t) {
         d.add_tokens(t.File("short.bin"));
         d.set_validation_fraction(0);
       },
       {"data.tokens: '", "short.bin' gives 16 training tokens",
        "fewer than one sequence of model.seq_len + 1 = 17"}},
      {"bad validation file",
       [](pb::DataSpec& d, const TempDir& t) {
         d.add_tokens(t.File("good.bin"));
         d.add_validation_tokens(t.File("big_id.bin"));
       },
       {"data.validation_tokens: '", "big_id.bin': token 123 is 600"}},
      {"short validation file",
       [](pb::DataSpec& d, const TempDir& t) {
         d.add_tokens(t.File("good.bin"));
         d.add_validation_tokens(t.File("short.bin"));
       },
       {"data.validation_tokens: '", "short.bin' holds 16 tokens"}},
      {"short held-out tail",
       [](pb::DataSpec& d, const TempDir& t) {
         d.add_tokens(t.File("good.bin"));
         d.set_validation_fraction(0.025f);  // 10 of 400 tokens
       },
       {"data.validation_fraction: the held-out tail of '", "good.bin' is 10 tokens"}},
  };
  for (const BadData& c : cases) {
    pb::JobSpec spec = Spec(512);
    c.set(*spec.mutable_data(), dir);
    spec = WithDefaults(spec);
    auto d = LoadJobData(spec);
    ASSERT_THAT(d, StatusIs(kInvalid)) << c.name;
    for (const std::string& part : c.says) {
      EXPECT_THAT(std::string(d.status().message()), HasSubstr(part)) << c.name;
    }
  }
}

}  // namespace
}  // namespace pipetrain::coordinator
