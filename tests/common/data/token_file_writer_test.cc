// llm.c token files: the header's magic, version and count and the tokens (uint16 in
// GPT-2's layout, uint32 in Llama 3's), read back here byte by byte; ids that do not fit
// are refused naming them, and a failed or abandoned writer leaves the old file and no
// temp file.
#include "common/data/token_file.h"
#include "common/data/token_file_writer.h"

#include <cstdint>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::data {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::ListFolder;
using ::pipetrain::testing::ReadFileOrDie;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

uint32_t Le32(const std::string& bytes, size_t offset) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(bytes[offset + i]);
  return v;
}

TEST(TokenFileWriterTest, WritesTheHeaderAndLittleEndianTokens) {
  TempDir dir;
  const std::string path = dir.File("tokens.bin");
  auto writer = TokenFileWriter::Open(path, 50257);
  ASSERT_THAT(writer, IsOk());
  ASSERT_THAT(writer->Append({15496, 995}), IsOk());
  ASSERT_THAT(writer->Append({}), IsOk());
  ASSERT_THAT(writer->Append({50256, 0, 258}), IsOk());
  EXPECT_EQ(writer->tokens(), 5);
  ASSERT_THAT(writer->Commit(), IsOk());

  const std::string bytes = ReadFileOrDie(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * 5);
  EXPECT_EQ(Le32(bytes, 0), 20240520u);
  EXPECT_EQ(Le32(bytes, 4), 1u);
  EXPECT_EQ(Le32(bytes, 8), 5u);
  for (size_t i = 12; i < 1024; ++i) ASSERT_EQ(bytes[i], '\0') << "header byte " << i;
  std::vector<int> tokens;
  for (size_t i = 1024; i < bytes.size(); i += 2) {
    tokens.push_back(static_cast<uint8_t>(bytes[i]) | (static_cast<uint8_t>(bytes[i + 1]) << 8));
  }
  EXPECT_THAT(tokens, ElementsAre(15496, 995, 50256, 0, 258));
  EXPECT_THAT(ListFolder(dir.path()), ElementsAre("tokens.bin"));
}

TEST(TokenFileWriterTest, ManyTokensCrossTheBufferAndTheCountIsExact) {
  TempDir dir;
  const std::string path = dir.File("big.bin");
  auto writer = TokenFileWriter::Open(path, 65536);
  ASSERT_THAT(writer, IsOk());
  std::vector<int32_t> ids(1 << 20);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % 65536);
  ASSERT_THAT(writer->Append(ids), IsOk());
  ASSERT_THAT(writer->Commit(), IsOk());
  const std::string bytes = ReadFileOrDie(path);
  ASSERT_EQ(bytes.size(), 1024u + 2 * ids.size());
  EXPECT_EQ(Le32(bytes, 8), ids.size());
  EXPECT_EQ(static_cast<uint8_t>(bytes[1024 + 2 * 65535]), 0xFF);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1024 + 2 * 65535 + 1]), 0xFF);
}

// What the writer writes, the reader that jobs train from reads back id for id.
TEST(TokenFileWriterTest, TheTrainingReaderReadsWhatItWrites) {
  TempDir dir;
  const std::string path = dir.File("round.bin");
  auto writer = TokenFileWriter::Open(path, 50257);
  ASSERT_THAT(writer, IsOk());
  std::vector<int32_t> ids;
  for (int i = 0; i < 5000; ++i) ids.push_back((i * 7919 + 13) % 50257);
  ASSERT_THAT(writer->Append(absl::MakeConstSpan(ids).subspan(0, 1234)), IsOk());
  ASSERT_THAT(writer->Append(absl::MakeConstSpan(ids).subspan(1234)), IsOk());
  ASSERT_THAT(writer->Commit(), IsOk());
  auto file = TokenFile::Open(path, TokenFormat::kLlmc);
  ASSERT_THAT(file, IsOk());
  ASSERT_EQ(file->size(), static_cast<int64_t>(ids.size()));
  for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(file->token(i), ids[i]) << "token " << i;
  EXPECT_THAT(file->CheckVocabulary(50257), IsOk());
}

TEST(TokenFileWriterTest, WritesLlama3sLayoutWithUint32Tokens) {
  TempDir dir;
  const std::string path = dir.File("l3.bin");
  EXPECT_EQ(&LlmcLayoutFor(50257), &kLlmcGpt2);
  EXPECT_EQ(&LlmcLayoutFor(65536), &kLlmcGpt2);
  EXPECT_EQ(&LlmcLayoutFor(65537), &kLlmcLlama3);
  EXPECT_EQ(&LlmcLayoutFor(128256), &kLlmcLlama3);
  auto writer = TokenFileWriter::Open(path, 128256, kLlmcLlama3);
  ASSERT_THAT(writer, IsOk());
  const std::vector<int32_t> ids = {128000, 9906, 1917, 0, 65535, 65536, 128255};
  ASSERT_THAT(writer->Append(ids), IsOk());
  ASSERT_THAT(writer->Commit(), IsOk());

  const std::string bytes = ReadFileOrDie(path);
  ASSERT_EQ(bytes.size(), 1024u + 4 * ids.size());
  EXPECT_EQ(Le32(bytes, 0), 20240801u);
  EXPECT_EQ(Le32(bytes, 4), 7u);
  EXPECT_EQ(Le32(bytes, 8), ids.size());
  for (size_t i = 12; i < 1024; ++i) ASSERT_EQ(bytes[i], '\0') << "header byte " << i;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(Le32(bytes, 1024 + 4 * i), static_cast<uint32_t>(ids[i])) << "token " << i;
  }
  auto file = TokenFile::Open(path, TokenFormat::kLlmc);
  ASSERT_THAT(file, IsOk());
  EXPECT_EQ(file->token_bytes(), 4);
  std::vector<int32_t> back(ids.size());
  file->CopyTokens(0, file->size(), back.data());
  EXPECT_EQ(back, ids);

  auto refused = TokenFileWriter::Open(path, 128256, kLlmcLlama3);
  ASSERT_THAT(refused, IsOk());
  EXPECT_THAT(refused->Append({5, 128256}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(path), HasSubstr("token id 128256 (token 1) is not below "
                                                        "the vocabulary size 128256"))));
  EXPECT_THAT(TokenFileWriter::Open(path, 128256, kLlmcLlama3)->Append({-1}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("does not fit the file's uint32 tokens")));
}

TEST(TokenFileWriterTest, RefusesIdsThatDoNotFitAndLeavesTheOldFile) {
  TempDir dir;
  const std::string path = dir.File("tokens.bin");
  WriteFileOrDie(path, "old");
  struct Case {
    int32_t vocab;
    std::vector<int32_t> ids;
    std::string message;
  };
  const std::vector<Case> cases = {
      {256, {1, 2, 256}, "token id 256 (token 2) is not below the vocabulary size 256"},
      {100000, {70000}, "token id 70000 (token 0) does not fit the file's uint16 tokens"},
      {256, {-3}, "token id -3 (token 0) does not fit"},
  };
  for (const Case& c : cases) {
    auto writer = TokenFileWriter::Open(path, c.vocab);
    ASSERT_THAT(writer, IsOk());
    EXPECT_THAT(writer->Append(c.ids), StatusIs(absl::StatusCode::kInvalidArgument,
                                                AllOf(HasSubstr(path), HasSubstr(c.message))));
    EXPECT_THAT(writer->Commit(), StatusIs(absl::StatusCode::kFailedPrecondition));
  }
  EXPECT_EQ(ReadFileOrDie(path), "old");
  EXPECT_THAT(ListFolder(dir.path()), ElementsAre("tokens.bin"));
  EXPECT_THAT(TokenFileWriter::Open(dir.File("no/such/folder/t.bin"), 256),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no/such/folder/t.bin")));
}

}  // namespace
}  // namespace pipetrain::data
