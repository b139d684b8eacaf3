// Fuzzes the checkpoint loaders (common/model): ParseCheckpoint (our per-stage and
// whole-model files), LoadWholeCheckpoint on the same bytes as a file, and a Hugging
// Face GPT-2 folder (config.json + model.safetensors, hf_gpt2). The input is the
// config.json text, a NUL byte, then the safetensors bytes; without a NUL it is all
// safetensors bytes and the folder gets a small valid config.json. Round trips that
// must hold: a checkpoint that parses, serialized again, parses to the same checkpoint;
// with its precision rewritten (WithPrecision, what the coordinator does to a stage's
// export) it parses to the same checkpoint in that precision.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include "absl/strings/string_view.h"

#include "common/model/checkpoint.h"
#include "common/model/checkpoint_folder.h"
#include "common/model/hf_folder.h"
#include "common/model/hf_gpt2.h"
#include "tests/fuzz/fuzz_temp_file.h"

namespace model = pipetrain::model;

namespace {

constexpr char kDefaultConfig[] =
    R"({"model_type": "gpt2", "vocab_size": 16, "n_embd": 8, "n_layer": 1, "n_head": 2,)"
    R"( "n_positions": 4, "activation_function": "gelu_new"})";

bool SameParams(const model::ParamMap& a, const model::ParamMap& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
    if (ia->first != ib->first || ia->second.shape() != ib->second.shape() ||
        ia->second.num_bytes() != ib->second.num_bytes() ||
        std::memcmp(ia->second.bytes().data(), ib->second.bytes().data(),
                    ia->second.num_bytes()) != 0) {
      return false;
    }
  }
  return true;
}

bool SameCheckpoint(const model::Checkpoint& a, const model::Checkpoint& b) {
  if (!(a.config == b.config) || a.layer_begin != b.layer_begin || a.layer_end != b.layer_end ||
      a.precision != b.precision || !SameParams(a.params, b.params) ||
      a.optimizer.has_value() != b.optimizer.has_value()) {
    return false;
  }
  return !a.optimizer || (a.optimizer->step == b.optimizer->step &&
                          SameParams(a.optimizer->m, b.optimizer->m) &&
                          SameParams(a.optimizer->v, b.optimizer->v));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const bool has_config = nul != absl::string_view::npos;
  const absl::string_view config = has_config ? input.substr(0, nul) : kDefaultConfig;
  const absl::string_view weights = has_config ? input.substr(nul + 1) : input;

  auto parsed = model::ParseCheckpoint(weights, "fuzz input");
  if (parsed.ok()) {
    auto serialized = model::SerializeCheckpoint(*parsed);
    if (!serialized.ok()) __builtin_trap();
    auto again = model::ParseCheckpoint(*serialized, "round trip");
    if (!again.ok() || !SameCheckpoint(*parsed, *again)) __builtin_trap();
    const std::string other = parsed->precision == "bf16" ? "fp32" : "bf16";
    auto stamped = model::WithPrecision(std::string(weights), other, "fuzz input");
    if (!stamped.ok()) __builtin_trap();
    auto restamped = model::ParseCheckpoint(*stamped, "stamped");
    parsed->precision = other;
    if (!restamped.ok() || !SameCheckpoint(*parsed, *restamped)) __builtin_trap();
  }
  const std::string file = pipetrain::fuzz::WriteTempFile("stage-0.safetensors", weights);
  (void)model::LoadWholeCheckpoint(file, "init_from");
  (void)model::ReadCheckpointInfo(file);

  (void)model::ParseHfGpt2Config(config, "config.json");
  const std::string& dir = pipetrain::fuzz::TempFolder();
  pipetrain::fuzz::WriteTempFile("config.json", config);
  pipetrain::fuzz::WriteTempFile("model.safetensors", weights);
  (void)model::LoadHfFolder(dir);
  (void)model::LoadWholeCheckpoint(dir, "init_from");
  return 0;
}
