// Writes the binary seed inputs of the fuzz targets (checked in under corpus/NAME/) from
// the project's own writers, so that each seed is a valid input of today's format:
//   build-fuzz/bin/pipetrain-fuzz-make-seeds tests/fuzz/corpus
// Text seeds (schedules, job specs, tokenizer texts) are copies of test fixtures.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/model/checkpoint.h"
#include "common/model/transformer_config.h"
#include "common/model/hf_folder.h"
#include "common/model/init.h"
#include "common/safetensors.h"
#include "common/tensor.h"
#include "common/tensor_codec.h"
#include "common/data/token_file_writer.h"
#include "pipetrain/v1/stage.pb.h"
#include "stage_server/link/frame_wire.h"

namespace common = pipetrain::common;
namespace model = pipetrain::model;

namespace {

std::string out_dir;

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "make_seeds: %s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

template <typename T>
T Value(absl::StatusOr<T> v) {
  Check(v.status());
  return *std::move(v);
}

void Write(const std::string& target, const std::string& name, const std::string& bytes) {
  std::filesystem::create_directories(out_dir + "/" + target);
  std::ofstream out(out_dir + "/" + target + "/" + name, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) Check(absl::InternalError("cannot write " + target + "/" + name));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

common::Tensor F32(std::vector<int64_t> shape, float first) {
  common::Tensor t = Value(common::Tensor::Create(common::DType::kF32, std::move(shape)));
  float v = first;
  for (float& x : t.data<float>()) x = v++;
  return t;
}

model::Checkpoint Tiny(int begin, int end, bool tied, bool optimizer) {
  model::Checkpoint c;
  c.config = model::TransformerConfig{8, 4, 4, 2, 1, tied};
  c.layer_begin = begin;
  c.layer_end = end;
  for (int layer = begin; layer < end; ++layer) {
    const std::vector<model::ParamSpec> specs = model::LayerParams(c.config, layer);
    const auto values = model::InitLayerParams(c.config, layer, /*seed=*/1);
    for (size_t i = 0; i < specs.size(); ++i) {
      common::Tensor t = Value(common::Tensor::Create(common::DType::kF32, specs[i].shape));
      std::copy(values[i].begin(), values[i].end(), t.data<float>().begin());
      c.params[specs[i].name] = std::move(t);
    }
  }
  // A tied lm_head is not stored where wte is (CheckpointParams).
  std::set<std::string> stored;
  for (const model::ParamSpec& p : model::CheckpointParams(c.config, begin, end)) stored.insert(p.name);
  std::erase_if(c.params, [&](const auto& kv) { return !stored.count(kv.first); });
  if (optimizer) {
    model::AdamWState state;
    for (const auto& [name, t] : c.params) {
      state.m[name] = t.Clone();
      state.v[name] = t.Clone();
    }
    state.step = 3;
    c.optimizer = std::move(state);
  }
  return c;
}

void SafetensorsSeeds() {
  const common::Tensor a = F32({2, 3}, 1);
  common::Tensor b = Value(common::Tensor::Create(common::DType::kI32, {4}));
  for (int i = 0; i < 4; ++i) b.data<int32_t>()[i] = i;
  const common::Tensor c = Value(common::Tensor::Create(common::DType::kBF16, {0, 2}));
  std::vector<common::SafetensorsView> two = {common::ViewOf("a", a), common::ViewOf("b", b)};
  Write("safetensors", "two_tensors", Value(common::SerializeSafetensors(two, {{"format", "pt"}})));
  std::vector<common::SafetensorsView> empty_tensor = {common::ViewOf("empty", c)};
  Write("safetensors", "empty_tensor", Value(common::SerializeSafetensors(empty_tensor)));
  Write("safetensors", "no_tensors", Value(common::SerializeSafetensors({})));
}

void CheckpointSeeds() {
  Write("checkpoint", "whole", Value(model::SerializeCheckpoint(Tiny(0, 3, false, false))));
  Write("checkpoint", "stage_with_optimizer",
        Value(model::SerializeCheckpoint(Tiny(1, 3, true, true))));
  // A Hugging Face folder: config.json, NUL, model.safetensors.
  const std::string dir = out_dir + "/.hf-tmp";
  Check(model::ExportHfFolder(Tiny(0, 3, true, false), dir));
  Write("checkpoint", "hf_folder",
        ReadFile(dir + "/config.json") + std::string(1, '\0') +
            ReadFile(dir + "/model.safetensors"));
  std::filesystem::remove_all(dir);
}

void FrameSeeds() {
  // Record: control byte, 2-byte little-endian length, message (frame_fuzz.cc).
  auto record = [](uint8_t control, const std::string& message) {
    std::string r(1, static_cast<char>(control));
    r.push_back(static_cast<char>(message.size() & 0xff));
    r.push_back(static_cast<char>(message.size() >> 8));
    return r + message;
  };
  const common::Tensor t = F32({2, 3}, 0.5f);
  common::FrameTag tag{"j1", 7, 1, 0, common::TensorKind::kActivation};
  for (const auto& [name, control] : {std::pair{"activation_copied", 1}, {"activation_pieces", 6}}) {
    auto encoder = Value(common::TensorEncoder::Create(tag, t, /*frame_bytes=*/8));
    std::string seed;
    for (size_t i = 0; i < encoder.num_frames(); ++i) {
      const common::FrameView f = encoder.frame(i);
      seed += record(control, pipetrain::stage_server::EncodeFramePrefix(f) +
                                  std::string(reinterpret_cast<const char*>(f.payload.data()),
                                              f.payload.size()));
    }
    Write("frame", name, seed);
  }
  pipetrain::v1::PeerHello hello;
  hello.set_job_id("j1");
  hello.set_from_stage(0);
  Write("frame", "hello", record(0, pipetrain::stage_server::EncodeHello(hello)));
}

void ConfigureSeeds() {
  pipetrain::v1::ConfigureRequest r;
  r.set_job_id("j1");
  r.set_stage(0);
  r.set_num_stages(2);
  auto* m = r.mutable_model();
  m->set_vocab_size(8);
  m->set_seq_len(4);
  m->set_d_model(4);
  m->set_n_heads(2);
  m->set_n_layers(1);
  auto* layers = r.add_chunks();
  layers->set_begin_layer(0);
  layers->set_end_layer(2);
  r.set_seed(1);
  r.mutable_optimizer()->set_lr(1e-3f);
  r.set_downstream_address("127.0.0.1:1");
  r.set_micro_batch_size(2);
  r.set_peer_secret("s");
  Write("configure", "emulated_stage0", std::string(1, '\0') + r.SerializeAsString());
  Write("configure", "cpu_stage0", std::string(1, '\1') + r.SerializeAsString());
  r.set_stage(1);
  r.set_upstream_address("127.0.0.1:2");
  r.clear_downstream_address();
  r.mutable_chunks(0)->set_begin_layer(2);
  r.mutable_chunks(0)->set_end_layer(3);
  r.mutable_model()->set_tie_embeddings(true);
  Write("configure", "cpu_stage1_tied", std::string(1, '\1') + r.SerializeAsString());
}

void TokenFileSeeds() {
  const std::string path = out_dir + "/.tokens-tmp.bin";
  auto writer = Value(pipetrain::data::TokenFileWriter::Open(path, 50257));
  const std::vector<int32_t> ids = {50256, 15496, 11, 995, 0, 50256};
  Check(writer.Append(ids));
  Check(writer.Commit());
  Write("token_file", "llmc", ReadFile(path));
  std::filesystem::remove(path);
  std::string raw;
  for (int32_t id : ids) {
    raw.push_back(static_cast<char>(id & 0xff));
    raw.push_back(static_cast<char>(id >> 8));
  }
  Write("token_file", "nanogpt", raw);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  SafetensorsSeeds();
  CheckpointSeeds();
  FrameSeeds();
  ConfigureSeeds();
  TokenFileSeeds();
  return 0;
}
