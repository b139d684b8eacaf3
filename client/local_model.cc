#include "client/local_model.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/user_path.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "pipetrain/v1/model.pb.h"

namespace pipetrain::client {
namespace {

constexpr const char* kRequiredFields[] = {"seq_len", "d_model", "n_heads", "n_layers"};
constexpr const char* kAllFields[] = {
    "vocab_size",   "seq_len",    "d_model",  "n_heads",    "n_layers", "tie_embeddings",
    "architecture", "n_kv_heads", "ffn_dim",  "rope_theta", "norm_eps", "rope_scaling"};
constexpr char kExample[] = R"({"seq_len":64,"d_model":64,"n_heads":4,"n_layers":2})";

absl::Status Invalid(const std::string& source, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--model ", source, ": ", what));
}

// Why `text` is not JSON, in protobuf's words (nlohmann's parser reports nothing
// without exceptions).
std::string JsonSyntaxError(const std::string& text) {
  pipetrain::v1::ModelConfig ignored;
  const auto status = google::protobuf::util::JsonStringToMessage(text, &ignored);
  if (status.ok()) return "not valid JSON";
  // Its first line; the rest is a picture of where the error is.
  absl::string_view message(status.message().data(), status.message().size());
  return absl::StrCat("not valid JSON: ", message.substr(0, message.find('\n')));
}

}  // namespace

void AddModelFlag(common::FlagSet& flags, std::string* target) {
  flags.AddString("model", target,
                  absl::StrCat("a model JSON file or inline JSON: seq_len, d_model, n_heads, "
                               "n_layers (vocab_size defaults to ",
                               kDefaultVocabSize, "; tie_embeddings to false; architecture "
                               "\"gpt2\" (default) or \"llama\", which also takes n_kv_heads, "
                               "ffn_dim, rope_theta, norm_eps and rope_scaling)"),
                  "JSON");
  flags.MarkRequired("model");
}

absl::StatusOr<model::TransformerConfig> ParseModelArg(const std::string& arg) {
  const size_t first = arg.find_first_not_of(" \t\r\n");
  const bool inline_json = first != std::string::npos && (arg[first] == '{' || arg[first] == '[');
  std::string text = arg;
  std::string source = "(inline JSON)";
  if (!inline_json) {
    if (arg.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model is required: a JSON file or inline JSON like '", kExample, "'"));
    }
    source = arg;
    auto contents = ReadFile(arg);
    if (!contents.ok()) {
      return Invalid(
          source, absl::StrCat(contents.status().message(),
                               " (give a model JSON file, or inline JSON like '", kExample, "')"));
    }
    text = *std::move(contents);
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid(source, JsonSyntaxError(text));
  if (!j.is_object()) {
    return Invalid(source, absl::StrCat("must be a JSON object like ", kExample));
  }
  std::vector<std::string> unknown;
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* f : kAllFields) known = known || key == f;
    if (!known) unknown.push_back(absl::StrCat("'", key, "'"));
  }
  if (!unknown.empty()) {
    return Invalid(source, absl::StrCat("unknown field", unknown.size() > 1 ? "s " : " ",
                                        absl::StrJoin(unknown, ", "), " (the fields are ",
                                        absl::StrJoin(kAllFields, ", "), ")"));
  }
  for (const char* f : kRequiredFields) {
    if (!j.contains(f)) {
      return Invalid(source, absl::StrCat("model.", f, " is missing (required: ",
                                          absl::StrJoin(kRequiredFields, ", "),
                                          "; vocab_size defaults to ", kDefaultVocabSize, ")"));
    }
  }
  auto field = [&](const char* name, int fallback) -> absl::StatusOr<int> {
    if (!j.contains(name)) return fallback;
    const nlohmann::json& v = j.at(name);
    if (!v.is_number_integer() || v.get<int64_t>() <= 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Invalid(
          source, absl::StrCat("model.", name, " must be a positive integer (got ", v.dump(), ")"));
    }
    return static_cast<int>(v.get<int64_t>());
  };
  model::TransformerConfig config;
  ASSIGN_OR_RETURN(config.vocab_size, field("vocab_size", kDefaultVocabSize));
  ASSIGN_OR_RETURN(config.seq_len, field("seq_len", 0));
  ASSIGN_OR_RETURN(config.d_model, field("d_model", 0));
  ASSIGN_OR_RETURN(config.n_heads, field("n_heads", 0));
  ASSIGN_OR_RETURN(config.n_layers, field("n_layers", 0));
  if (j.contains("tie_embeddings")) {
    if (!j.at("tie_embeddings").is_boolean()) {
      return Invalid(source, absl::StrCat("model.tie_embeddings must be true or false (got ",
                                          j.at("tie_embeddings").dump(), ")"));
    }
    config.tie_embeddings = j.at("tie_embeddings").get<bool>();
  }
  // The architecture and its own fields, read as a job spec's model section reads them.
  pipetrain::v1::ModelConfig proto;
  if (auto s = google::protobuf::util::JsonStringToMessage(text, &proto); !s.ok()) {
    return Invalid(source, std::string(s.message()));
  }
  if (absl::Status s = model::FamilyFieldsFromProto(proto, config); !s.ok()) {
    return Invalid(source, s.message());
  }
  if (absl::Status s = model::ValidateConfig(config); !s.ok()) {
    return Invalid(source, s.message());
  }
  return config;
}

absl::StatusOr<std::string> ReadFile(const std::string& path, int64_t max_bytes) {
  // Checked before it is opened: a FIFO or a device named here would block or never end.
  if (max_bytes < 0) return common::ReadRegularFile(path, common::kMaxTextFileBytes, "");
  // Only the first max_bytes are read, so the file itself may be of any size.
  ASSIGN_OR_RETURN(common::ReadOnlyFile file,
                   common::OpenRegularFile(path, std::numeric_limits<int64_t>::max(), ""));
  // Never more than the file holds, however large max_bytes is.
  std::string contents(static_cast<size_t>(std::min(max_bytes, file.size())), '\0');
  size_t have = 0;
  while (have < contents.size()) {
    const ssize_t n = ::read(file.fd(), contents.data() + have, contents.size() - have);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(
          absl::StrCat("error while reading ", path, ": ", std::strerror(errno)));
    }
    have += static_cast<size_t>(n);
  }
  contents.resize(have);
  return contents;
}

}  // namespace pipetrain::client
