// Next-token logits of a whole model, two ways: Logits runs the training path's layer
// forwards over a whole sequence (the reference), and KvCacheDecoder feeds one token at a
// time, keeping every block's keys and values in backend memory so that each new token
// costs one position's work (what `pipetrain generate` runs). Both run the model's own
// layers (gpt_layers.h: a block's forward is one piece of code for both), so they know no
// family and run on every backend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/transformer_config.h"
#include "stage_server/compute/backend.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/model_chunk.h"

namespace pipetrain::compute {

// The logits (n, V) on the host of tokens (n), 1 <= n <= seq_len: row t scores the token
// after tokens[0..t]. Computed as training computes them: the embedding's and every
// block's Forward over one row of seq_len positions (the tokens padded at the end, which
// causal attention keeps from reaching positions < n), then the head's Logits.
// `model` must hold the whole model; InvalidArgument for a token outside [0, V).
template <typename Real>
absl::StatusOr<std::vector<Real>> Logits(ModelChunkT<Real>& model, std::span<const int32_t> tokens);

// Not thread-safe; borrows the model, whose parameters it reads and never changes (they
// may change between two Feeds only after a Reset). KvCacheDecoder (float) is what the
// generate verb uses; KvCacheDecoderT<double> holds the float one to tighter checks.
template <typename Real>
class KvCacheDecoderT {
 public:
  // `model` must hold the whole model and outlive the decoder. Allocates every block's
  // cache (BlockLayer::NewCache) and the one-position buffers now, once.
  static absl::StatusOr<std::unique_ptr<KvCacheDecoderT>> Create(ModelChunkT<Real>* model);

  int position() const { return position_; }  // tokens fed since creation or Reset
  int capacity() const { return config_.seq_len; }
  // Forgets every position: the next token fed is at position 0.
  void Reset() { position_ = 0; }

  // Runs `token` at position() through the model and advances; with `logits`, writes the
  // logits (V) of the token after it there (nullptr skips the head, as a prompt's tokens
  // but the last need). InvalidArgument for a token outside [0, V); OutOfRange once
  // capacity() positions are held (the position embedding has seq_len rows).
  absl::Status Feed(int32_t token, std::vector<Real>* logits);

 private:
  explicit KvCacheDecoderT(ModelChunkT<Real>* model) : model_(model), config_(model->config()) {}
  absl::Status Init();

  ModelChunkT<Real>* model_;
  model::TransformerConfig config_;
  int position_ = 0;
  // Each block's keys and values of the positions so far, with its one-position buffers.
  std::vector<std::unique_ptr<typename BlockLayer<Real>::Cache>> caches_;
  BackendBuffer<Real> token_;   // (1) int32
  BackendBuffer<Real> x_;       // (C) the residual stream
  BackendBuffer<Real> logits_;  // (V)
};

using KvCacheDecoder = KvCacheDecoderT<float>;

}  // namespace pipetrain::compute
