// Next-token logits of a whole model, two ways: Logits runs the training path's layer
// forwards over a whole sequence (the reference), and KvCacheDecoder feeds one token at a
// time, keeping every block's keys and values in backend memory so that each new token
// costs one position's work (what `pipetrain generate` runs). Both are written against
// the Backend interface alone, so they run on every backend.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/gpt_config.h"
#include "stage_server/compute/backend.h"
#include "stage_server/compute/backend_buffer.h"
#include "stage_server/compute/model_chunk.h"

namespace pipetrain::compute {

// The logits (n, V) on the host of tokens (n), 1 <= n <= seq_len: row t scores the token
// after tokens[0..t]. Computed as training computes them: the embedding's and every
// block's Forward over one row of seq_len positions (the tokens padded at the end, which
// causal attention keeps from reaching positions < n), then ln_f and the lm_head product.
// `model` must hold the whole model; InvalidArgument for a token outside [0, V).
template <typename Real>
absl::StatusOr<std::vector<Real>> Logits(ModelChunkT<Real>& model, std::span<const int32_t> tokens);

// Not thread-safe; borrows the model, whose parameters it reads and never changes (they
// may change between two Feeds only after a Reset). KvCacheDecoder (float) is what the
// generate verb uses; KvCacheDecoderT<double> holds the float one to tighter checks.
template <typename Real>
class KvCacheDecoderT {
 public:
  // `model` must hold the whole model and outlive the decoder. Allocates the cache (per
  // block 2 * seq_len * d_model) and the one-position buffers now, once.
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
  absl::Status RunBlock(int block);
  absl::Status RunHead(std::vector<Real>* logits);

  // One block's parameters, in backend memory.
  struct BlockParams {
    const Real *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    const Real *ln2_w, *ln2_b, *fc_w, *fc_b, *mlp_w, *mlp_b;
  };

  ModelChunkT<Real>* model_;
  model::GptConfig config_;
  int position_ = 0;
  const Real *wte_ = nullptr, *wpe_ = nullptr;
  const Real *lnf_w_ = nullptr, *lnf_b_ = nullptr, *lm_head_ = nullptr;
  std::vector<BlockParams> blocks_;
  // Per block (2 NH, T, hs): rows 0..NH-1 the keys of each head, NH..2NH-1 the values,
  // position t of a head at row offset t * hs, so that one head's keys are one matrix.
  std::vector<BackendBuffer<Real>> kv_;
  // One position's activations.
  BackendBuffer<Real> token_;   // (1) int32
  BackendBuffer<Real> x_;       // (C) the residual stream
  BackendBuffer<Real> ln_;      // (C)
  BackendBuffer<Real> stats_;   // (2) LayerNorm mean and rstd (not needed, but written)
  BackendBuffer<Real> qkv_;     // (3C)
  BackendBuffer<Real> scores_;  // (NH, <= T) attention scores, then probabilities
  BackendBuffer<Real> att_;     // (C)
  BackendBuffer<Real> x2_;      // (C) residual after attention
  BackendBuffer<Real> fc_;      // (4C)
  BackendBuffer<Real> logits_;  // (V)
};

using KvCacheDecoder = KvCacheDecoderT<float>;

}  // namespace pipetrain::compute
