// `pipetrain tokenize` through RunCli: the token file it writes is parsed here byte by
// byte (header, count, uint16 tokens; uint32 for llama3), --eot puts the end-of-text
// token between files only, --bos llama3's begin-of-text before each file, --json prints
// one JSON object and nothing else, --threads does not change the file, and bad input
// exits 2 with a message naming the file or flag. The gpt2 and llama3 cases skip where
// deploy/install-deps.sh has not installed their vocabulary.
#include <cstdint>
#include <string>
#include <vector>

#include "client/cli.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/gpt2_vocab.h"
#include "tests/testing/llama3_vocab.h"
#include "tests/testing/run_cli.h"
#include "tests/testing/temp_files.h"

namespace pipetrain::client {
namespace {

using ::pipetrain::testing::Cli;
using ::pipetrain::testing::CliRun;
using ::pipetrain::testing::ListFolder;
using ::pipetrain::testing::ReadFileOrDie;
using ::pipetrain::testing::TempDir;
using ::pipetrain::testing::WriteFileOrDie;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// An llm.c token file, read independently of the writer.
struct TokenFile {
  int32_t magic = 0, version = 0, count = 0;
  bool header_rest_zero = true;
  std::vector<int> tokens;
};

TokenFile ParseTokenFile(const std::string& bytes) {
  TokenFile f;
  EXPECT_GE(bytes.size(), 1024u);
  if (bytes.size() < 1024) return f;
  auto le32 = [&](size_t i) {
    return static_cast<int32_t>(
        static_cast<uint8_t>(bytes[4 * i]) | (static_cast<uint8_t>(bytes[4 * i + 1]) << 8) |
        (static_cast<uint8_t>(bytes[4 * i + 2]) << 16) |
        (static_cast<uint32_t>(static_cast<uint8_t>(bytes[4 * i + 3])) << 24));
  };
  f.magic = le32(0);
  f.version = le32(1);
  f.count = le32(2);
  for (size_t i = 3; i < 256; ++i) f.header_rest_zero = f.header_rest_zero && le32(i) == 0;
  if (f.magic == 20240801) {  // Llama 3's layout: uint32 tokens
    EXPECT_EQ((bytes.size() - 1024) % 4, 0u);
    for (size_t i = 256; 4 * i + 3 < bytes.size(); ++i) f.tokens.push_back(le32(i));
    return f;
  }
  EXPECT_EQ((bytes.size() - 1024) % 2, 0u);
  for (size_t i = 1024; i + 1 < bytes.size(); i += 2) {
    f.tokens.push_back(static_cast<uint8_t>(bytes[i]) | (static_cast<uint8_t>(bytes[i + 1]) << 8));
  }
  return f;
}

class TokenizeVerbTest : public ::testing::Test {
 protected:
  void SkipWithoutGpt2() {
    const std::string missing = pipetrain::testing::Gpt2VocabMissing();
    if (!missing.empty()) GTEST_SKIP() << missing;
  }
  void SkipWithoutLlama3() {
    const std::string missing = pipetrain::testing::Llama3VocabMissing();
    if (!missing.empty()) GTEST_SKIP() << missing;
  }
  TempDir dir_;
};

TEST_F(TokenizeVerbTest, BytesWritesAnLlmcFile) {
  const std::string text = dir_.File("a.txt"), out = dir_.File("a.bin");
  WriteFileOrDie(text, std::string("hi\n\0\xFF", 5));
  const CliRun r = Cli({"tokenize", "--tokenizer", "bytes", "--out", out, text});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("wrote 5 tokens to " + out));
  EXPECT_THAT(r.out, HasSubstr("5 bytes read"));
  EXPECT_THAT(r.out, HasSubstr("MB/s"));
  EXPECT_THAT(r.out, HasSubstr("tokens/s"));
  const TokenFile f = ParseTokenFile(ReadFileOrDie(out));
  EXPECT_EQ(f.magic, 20240520);
  EXPECT_EQ(f.version, 1);
  EXPECT_EQ(f.count, 5);
  EXPECT_TRUE(f.header_rest_zero);
  EXPECT_THAT(f.tokens, ElementsAre('h', 'i', '\n', 0, 255));
  EXPECT_THAT(ListFolder(dir_.path()), ElementsAre("a.bin", "a.txt"));  // no temp file left
}

TEST_F(TokenizeVerbTest, Gpt2WritesTheIdsOfEveryFileInOrder) {
  SkipWithoutGpt2();
  const std::string a = dir_.File("a.txt"), b = dir_.File("b.txt"), out = dir_.File("t.bin");
  WriteFileOrDie(a, "Hello world");
  WriteFileOrDie(b, " the");
  const CliRun r = Cli({"tokenize", "--tokenizer", "gpt2", "--out", out, a, b});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const TokenFile f = ParseTokenFile(ReadFileOrDie(out));
  EXPECT_EQ(f.magic, 20240520);
  EXPECT_EQ(f.count, 3);
  EXPECT_THAT(f.tokens, ElementsAre(15496, 995, 262));
}

TEST_F(TokenizeVerbTest, EotGoesBetweenFilesOnly) {
  SkipWithoutGpt2();
  const std::string a = dir_.File("a.txt"), b = dir_.File("b.txt"), c = dir_.File("c.txt");
  WriteFileOrDie(a, "Hello world");
  WriteFileOrDie(b, "");
  WriteFileOrDie(c, " the");
  const std::string out = dir_.File("t.bin");
  const CliRun r = Cli({"tokenize", "--tokenizer", "gpt2", "--eot", "--out", out, a, b, c});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  EXPECT_THAT(r.out, HasSubstr("2 end-of-text tokens"));
  const TokenFile f = ParseTokenFile(ReadFileOrDie(out));
  EXPECT_EQ(f.count, 5);
  EXPECT_THAT(f.tokens, ElementsAre(15496, 995, 50256, 50256, 262));
}

// llm.c's Llama 3 layout (magic 20240801, version 7, uint32); --bos starts every file
// with <|begin_of_text|>, --eot puts <|end_of_text|> between files; special tokens' text
// in a file is ordinary text.
TEST_F(TokenizeVerbTest, Llama3WritesUint32TokensWithBosAndEot) {
  SkipWithoutLlama3();
  const std::string a = dir_.File("a.txt"), b = dir_.File("b.txt"), out = dir_.File("t.bin");
  WriteFileOrDie(a, "Hello world");
  WriteFileOrDie(b, "<|eot_id|>");
  const CliRun plain = Cli({"tokenize", "--tokenizer", "llama3", "--out", out, a});
  ASSERT_EQ(plain.code, kExitOk) << plain.err;
  TokenFile f = ParseTokenFile(ReadFileOrDie(out));
  EXPECT_EQ(f.magic, 20240801);
  EXPECT_EQ(f.version, 7);
  EXPECT_EQ(f.count, 2);
  EXPECT_TRUE(f.header_rest_zero);
  EXPECT_THAT(f.tokens, ElementsAre(9906, 1917));

  const CliRun r =
      Cli({"tokenize", "--tokenizer", "llama3", "--bos", "--eot", "--json", "--out", out, a, b});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["bos_tokens"], 2);
  EXPECT_EQ(j["eot_tokens"], 1);
  f = ParseTokenFile(ReadFileOrDie(out));
  EXPECT_EQ(f.count, 12);
  EXPECT_THAT(f.tokens, ElementsAre(128000, 9906, 1917, 128001, 128000, 27, 91, 68, 354, 851, 91,
                                    29));
}

TEST_F(TokenizeVerbTest, BosNeedsATokenizerThatHasOne) {
  SkipWithoutGpt2();
  const std::string text = dir_.File("a.txt"), out = dir_.File("a.bin");
  WriteFileOrDie(text, "abc");
  for (const char* name : {"bytes", "gpt2"}) {
    const CliRun r = Cli({"tokenize", "--tokenizer", name, "--bos", "--out", out, text});
    EXPECT_EQ(r.code, kExitUsage) << name;
    EXPECT_THAT(r.err, HasSubstr(std::string("--bos: the ") + name +
                                 " tokenizer has no begin-of-text token (llama3 has one)"));
  }
  EXPECT_THAT(ListFolder(dir_.path()), ElementsAre("a.txt"));
}

TEST_F(TokenizeVerbTest, JsonIsOneObjectAndNothingElse) {
  const std::string text = dir_.File("a.txt"), out = dir_.File("a.bin");
  WriteFileOrDie(text, "abc");
  const CliRun r = Cli({"tokenize", "--tokenizer", "bytes", "--json", "--out", out, text});
  ASSERT_EQ(r.code, kExitOk) << r.err;
  ASSERT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line: " << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j["tokens"], 3);
  EXPECT_EQ(j["bytes"], 3);
  EXPECT_EQ(j["files"], 1);
  EXPECT_EQ(j["eot_tokens"], 0);
  EXPECT_EQ(j["tokenizer"], "bytes");
  EXPECT_EQ(j["out"], out);
  EXPECT_EQ(j["threads"], 1);
  for (const char* key : {"seconds", "mb_per_s", "tokens_per_s"}) {
    EXPECT_TRUE(j[key].is_number()) << key;
  }
}

TEST_F(TokenizeVerbTest, ThreadsDoNotChangeTheFile) {
  SkipWithoutGpt2();
  std::string text;
  for (int i = 0; i < 20000; ++i) {
    text += "Line " + std::to_string(i) + " has  spaces,\ttabs and caf\xC3\xA9s.  \n";
    if (i % 7 == 0) text += "\n   indented\n";
  }
  const std::string in = dir_.File("big.txt");
  WriteFileOrDie(in, text);
  const CliRun one = Cli({"tokenize", "--tokenizer", "gpt2", "--out", dir_.File("1.bin"), in});
  const CliRun four =
      Cli({"tokenize", "--tokenizer", "gpt2", "--threads", "4", "--out", dir_.File("4.bin"), in});
  ASSERT_EQ(one.code, kExitOk) << one.err;
  ASSERT_EQ(four.code, kExitOk) << four.err;
  EXPECT_THAT(four.out, HasSubstr("on 4 threads"));
  const std::string a = ReadFileOrDie(dir_.File("1.bin")), b = ReadFileOrDie(dir_.File("4.bin"));
  EXPECT_GT(a.size(), 1024u + 2 * 100000);
  EXPECT_TRUE(a == b) << "the 4-thread file differs";
}

TEST_F(TokenizeVerbTest, BadInputExits2NamingTheFileOrFlag) {
  const std::string text = dir_.File("a.txt"), out = dir_.File("a.bin");
  WriteFileOrDie(text, "abc");
  const std::string missing = dir_.File("missing.txt");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--tokenizer", "bytes", "--out", out, text, missing}, "cannot read " + missing},
      {{"--tokenizer", "bytes", "--out", out, dir_.path()}, dir_.path()},
      {{"--tokenizer", "gpt9", "--out", out, text}, "--tokenizer: unknown tokenizer 'gpt9'"},
      {{"--out", out, text}, "--tokenizer NAME is required"},
      {{"--tokenizer", "bytes", "--eot", "--out", out, text}, "--eot: the bytes tokenizer"},
      {{"--tokenizer", "bytes", text}, "--out FILE.bin is required"},
      {{"--tokenizer", "bytes", "--out", out}, "at least one TEXT"},
      {{"--tokenizer", "bytes", "--threads", "0", "--out", out, text}, "--threads must be >= 1"},
      {{"--tokenizer", "gpt2", "--tokenizer-dir", dir_.File("nowhere"), "--out", out, text},
       dir_.File("nowhere/encoder.json")},
      {{"--tokenizer", "bytes", "--bogus", "--out", out, text}, "--bogus"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"tokenize"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    const CliRun r = Cli(args);
    EXPECT_EQ(r.code, kExitUsage) << c.message << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
  // Nothing was written by any of them.
  EXPECT_THAT(ListFolder(dir_.path()), ElementsAre("a.txt"));
}

TEST_F(TokenizeVerbTest, UnwritableOutputExits1) {
  const std::string text = dir_.File("a.txt");
  WriteFileOrDie(text, "abc");
  const std::string out = dir_.File("no/such/folder/a.bin");
  const CliRun r = Cli({"tokenize", "--tokenizer", "bytes", "--out", out, text});
  EXPECT_EQ(r.code, kExitJobFailed);
  EXPECT_THAT(r.err, HasSubstr(out));
}

TEST_F(TokenizeVerbTest, HelpDescribesTheFormatAndFlags) {
  const CliRun r = Cli({"tokenize", "--help"});
  ASSERT_EQ(r.code, kExitOk);
  for (const char* s : {"20240520", "uint16", "--tokenizer-dir", "--threads", "--eot", "--json",
                        "--out", "deploy/install-deps.sh", "PIPETRAIN_TOKENIZER_DIR", "llama3",
                        "20240801", "version 7", "uint32", "--bos", "<|begin_of_text|>", "128000",
                        "128001", "PIPETRAIN_LLAMA3_TOKENIZER_DIR", "llama3-tokenizer-js"}) {
    EXPECT_THAT(r.out, HasSubstr(s));
  }
  EXPECT_THAT(Cli({"--help"}).out, HasSubstr("tokenize"));
}

}  // namespace
}  // namespace pipetrain::client
