#include "stage_server/compute/token_generator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace pipetrain::compute {
namespace {

// Resets the decoder and feeds context (at most its capacity), keeping the logits of
// the last token.
template <typename Real>
absl::Status FeedContext(KvCacheDecoderT<Real>& decoder, std::span<const int32_t> context,
                         std::vector<Real>* logits) {
  decoder.Reset();
  for (size_t i = 0; i < context.size(); ++i) {
    RETURN_IF_ERROR(decoder.Feed(context[i], i + 1 == context.size() ? logits : nullptr));
  }
  return absl::OkStatus();
}

}  // namespace

template <typename Real>
absl::StatusOr<std::vector<int32_t>> GenerateTokens(
    KvCacheDecoderT<Real>& decoder, std::span<const int32_t> prompt, int new_tokens,
    const SamplingOptions& sampling, absl::FunctionRef<absl::Status(int32_t)> on_token) {
  RETURN_IF_ERROR(ValidateSampling(sampling));
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: generation starts from a token");
  }
  if (new_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the number of tokens to generate is negative (", new_tokens, ")"));
  }
  const size_t capacity = static_cast<size_t>(decoder.capacity());
  std::vector<int32_t> text(prompt.begin(), prompt.end());  // prompt and new tokens
  std::vector<Real> logits;
  RETURN_IF_ERROR(FeedContext(
      decoder, prompt.subspan(prompt.size() - std::min(prompt.size(), capacity)), &logits));
  std::vector<int32_t> generated;
  for (int i = 0; i < new_tokens; ++i) {
    ASSIGN_OR_RETURN(const int32_t token, SampleToken(std::span<const Real>(logits), sampling, i));
    generated.push_back(token);
    text.push_back(token);
    RETURN_IF_ERROR(on_token(token));
    if (i + 1 == new_tokens) break;  // the last token's logits are never used
    if (decoder.position() < decoder.capacity()) {
      RETURN_IF_ERROR(decoder.Feed(token, &logits));
    } else {
      const size_t keep = static_cast<size_t>(SlideKeep(decoder.capacity()));
      RETURN_IF_ERROR(FeedContext(decoder, std::span<const int32_t>(text).last(keep), &logits));
    }
  }
  return generated;
}

template absl::StatusOr<std::vector<int32_t>> GenerateTokens(
    KvCacheDecoderT<float>&, std::span<const int32_t>, int, const SamplingOptions&,
    absl::FunctionRef<absl::Status(int32_t)>);
template absl::StatusOr<std::vector<int32_t>> GenerateTokens(
    KvCacheDecoderT<double>&, std::span<const int32_t>, int, const SamplingOptions&,
    absl::FunctionRef<absl::Status(int32_t)>);

}  // namespace pipetrain::compute
