#include "common/model/init.h"

#include <cmath>
#include <algorithm>
#include <string>


namespace pipetrain::model {

namespace {
uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Uniform in (0, 1]: never 0, so log() in Box-Muller is finite.
double Unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

// GPT-2's initializer_range.
constexpr double kInitStd = 0.02;

}  // namespace

uint64_t InitStreamKey(uint64_t seed, int pipeline_layer, int param_index) {
  uint64_t k = SplitMix64(seed);
  k = SplitMix64(k ^ (static_cast<uint64_t>(pipeline_layer) + 1) * 0xD1B54A32D192ED03ull);
  return SplitMix64(k ^ (static_cast<uint64_t>(param_index) + 1) * 0xABC98388FB8FAC03ull);
}

double NormalAt(uint64_t key, uint64_t index) {
  // Draws come in Box-Muller pairs: element 2p uses the cosine, 2p + 1 the sine.
  const uint64_t pair = index / 2;
  const double u1 = Unit(SplitMix64(key + 2 * pair * 0x9E3779B97F4A7C15ull));
  const double u2 = Unit(SplitMix64(key + (2 * pair + 1) * 0x9E3779B97F4A7C15ull));
  const double r = std::sqrt(-2.0 * std::log(u1));
  constexpr double kTwoPi = 6.283185307179586;
  return index % 2 == 0 ? r * std::cos(kTwoPi * u2) : r * std::sin(kTwoPi * u2);
}

double UniformAt(uint64_t key, uint64_t index) {
  return static_cast<double>(SplitMix64(key + index * 0x9E3779B97F4A7C15ull) >> 11) * 0x1.0p-53;
}

namespace {

// The stream parameter i of a layer draws from: its own, or for a tied copy its
// original's (in pipeline layer 0), so that the copy starts equal to it.
uint64_t StreamOf(const TransformerConfig& config, int pipeline_layer, int i, const ParamSpec& spec,
                  uint64_t seed) {
  if (spec.tied_to.empty()) return InitStreamKey(seed, pipeline_layer, i);
  const std::vector<ParamSpec> originals = LayerParams(config, 0);
  for (int j = 0; j < static_cast<int>(originals.size()); ++j) {
    if (originals[j].name == spec.tied_to) return InitStreamKey(seed, 0, j);
  }
  return InitStreamKey(seed, pipeline_layer, i);  // a family whose copy has no original
}

}  // namespace

std::vector<std::vector<float>> InitLayerParams(const TransformerConfig& config, int pipeline_layer,
                                                uint64_t seed) {
  const std::vector<ParamSpec> specs = LayerParams(config, pipeline_layer);
  std::vector<std::vector<float>> values;
  values.reserve(specs.size());
  for (int i = 0; i < static_cast<int>(specs.size()); ++i) {
    const ParamSpec& spec = specs[i];
    std::vector<float> v(spec.num_elements(), 0.0f);
    switch (spec.init) {
      case ParamInit::kZeros:
        break;
      case ParamInit::kOnes:
        std::fill(v.begin(), v.end(), 1.0f);
        break;
      case ParamInit::kNormal:
      case ParamInit::kResidualNormal: {
        const double stddev = spec.init == ParamInit::kNormal
                                  ? kInitStd
                                  : kInitStd / std::sqrt(2.0 * config.n_layers);
        const uint64_t key = StreamOf(config, pipeline_layer, i, spec, seed);
        for (size_t j = 0; j < v.size(); ++j) {
          v[j] = static_cast<float>(stddev * NormalAt(key, j));
        }
        break;
      }
    }
    values.push_back(std::move(v));
  }
  return values;
}

}  // namespace pipetrain::model
