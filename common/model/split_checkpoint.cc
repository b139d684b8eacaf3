#include "common/model/split_checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/transformer_config.h"
#include "common/status_macros.h"
#include "common/model/optimizer_split.h"

namespace pipetrain::model {
namespace {

absl::Status Bad(const std::string& what, size_t copy, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(what, ": copy ", copy, " ", why));
}

// Everything but the moments must be the same on every copy.
absl::Status CheckAlike(const std::vector<Checkpoint>& copies, const std::string& what) {
  const Checkpoint& first = copies[0];
  for (size_t r = 0; r < copies.size(); ++r) {
    const Checkpoint& c = copies[r];
    if (!c.optimizer) return Bad(what, r, "holds no optimizer state");
    if (r == 0) continue;
    if (!(c.config == first.config) || c.layer_begin != first.layer_begin ||
        c.layer_end != first.layer_end || c.precision != first.precision) {
      return Bad(what, r, "is of another model, layer range or precision than copy 0");
    }
    if (c.optimizer->step != first.optimizer->step) {
      return Bad(what, r, absl::StrCat("is at update ", c.optimizer->step, ", copy 0 at ",
                                       first.optimizer->step));
    }
    if (c.params.size() != first.params.size()) return Bad(what, r, "holds other tensors");
    for (const auto& [name, tensor] : first.params) {
      auto it = c.params.find(name);
      if (it == c.params.end()) return Bad(what, r, absl::StrCat("lacks ", name));
      const auto a = tensor.bytes(), b = it->second.bytes();
      if (a.size() != b.size() || std::memcmp(a.data(), b.data(), a.size()) != 0) {
        return Bad(what, r, absl::StrCat("holds other weights of ", name, " than copy 0"));
      }
    }
  }
  return absl::OkStatus();
}

// Copies the elements of `name` (starting at `offset` of its layer's flat parameters)
// that each copy's piece of the layer covers from that copy's map into `out`.
absl::Status TakeOwnedElements(const std::vector<const ParamMap*>& maps, const std::string& name,
                               uint64_t offset, uint64_t layer_elements, common::Tensor& out,
                               const std::string& what) {
  const int copies = static_cast<int>(maps.size());
  std::span<float> to = out.data<float>();
  for (int r = 0; r < copies; ++r) {
    auto it = maps[r]->find(name);
    if (it == maps[r]->end()) return Bad(what, r, absl::StrCat("lacks the moments of ", name));
    std::span<const float> from = it->second.data<float>();
    if (from.size() != to.size()) return Bad(what, r, absl::StrCat("holds another shape of ", name));
    const CopyRange piece = RangeOfCopy(layer_elements, copies, r);
    const uint64_t lo = std::max(piece.begin, offset);
    const uint64_t hi = std::min<uint64_t>(piece.end, offset + to.size());
    for (uint64_t i = lo; i < hi; ++i) to[i - offset] = from[i - offset];
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Checkpoint> JoinCopies(std::vector<Checkpoint> copies, const std::string& what) {
  if (copies.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no copies"));
  RETURN_IF_ERROR(CheckAlike(copies, what));
  Checkpoint joined = std::move(copies[0]);
  std::vector<const ParamMap*> m, v;
  m.push_back(&joined.optimizer->m);
  v.push_back(&joined.optimizer->v);
  for (size_t r = 1; r < copies.size(); ++r) {
    m.push_back(&copies[r].optimizer->m);
    v.push_back(&copies[r].optimizer->v);
  }
  // The joined moments are written into fresh tensors: copy 0's maps are read too.
  AdamWState out{.m = {}, .v = {}, .step = joined.optimizer->step};
  for (int layer = joined.layer_begin; layer < joined.layer_end; ++layer) {
    const std::vector<ParamSpec> specs = LayerParams(joined.config, layer);
    uint64_t elements = 0;
    for (const ParamSpec& p : specs) elements += static_cast<uint64_t>(p.num_elements());
    uint64_t offset = 0;
    for (const ParamSpec& p : specs) {
      const uint64_t at = offset;
      offset += static_cast<uint64_t>(p.num_elements());
      auto it = joined.optimizer->m.find(p.name);
      if (it == joined.optimizer->m.end()) continue;  // a tied copy the file leaves out
      for (auto [maps, into] : {std::pair{&m, &out.m}, std::pair{&v, &out.v}}) {
        // Every element is overwritten: the pieces cover the layer.
        common::Tensor t = it->second.Clone();
        RETURN_IF_ERROR(TakeOwnedElements(*maps, p.name, at, elements, t, what));
        into->emplace(p.name, std::move(t));
      }
    }
  }
  if (out.m.size() != joined.optimizer->m.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": moments of parameters outside the layer range"));
  }
  joined.optimizer = std::move(out);
  return joined;
}

}  // namespace pipetrain::model
