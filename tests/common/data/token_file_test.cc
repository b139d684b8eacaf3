// Token files: llm.c (GPT-2's uint16 and Llama 3's uint32 layouts) and nanoGPT files
// written byte by byte here read back as their tokens; several files read as one stream;
// globs expand in sorted order; and every bad file is refused with a message that names
// it and says what is wrong.
#include "common/data/token_file.h"

#include <sys/stat.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_files.h"
#include "tests/testing/token_files.h"

namespace pipetrain::data {
namespace {

using ::pipetrain::testing::IsOk;
using ::pipetrain::testing::LlmcBytes;
using ::pipetrain::testing::LlmcBytes32;
using ::pipetrain::testing::NanoGptBytes;
using ::pipetrain::testing::StatusIs;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

std::vector<uint16_t> Tokens(const TokenFile& f) {
  EXPECT_EQ(f.token_bytes(), 2) << f.path();
  std::vector<uint16_t> out;
  for (int64_t i = 0; i < f.size(); ++i) out.push_back(static_cast<uint16_t>(f.token(i)));
  return out;
}

TEST(TokenFileTest, ReadsAnLlmcFile) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {0, 1, 50256, 65535, 7};
  WriteFileOrDie(dir.File("a.bin"), LlmcBytes(tokens));
  auto f = TokenFile::Open(dir.File("a.bin"), TokenFormat::kLlmc);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->path(), dir.File("a.bin"));
  EXPECT_EQ(f->size(), 5);
  EXPECT_EQ(Tokens(*f), tokens);
}

// Llama 3's layout (llm.c's dev/data scripts for Llama 3): uint32 ids above 65535.
TEST(TokenFileTest, ReadsAnLlmcLlama3File) {
  TempDir dir;
  const std::vector<uint32_t> tokens = {128000, 9906, 1917, 0, 65536, 128255, 128001};
  WriteFileOrDie(dir.File("l3.bin"), LlmcBytes32(tokens));
  auto f = TokenFile::Open(dir.File("l3.bin"), TokenFormat::kLlmc);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(f->token_bytes(), 4);
  ASSERT_EQ(f->size(), 7);
  for (int64_t i = 0; i < f->size(); ++i) EXPECT_EQ(f->token(i), tokens[i]) << "token " << i;
  std::vector<int32_t> out(3);
  f->CopyTokens(4, 3, out.data());
  EXPECT_THAT(out, ElementsAre(65536, 128255, 128001));
  EXPECT_THAT(f->CheckVocabulary(128256), IsOk());
  EXPECT_THAT(f->CheckVocabulary(128001),
              StatusIs(kInvalid,
                       AllOf(HasSubstr(dir.File("l3.bin")), HasSubstr("token 5 is 128255"),
                             HasSubstr("model.vocab_size = 128001"))));
  // A uint32 id of 2^31 or more is above any vocabulary.
  WriteFileOrDie(dir.File("huge.bin"), LlmcBytes32({1, 0x80000000u}));
  auto huge = TokenFile::Open(dir.File("huge.bin"), TokenFormat::kLlmc);
  ASSERT_THAT(huge, IsOk());
  EXPECT_THAT(huge->CheckVocabulary(128256),
              StatusIs(kInvalid, HasSubstr("token 1 is 2147483648")));
}

TEST(TokenFileTest, ReadsANanoGptFile) {
  TempDir dir;
  const std::vector<uint16_t> tokens = {258, 3, 0, 50000};
  WriteFileOrDie(dir.File("train.bin"), NanoGptBytes(tokens));
  auto f = TokenFile::Open(dir.File("train.bin"), TokenFormat::kNanoGpt);
  ASSERT_THAT(f, IsOk());
  EXPECT_EQ(Tokens(*f), tokens);
  // Little-endian: 258 is the bytes 02 01.
  EXPECT_EQ(testing::ReadFileOrDie(dir.File("train.bin")).substr(0, 2), std::string("\x02\x01"));
}

TEST(TokenFileTest, EmptyFilesHoldNoTokens) {
  TempDir dir;
  WriteFileOrDie(dir.File("empty.bin"), "");
  auto raw = TokenFile::Open(dir.File("empty.bin"), TokenFormat::kNanoGpt);
  ASSERT_THAT(raw, IsOk());
  EXPECT_EQ(raw->size(), 0);
  WriteFileOrDie(dir.File("empty_llmc.bin"), LlmcBytes({}));
  auto llmc = TokenFile::Open(dir.File("empty_llmc.bin"), TokenFormat::kLlmc);
  ASSERT_THAT(llmc, IsOk());
  EXPECT_EQ(llmc->size(), 0);
}

// The mapping moves with the object; the moved-from one holds nothing and unmaps nothing.
TEST(TokenFileTest, MovesKeepTheMapping) {
  TempDir dir;
  WriteFileOrDie(dir.File("a.bin"), NanoGptBytes({1, 2, 3}));
  WriteFileOrDie(dir.File("b.bin"), NanoGptBytes({4, 5}));
  auto a = TokenFile::Open(dir.File("a.bin"), TokenFormat::kNanoGpt);
  auto b = TokenFile::Open(dir.File("b.bin"), TokenFormat::kNanoGpt);
  ASSERT_THAT(a, IsOk());
  ASSERT_THAT(b, IsOk());
  TokenFile moved(*std::move(a));
  EXPECT_EQ(a->size(), 0);  // NOLINT(bugprone-use-after-move): what a move leaves
  EXPECT_THAT(Tokens(moved), ElementsAre(1, 2, 3));
  moved = *std::move(b);  // unmaps a.bin's mapping, takes b.bin's
  EXPECT_THAT(Tokens(moved), ElementsAre(4, 5));
  EXPECT_EQ(moved.path(), dir.File("b.bin"));
}

TEST(TokenFileTest, VocabularyCheckNamesTheFileTheIndexAndTheId) {
  TempDir dir;
  WriteFileOrDie(dir.File("a.bin"), LlmcBytes({1, 511, 2, 600, 700}));
  auto f = TokenFile::Open(dir.File("a.bin"), TokenFormat::kLlmc);
  ASSERT_THAT(f, IsOk());
  EXPECT_THAT(f->CheckVocabulary(701), IsOk());
  EXPECT_THAT(f->CheckVocabulary(512),
              StatusIs(kInvalid, AllOf(HasSubstr(dir.File("a.bin")), HasSubstr("token 3 is 600"),
                                       HasSubstr("model.vocab_size = 512"))));
  EXPECT_THAT(f->CheckVocabulary(700), StatusIs(kInvalid, HasSubstr("token 4 is 700")));
  EXPECT_THAT(f->CheckVocabulary(65536), IsOk());
}

TEST(TokenFileTest, FormatNames) {
  EXPECT_THAT(ParseTokenFormat("llmc"), IsOk());
  EXPECT_EQ(*ParseTokenFormat("nanogpt"), TokenFormat::kNanoGpt);
  EXPECT_EQ(TokenFormatName(TokenFormat::kLlmc), "llmc");
  EXPECT_THAT(ParseTokenFormat("gpt2"),
              StatusIs(kInvalid, AllOf(HasSubstr("data.format"), HasSubstr("'gpt2'"),
                                       HasSubstr("\"nanogpt\""))));
}

// Files of 3, 0 and 4 tokens read as one stream of 7; every range, across the empty file
// and the boundaries too, gives the concatenation's tokens.
TEST(TokenDatasetTest, ReadsFilesAsOneStream) {
  TempDir dir;
  WriteFileOrDie(dir.File("0.bin"), LlmcBytes({10, 11, 12}));
  WriteFileOrDie(dir.File("1.bin"), LlmcBytes({}));
  WriteFileOrDie(dir.File("2.bin"), LlmcBytes({20, 21, 22, 23}));
  auto d = TokenDataset::Open({dir.File("0.bin"), dir.File("1.bin"), dir.File("2.bin")},
                              TokenFormat::kLlmc);
  ASSERT_THAT(d, IsOk());
  ASSERT_EQ(d->size(), 7);
  ASSERT_EQ(d->files().size(), 3u);
  const std::vector<int32_t> all = {10, 11, 12, 20, 21, 22, 23};
  for (int64_t start = 0; start < 7; ++start) {
    for (int64_t n = 0; start + n <= 7; ++n) {
      std::vector<int32_t> out(n);
      d->CopyTokens(start, n, out.data());
      EXPECT_THAT(out, ElementsAreArray(all.begin() + start, all.begin() + start + n))
          << "[" << start << ", " << start + n << ")";
    }
  }
  EXPECT_THAT(d->Describe(), AllOf(HasSubstr("3 files"), HasSubstr(dir.File("0.bin")),
                                   HasSubstr(dir.File("2.bin"))));
}

// A GPT-2 file and a Llama 3 file in one stream (each is read in its own width).
TEST(TokenDatasetTest, ReadsBothLlmcLayoutsAsOneStream) {
  TempDir dir;
  WriteFileOrDie(dir.File("a.bin"), LlmcBytes({10, 11}));
  WriteFileOrDie(dir.File("b.bin"), LlmcBytes32({100000, 20, 128001}));
  auto d = TokenDataset::Open({dir.File("a.bin"), dir.File("b.bin")}, TokenFormat::kLlmc);
  ASSERT_THAT(d, IsOk());
  ASSERT_EQ(d->size(), 5);
  std::vector<int32_t> out(4);
  d->CopyTokens(1, 4, out.data());
  EXPECT_THAT(out, ElementsAre(11, 100000, 20, 128001));
  EXPECT_THAT(d->CheckVocabulary(50257),
              StatusIs(kInvalid,
                       AllOf(HasSubstr(dir.File("b.bin")), HasSubstr("token 0 is 100000"))));
}

TEST(TokenDatasetTest, TheFirstBadFileFailsTheDataset) {
  TempDir dir;
  WriteFileOrDie(dir.File("good.bin"), LlmcBytes({1, 2}));
  WriteFileOrDie(dir.File("bad.bin"), NanoGptBytes({1, 2, 3}));
  EXPECT_THAT(TokenDataset::Open({dir.File("good.bin"), dir.File("bad.bin")}, TokenFormat::kLlmc),
              StatusIs(kInvalid, HasSubstr(dir.File("bad.bin"))));
  WriteFileOrDie(dir.File("big_id.bin"), LlmcBytes({3, 999}));
  auto d = TokenDataset::Open({dir.File("good.bin"), dir.File("big_id.bin")}, TokenFormat::kLlmc);
  ASSERT_THAT(d, IsOk());
  EXPECT_THAT(d->CheckVocabulary(512), StatusIs(kInvalid, AllOf(HasSubstr(dir.File("big_id.bin")),
                                                                HasSubstr("token 1 is 999"))));
}

// Matches in byte order (so _10 sorts before _2, as ls does in the C locale); the list's
// own order is kept; a plain path passes through untouched.
TEST(ExpandTokenPathsTest, GlobsExpandSortedInListOrder) {
  TempDir dir;
  for (const char* name : {"train_2.bin", "train_10.bin", "train_1.bin", "val_0.bin"}) {
    WriteFileOrDie(dir.File(name), "");
  }
  auto paths = ExpandTokenPaths({dir.File("val_*.bin"), dir.File("train_*.bin"),
                                 dir.File("no_such.bin"), dir.File("train_?.bin")});
  ASSERT_THAT(paths, IsOk());
  EXPECT_THAT(*paths,
              ElementsAre(dir.File("val_0.bin"), dir.File("train_1.bin"), dir.File("train_10.bin"),
                          dir.File("train_2.bin"), dir.File("no_such.bin"), dir.File("train_1.bin"),
                          dir.File("train_2.bin")));
  EXPECT_THAT(ExpandTokenPaths({dir.File("train_[0-9].bin")}), IsOk());
  EXPECT_THAT(ExpandTokenPaths({dir.File("train_*.bin"), dir.File("fineweb_*.bin")}),
              StatusIs(kInvalid,
                       AllOf(HasSubstr(dir.File("fineweb_*.bin")), HasSubstr("matches no file"))));
}

struct BadFile {
  std::string name;
  std::string bytes;  // the file's contents ("" with `folder`: make a folder instead)
  TokenFormat format;
  std::vector<std::string> says;      // parts of the message besides the file's path
  std::string must_not_say = "\x01";  // absent from the message
  bool folder = false;
};

TEST(TokenFileTest, EveryBadFileIsNamedWithItsProblem) {
  const std::vector<uint16_t> five = {1, 2, 3, 4, 5};
  const std::vector<BadFile> cases = {
      {"folder", "", TokenFormat::kLlmc, {"is a folder"}, "\x01", true},
      {"wrong magic, even size",
       LlmcBytes(five, 12345),
       TokenFormat::kLlmc,
       {"wrong magic 12345", "starts with 20240520", "data.format: \"nanogpt\"", "517 tokens"}},
      {"wrong magic, odd size",
       LlmcBytes(five, 12345) + "x",
       TokenFormat::kLlmc,
       {"wrong magic 12345"},
       "nanogpt"},
      {"raw tokens read as llm.c",
       NanoGptBytes(std::vector<uint16_t>(600, 7)),
       TokenFormat::kLlmc,
       {"wrong magic", "data.format: \"nanogpt\""}},
      {"version", LlmcBytes(five, 20240520, 7), TokenFormat::kLlmc, {"version 7, expected 1"}},
      {"header count above the size",
       LlmcBytes(five, 20240520, 1, 10),
       TokenFormat::kLlmc,
       {"truncated", "header says 10 tokens", "1034 bytes", "room for 5 tokens"}},
      {"header count below the size",
       LlmcBytes(five, 20240520, 1, 3),
       TokenFormat::kLlmc,
       {"header says 3 tokens", "1034 bytes hold 5 tokens"}},
      {"odd byte after the tokens",
       LlmcBytes(five) + "x",
       TokenFormat::kLlmc,
       {"header says 5 tokens", "an odd byte"}},
      {"shorter than the header",
       std::string(100, '\0'),
       TokenFormat::kLlmc,
       {"truncated: 100 bytes", "1024-byte header"}},
      {"Llama 3 magic with GPT-2's version",
       LlmcBytes32({1, 2}, 20240801, 1),
       TokenFormat::kLlmc,
       {"version 1, expected 7", "magic 20240801", "uint32"}},
      {"GPT-2's header on Llama 3's tokens",
       LlmcBytes32({1, 2}, 20240520, 1),
       TokenFormat::kLlmc,
       {"header says 2 tokens", "hold 4 tokens"}},
      {"Llama 3 file cut inside a token",
       LlmcBytes32({1, 2, 3}) + "xy",
       TokenFormat::kLlmc,
       {"header says 3 tokens", "hold 3 tokens and 2 bytes", "uint32 Llama 3 tokens"}},
      {"Llama 3 header count above the size",
       LlmcBytes32({1, 2, 3}, 20240801, 7, 4),
       TokenFormat::kLlmc,
       {"truncated", "header says 4 tokens", "1040 bytes with the header", "room for 3 tokens"}},
      {"wrong magic names both layouts",
       LlmcBytes32({1}, 20240802),
       TokenFormat::kLlmc,
       {"wrong magic 20240802", "20240520", "20240801"}},
      {"Llama 3 file read raw",
       LlmcBytes32({1, 2}),
       TokenFormat::kNanoGpt,
       {"llm.c's magic 20240801", "data.format: \"llmc\""}},
      {"odd nanoGPT file",
       NanoGptBytes(five) + "x",
       TokenFormat::kNanoGpt,
       {"11 bytes, an odd number", "2 bytes each"}},
      {"llm.c file read raw",
       LlmcBytes(five),
       TokenFormat::kNanoGpt,
       {"llm.c token file", "data.format: \"llmc\""}},
  };
  TempDir dir;
  for (size_t i = 0; i < cases.size(); ++i) {
    const BadFile& c = cases[i];
    const std::string path = dir.File("case_" + std::to_string(i) + ".bin");
    if (c.folder) {
      std::filesystem::create_directory(path);
    } else {
      WriteFileOrDie(path, c.bytes);
    }
    auto f = TokenFile::Open(path, c.format);
    ASSERT_THAT(f, Not(IsOk())) << c.name;
    EXPECT_EQ(f.status().code(), kInvalid) << c.name;
    const std::string message(f.status().message());
    EXPECT_THAT(message, HasSubstr(path)) << c.name;
    for (const std::string& part : c.says) EXPECT_THAT(message, HasSubstr(part)) << c.name;
    EXPECT_THAT(message, Not(HasSubstr(c.must_not_say))) << c.name;
  }
  EXPECT_THAT(TokenFile::Open(dir.File("missing.bin"), TokenFormat::kLlmc),
              StatusIs(kInvalid, AllOf(HasSubstr(dir.File("missing.bin")),
                                       HasSubstr("cannot read " + dir.File("missing.bin") +
                                                 ": No such file"))));
  EXPECT_THAT(TokenFile::Open("/dev/null", TokenFormat::kNanoGpt),
              StatusIs(kInvalid, HasSubstr("/dev/null is a character device, not a regular file")));
  // A FIFO is refused from its stat, never opened (opening one blocks until a writer comes).
  ASSERT_EQ(mkfifo(dir.File("pipe.bin").c_str(), 0600), 0);
  EXPECT_THAT(TokenFile::Open(dir.File("pipe.bin"), TokenFormat::kLlmc),
              StatusIs(kInvalid, HasSubstr("pipe.bin is a FIFO, not a regular file")));
}

}  // namespace
}  // namespace pipetrain::data
