// Deterministic GPT-2 style initialisation, for every model family. Every value depends
// only on (seed, global pipeline-layer index, parameter index, element index), so any
// partition of the model into stages produces exactly the weights of the unpartitioned
// model, on any platform (a splitmix64 counter generator and Box-Muller, no <random>
// distributions).
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/transformer_config.h"

namespace pipetrain::model {

// Standard normal draw number `index` of the stream identified by `key`.
double NormalAt(uint64_t key, uint64_t index);
// Uniform draw in [0, 1) number `index` of the stream `key` (53 random bits), for
// whatever else must draw the same numbers on every platform (sampling in generation).
double UniformAt(uint64_t key, uint64_t index);
uint64_t InitStreamKey(uint64_t seed, int pipeline_layer, int param_index);

// Initial values of every parameter of one pipeline layer, in LayerParams order, as each
// ParamSpec::init says (GPT-2's scheme): kNormal ~ N(0, 0.02), kResidualNormal ~ N(0,
// 0.02 / sqrt(2 n_layers)), kZeros, kOnes. A tied copy (tie_embeddings) is drawn from its
// original's stream, so it starts equal to it.
std::vector<std::vector<float>> InitLayerParams(const TransformerConfig& config, int pipeline_layer,
                                                uint64_t seed);

}  // namespace pipetrain::model
