#include "common/safetensors.h"

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/temp_files.h"

namespace pipetrain::common {
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

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

Tensor RandomTensor(DType dtype, std::vector<int64_t> shape, std::mt19937& rng) {
  auto t = Tensor::Create(dtype, std::move(shape));
  EXPECT_THAT(t, IsOk());
  for (std::byte& b : t->bytes()) b = static_cast<std::byte>(rng() & 0xff);
  return *std::move(t);
}

bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.num_bytes() == b.num_bytes() &&
         (a.num_bytes() == 0 || std::memcmp(a.bytes().data(), b.bytes().data(), a.num_bytes()) == 0);
}

// A tensor of every dtype, of assorted ranks, plus a scalar and two empty tensors.
std::vector<NamedTensor> Assortment(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<NamedTensor> out;
  out.push_back({"f32.matrix", RandomTensor(DType::kF32, {3, 5}, rng)});
  out.push_back({"bf16.vector", RandomTensor(DType::kBF16, {7}, rng)});
  out.push_back({"f16.cube", RandomTensor(DType::kF16, {2, 3, 2}, rng)});
  out.push_back({"empty.rows", RandomTensor(DType::kF32, {0, 4}, rng)});
  out.push_back({"i32.scalar", RandomTensor(DType::kI32, {}, rng)});
  out.push_back({"i64.pair", RandomTensor(DType::kI64, {2}, rng)});
  out.push_back({"u8.odd", RandomTensor(DType::kU8, {3, 3}, rng)});
  out.push_back({"empty.u8", RandomTensor(DType::kU8, {0}, rng)});
  out.push_back({"f32.after_odd", RandomTensor(DType::kF32, {1, 2, 1, 2}, rng)});
  return out;
}

std::vector<SafetensorsView> Views(const std::vector<NamedTensor>& tensors) {
  std::vector<SafetensorsView> views;
  for (const NamedTensor& t : tensors) views.push_back(ViewOf(t.name, t.tensor));
  return views;
}

void ExpectSameContents(const SafetensorsContents& got, const std::vector<NamedTensor>& want) {
  ASSERT_EQ(got.tensors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    // Read back in data order, which is the order written.
    EXPECT_EQ(got.tensors[i].name, want[i].name);
    EXPECT_TRUE(SameTensor(got.tensors[i].tensor, want[i].tensor)) << want[i].name;
    ASSERT_NE(got.Find(want[i].name), nullptr);
  }
}

uint64_t HeaderLength(const std::string& bytes) {
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  return n;
}

// A safetensors byte string from a hand-written header and `data_bytes` zero bytes;
// `length` overrides the length prefix.
std::string Raw(const std::string& header, size_t data_bytes,
                std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(header.size());
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsTest, DTypeNamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32, DType::kI64, DType::kU8}) {
    EXPECT_EQ(DTypeFromSafetensorsName(SafetensorsDTypeName(d)), d);
  }
  EXPECT_EQ(SafetensorsDTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeFromSafetensorsName("F64"), std::nullopt);
  EXPECT_EQ(DTypeFromSafetensorsName("f32"), std::nullopt);
}

TEST(SafetensorsTest, InMemoryRoundTripOfEveryDTypeWithMetadata) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::vector<NamedTensor> tensors = Assortment(seed);
    const SafetensorsMetadata metadata = {{"format", "pt"}, {"note", "a \"quoted\" value"}};
    auto bytes = SerializeSafetensors(Views(tensors), metadata);
    ASSERT_THAT(bytes, IsOk());
    auto back = ParseSafetensors(*bytes);
    ASSERT_THAT(back, IsOk());
    ExpectSameContents(*back, tensors);
    EXPECT_EQ(back->metadata, metadata);
  }
}

TEST(SafetensorsTest, FileRoundTripAndHeaderOnlyRead) {
  TempDir dir;
  const std::string path = dir.File("t.safetensors");
  const std::vector<NamedTensor> tensors = Assortment(7);
  ASSERT_THAT(WriteSafetensorsFile(path, Views(tensors), {{"k", "v"}}), IsOk());
  auto back = ReadSafetensorsFile(path);
  ASSERT_THAT(back, IsOk());
  ExpectSameContents(*back, tensors);
  EXPECT_EQ(back->metadata, (SafetensorsMetadata{{"k", "v"}}));
  // The file and the in-memory form are the same bytes.
  EXPECT_EQ(ReadFileOrDie(path), *SerializeSafetensors(Views(tensors), {{"k", "v"}}));

  auto header = ReadSafetensorsHeader(path);
  ASSERT_THAT(header, IsOk());
  ASSERT_EQ(header->entries.size(), tensors.size());
  const SafetensorsEntry* e = header->Find("f16.cube");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dtype, DType::kF16);
  EXPECT_EQ(e->shape, (std::vector<int64_t>{2, 3, 2}));
  EXPECT_EQ(e->end - e->begin, 24u);
  EXPECT_EQ(header->data_offset + header->data_size, ReadFileOrDie(path).size());
  // The header of the same bytes in memory is the file's, and places each tensor.
  const std::string bytes = ReadFileOrDie(path);
  auto parsed = ParseSafetensorsHeader(bytes, "in memory");
  ASSERT_THAT(parsed, IsOk());
  EXPECT_EQ(parsed->metadata, header->metadata);
  EXPECT_EQ(parsed->data_offset, header->data_offset);
  ASSERT_EQ(parsed->entries.size(), header->entries.size());
  for (size_t i = 0; i < parsed->entries.size(); ++i) {
    const SafetensorsEntry& p = parsed->entries[i];
    EXPECT_EQ(p.name, header->entries[i].name);
    EXPECT_EQ(p.begin, header->entries[i].begin);
    const Tensor* t = back->Find(p.name);
    ASSERT_NE(t, nullptr) << p.name;
    EXPECT_EQ(bytes.substr(parsed->data_offset + p.begin, p.end - p.begin),
              std::string(reinterpret_cast<const char*>(t->bytes().data()), t->num_bytes()))
        << p.name;
  }
  EXPECT_THAT(ParseSafetensorsHeader(bytes.substr(0, 20), "cut"),
              StatusIs(kInvalid, HasSubstr("cut: truncated")));

  auto some = ReadSafetensorsFile(path, [](const std::string& n) { return n.starts_with("f32."); });
  ASSERT_THAT(some, IsOk());
  ASSERT_EQ(some->tensors.size(), 2u);
  EXPECT_EQ(some->tensors[0].name, "f32.matrix");
  EXPECT_EQ(some->tensors[1].name, "f32.after_odd");
  EXPECT_TRUE(SameTensor(some->tensors[1].tensor, tensors.back().tensor));
}

TEST(SafetensorsTest, LayoutFollowsTheReferenceImplementation) {
  const std::vector<NamedTensor> tensors = Assortment(11);
  auto bytes = SerializeSafetensors(Views(tensors), {{"format", "pt"}});
  ASSERT_THAT(bytes, IsOk());
  const uint64_t n = HeaderLength(*bytes);
  EXPECT_EQ((8 + n) % 8, 0u) << "data must start 8-byte aligned";
  const std::string header = bytes->substr(8, n);
  EXPECT_EQ(header.front(), '{');
  // Padding is spaces after the JSON; metadata comes first, then tensors in order.
  const size_t close = header.find_last_of('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
  EXPECT_LT(header.size() - (close + 1), 8u) << "at most 7 spaces of padding";
  EXPECT_EQ(header.rfind("{\"__metadata__\":{\"format\":\"pt\"},\"f32.matrix\":", 0), 0u) << header;
  const nlohmann::json json = nlohmann::json::parse(header);
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const nlohmann::json& entry = json.at(t.name);
    EXPECT_EQ(entry.at("dtype"), SafetensorsDTypeName(t.tensor.dtype()));
    EXPECT_EQ(entry.at("shape").get<std::vector<int64_t>>(), t.tensor.shape());
    EXPECT_EQ(entry.at("data_offsets"), nlohmann::json::array({offset, offset + t.tensor.num_bytes()}));
    // An empty tensor's data() may be null, which memcmp must not get even for 0 bytes
    // (UBSan's nonnull-attribute check, tests/sanitize.sh).
    if (t.tensor.num_bytes() > 0) {
      EXPECT_EQ(std::memcmp(bytes->data() + 8 + n + offset, t.tensor.bytes().data(),
                            t.tensor.num_bytes()), 0);
    }
    offset += t.tensor.num_bytes();
  }
  EXPECT_EQ(bytes->size(), 8 + n + offset);
}

TEST(SafetensorsTest, EmptyFileWithoutTensorsOrMetadata) {
  auto bytes = SerializeSafetensors({}, {});
  ASSERT_THAT(bytes, IsOk());
  EXPECT_EQ(*bytes, Raw("{}      ", 0));
  auto back = ParseSafetensors(*bytes);
  ASSERT_THAT(back, IsOk());
  EXPECT_TRUE(back->tensors.empty());
  EXPECT_TRUE(back->metadata.empty());
}

TEST(SafetensorsTest, AtomicWriteReplacesAndLeavesNoTempFile) {
  TempDir dir;
  const std::string path = dir.File("model.safetensors");
  ASSERT_THAT(WriteSafetensorsFile(path, Views(Assortment(1))), IsOk());
  const std::vector<NamedTensor> second = Assortment(2);
  ASSERT_THAT(WriteSafetensorsFile(path, Views(second)), IsOk());
  EXPECT_THAT(ListFolder(dir.path()), ElementsAre("model.safetensors"));
  auto back = ReadSafetensorsFile(path);
  ASSERT_THAT(back, IsOk());
  ExpectSameContents(*back, second);

  // A rejected write changes nothing and leaves nothing behind.
  std::vector<SafetensorsView> bad = Views(second);
  bad[0].shape = {99};
  EXPECT_THAT(WriteSafetensorsFile(path, bad),
              StatusIs(kInvalid, AllOf(HasSubstr(path), HasSubstr("f32.matrix"))));
  EXPECT_THAT(ListFolder(dir.path()), ElementsAre("model.safetensors"));
  back = ReadSafetensorsFile(path);
  ASSERT_THAT(back, IsOk());
  ExpectSameContents(*back, second);
}

TEST(SafetensorsTest, WriterRejectsMalformedInput) {
  std::mt19937 rng(5);
  const Tensor t = RandomTensor(DType::kF32, {2, 2}, rng);
  auto serialize = [](std::vector<SafetensorsView> views) { return SerializeSafetensors(views); };
  EXPECT_THAT(serialize({ViewOf("a", t), ViewOf("a", t)}),
              StatusIs(kInvalid, HasSubstr("tensor 'a' is given twice")));
  EXPECT_THAT(serialize({ViewOf("", t)}), StatusIs(kInvalid, HasSubstr("empty name")));
  EXPECT_THAT(serialize({ViewOf("__metadata__", t)}), StatusIs(kInvalid, HasSubstr("reserved")));
  SafetensorsView wrong = ViewOf("w", t);
  wrong.shape = {3, 2};
  EXPECT_THAT(serialize({wrong}),
              StatusIs(kInvalid, HasSubstr("tensor 'w': shape (3, 2) of F32 needs 24 bytes but 16")));
  SafetensorsView no_dtype = ViewOf("d", t);
  no_dtype.dtype = DType::kUnspecified;
  EXPECT_THAT(serialize({no_dtype}), StatusIs(kInvalid, HasSubstr("tensor 'd': dtype")));
  SafetensorsView negative = ViewOf("n", t);
  negative.shape = {-1, 4};
  EXPECT_THAT(serialize({negative}), StatusIs(kInvalid, HasSubstr("negative")));
}

TEST(SafetensorsTest, RejectsTruncatedInput) {
  EXPECT_THAT(ParseSafetensors("", "empty.st"),
              StatusIs(kInvalid, HasSubstr("empty.st: truncated: 0 bytes")));
  EXPECT_THAT(ParseSafetensors(std::string(5, '\0'), "short.st"),
              StatusIs(kInvalid, HasSubstr("short.st: truncated")));
  // The header length runs past the end.
  EXPECT_THAT(ParseSafetensors(Raw("{}", 0, 64), "cut.st"),
              StatusIs(kInvalid, HasSubstr("cut.st: truncated: header length 64 runs past")));
  // The data is cut short: offsets point past the end.
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  EXPECT_THAT(ParseSafetensors(Raw(header, 12), "data.st"),
              StatusIs(kInvalid, AllOf(HasSubstr("data.st: tensor 'w'"),
                                       HasSubstr("outside the data section of 12 bytes"))));
}

TEST(SafetensorsTest, RefusesAHugeHeaderLengthWithoutAllocating) {
  // 2^60 would be an exabyte: refused on the numbers alone.
  EXPECT_THAT(ParseSafetensors(Raw("{}", 0, uint64_t{1} << 60), "huge.st"),
              StatusIs(kInvalid, HasSubstr("huge.st: header length 1152921504606846976 exceeds")));
  TempDir dir;
  const std::string path = dir.File("huge.safetensors");
  WriteFileOrDie(path, Raw("{}", 0, uint64_t{1} << 60));
  EXPECT_THAT(ReadSafetensorsFile(path), StatusIs(kInvalid, HasSubstr(path + ": header length")));
  // A huge shape is refused by its offsets before any tensor is allocated.
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[1099511627776,1048576],"data_offsets":[0,4]}})";
  EXPECT_THAT(ParseSafetensors(Raw(header, 4)), StatusIs(kInvalid, HasSubstr("tensor 'w'")));
}

TEST(SafetensorsTest, RejectsBadJson) {
  EXPECT_THAT(ParseSafetensors(Raw("{\"w\": [1, 2", 0), "bad.st"),
              StatusIs(kInvalid, HasSubstr("bad.st: header is not valid JSON")));
  EXPECT_THAT(ParseSafetensors(Raw("[1, 2]  ", 0), "arr.st"),
              StatusIs(kInvalid, HasSubstr("arr.st: header is not a JSON object but array")));
  EXPECT_THAT(ParseSafetensors(Raw("{} trailing", 0)),
              StatusIs(kInvalid, HasSubstr("not valid JSON")));
}

struct RejectCase {
  std::string header;
  size_t data_bytes;
  std::string message;
};

TEST(SafetensorsTest, RejectsEveryMalformedEntryNamingTensorAndField) {
  const std::vector<RejectCase> cases = {
      {R"({"w":[1,2]})", 0, "header entry 'w' is not an object"},
      {R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8,
       "tensor 'w': unknown dtype \"F64\""},
      {R"({"w":{"dtype":3,"shape":[1],"data_offsets":[0,4]}})", 4,
       "tensor 'w': dtype is not a string"},
      {R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4, "tensor 'w': missing field 'dtype'"},
      {R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4, "tensor 'w': missing field 'shape'"},
      {R"({"w":{"dtype":"F32","shape":[1]}})", 4, "tensor 'w': missing field 'data_offsets'"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1}})", 4,
       "tensor 'w': unknown field 'extra'"},
      {R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4,
       "tensor 'w': shape holds -1"},
      {R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4,
       "tensor 'w': shape holds 1.5"},
      {R"({"w":{"dtype":"F32","shape":2,"data_offsets":[0,4]}})", 4,
       "tensor 'w': shape is not an array"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4,
       "tensor 'w': data_offsets must hold [begin, end]"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", 4,
       "tensor 'w': data_offsets holds \"4\""},
      // Shape and offsets disagree.
      {R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 20,
       "tensor 'w': data_offsets [0, 20) span 20 bytes but F32 shape (2, 3) needs 24"},
      // Offsets outside the data.
      {R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}})", 8,
       "tensor 'w': data_offsets [8, 12) lie outside the data section of 8 bytes"},
      // Out of order: the end before the begin.
      {R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4,
       "tensor 'w': data_offsets [4, 0] end before they begin"},
      // Overlap.
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "tensor 'b': data_offsets [4, 12) overlap tensor 'a' which ends at 8"},
      // Gaps: before the first tensor, between two, and after the last.
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8,
       "tensor 'a': data_offsets [4, 8) leave a gap of 4 bytes after the header"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       12, "tensor 'b': data_offsets [8, 12) leave a gap of 4 bytes after tensor 'a'"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 6,
       "2 bytes after the last tensor 'a' belong to no tensor"},
      // Duplicate names (JSON parsers would silently keep one).
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "tensor 'a' appears twice in the header"},
      {R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", 4,
       "field 'dtype' appears twice in header entry 'a'"},
      // Metadata must be a string-to-string map.
      {R"({"__metadata__":{"n":3}})", 0, "'__metadata__' value of 'n' is not a string"},
      {R"({"__metadata__":"x"})", 0, "'__metadata__' is not an object"},
  };
  for (const RejectCase& c : cases) {
    EXPECT_THAT(ParseSafetensors(Raw(c.header, c.data_bytes), "case.st"),
                StatusIs(kInvalid, AllOf(HasSubstr("case.st: "), HasSubstr(c.message))))
        << c.header;
  }
}

TEST(SafetensorsTest, EveryTruncationIsRejectedAndCorruptionNeverCrashes) {
  const std::string bytes = *SerializeSafetensors(Views(Assortment(13)), {{"format", "pt"}});
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_THAT(ParseSafetensors(absl::string_view(bytes).substr(0, n)), StatusIs(kInvalid))
        << "prefix of " << n << " bytes";
  }
  // Random single-byte corruptions anywhere: a clean error or, where the byte does not
  // matter to the format (inside a name, or in the data), a successful parse.
  std::mt19937 rng(17);
  for (int i = 0; i < 2000; ++i) {
    std::string corrupt = bytes;
    corrupt[rng() % corrupt.size()] = static_cast<char>(rng() & 0xff);
    auto result = ParseSafetensors(corrupt);
    if (!result.ok()) {
      EXPECT_EQ(result.status().code(), kInvalid) << result.status();
    }
  }
}

TEST(SafetensorsTest, FileErrorsNameTheFile) {
  TempDir dir;
  const std::string missing = dir.File("missing.safetensors");
  EXPECT_THAT(ReadSafetensorsFile(missing),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr(missing)));
  EXPECT_THAT(ReadSafetensorsFile(dir.path()), StatusIs(kInvalid, HasSubstr("not a regular file")));
  // A valid file cut short in its data.
  const std::string path = dir.File("cut.safetensors");
  const std::vector<NamedTensor> tensors = Assortment(3);
  std::string bytes = *SerializeSafetensors(Views(tensors));
  WriteFileOrDie(path, bytes.substr(0, bytes.size() - 3));
  EXPECT_THAT(ReadSafetensorsFile(path),
              StatusIs(kInvalid, AllOf(HasSubstr(path), HasSubstr("f32.after_odd"),
                                       HasSubstr("outside the data section"))));
  WriteFileOrDie(path, bytes.substr(0, 20));
  EXPECT_THAT(ReadSafetensorsFile(path), StatusIs(kInvalid, HasSubstr(path + ": truncated")));
}

// The fixture written by tests/testdata/make_gpt_fixture.py with its own minimal
// writer: every tensor reads back with the values the script recorded.
TEST(SafetensorsTest, ReadsFilesWrittenByThePythonFixtureScriptExactly) {
  const std::string dir = PIPETRAIN_TESTDATA_DIR "/gpt_tiny/";
  const nlohmann::json expected =
      nlohmann::json::parse(ReadFileOrDie(dir + "expected.json"));
  for (const auto& [file, key] : {std::pair{"weights.safetensors", "weight"},
                                  std::pair{"grads.safetensors", "grad"}}) {
    auto contents = ReadSafetensorsFile(dir + file);
    ASSERT_THAT(contents, IsOk());
    EXPECT_EQ(contents->metadata.at("d_model"), "16");
    ASSERT_EQ(contents->tensors.size(), expected.at("tensors").size()) << file;
    for (const NamedTensor& t : contents->tensors) {
      SCOPED_TRACE(absl::StrCat(file, " ", t.name));
      const nlohmann::json& want = expected.at("tensors").at(t.name);
      ASSERT_EQ(t.tensor.dtype(), DType::kF32);
      EXPECT_EQ(t.tensor.shape(), want.at("shape").get<std::vector<int64_t>>());
      std::span<const float> values = t.tensor.data<float>();
      ASSERT_FALSE(values.empty());
      // float32 values printed as float64 by Python: equal exactly.
      EXPECT_EQ(static_cast<double>(values.front()), want.at(key).at("first").get<double>());
      EXPECT_EQ(static_cast<double>(values.back()), want.at(key).at("last").get<double>());
      double sum = 0, abs_sum = 0;
      for (float v : values) {
        sum += v;
        abs_sum += std::abs(v);
      }
      EXPECT_NEAR(sum, want.at(key).at("sum").get<double>(), 1e-12 * abs_sum + 1e-300);
    }
  }
}

}  // namespace
}  // namespace pipetrain::common
