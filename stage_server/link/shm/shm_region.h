// A shared-memory region one stage creates for a neighbour on the same host, so that
// tensors between them need not cross loopback TCP (docs/ARCHITECTURE.md, "same-host
// transport"). The creator makes a POSIX shared-memory object of mode 0600 under a
// random name and writes a header into it: a magic, a version, the payload's size and
// a random nonce. It names the object (and the nonce) to its neighbour on the gRPC
// stream; the neighbour opens it, refusing anything that is not exactly what it was
// told (another owner, a mode open to others, another size, another nonce), and as
// soon as both ends hold it, the name is unlinked, so that no third process can open
// it any more. The memory lives until the last mapping goes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace pipetrain::stage_server {

using ShmNonce = std::array<uint8_t, 16>;

// The names a region may have: this prefix, then 32 lowercase hex digits.
inline constexpr char kShmNamePrefix[] = "/pipetrain-";
// The payload starts one page in; the header is in the first page.
inline constexpr size_t kShmHeaderBytes = 4096;
// The largest payload a region may hold (the job's largest tensor is split over slots
// well below this).
inline constexpr uint64_t kMaxShmPayloadBytes = uint64_t{16} << 30;

class ShmRegion {
 public:
  // A new region of `payload_bytes` (at least 1, at most kMaxShmPayloadBytes), zeroed,
  // under a fresh random name with a fresh random nonce. UNAVAILABLE when the host
  // cannot make one (no /dev/shm, no space), naming the size.
  static absl::StatusOr<ShmRegion> Create(uint64_t payload_bytes);
  // The neighbour's end: opens `name`, which must have been made by this user with mode
  // 0600, hold exactly `payload_bytes` and carry `nonce`. INVALID_ARGUMENT for a name
  // not of kShmNamePrefix's form; NOT_FOUND when it is gone (already unlinked, or
  // another host's or another mount namespace's); PERMISSION_DENIED for another
  // owner, a wider mode or a wrong nonce; FAILED_PRECONDITION for a wrong size or
  // header. Every error names the region.
  static absl::StatusOr<ShmRegion> Open(const std::string& name, uint64_t payload_bytes,
                                        const ShmNonce& nonce);

  ShmRegion(ShmRegion&& other) noexcept;
  ShmRegion& operator=(ShmRegion&& other) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  // Unmaps; the creator also unlinks the name if nobody did yet (a neighbour that
  // never came must not leave it behind).
  ~ShmRegion();

  // Removes the name (either end may; the second call finds it gone and is OK). The
  // mappings stay valid.
  absl::Status Unlink();

  const std::string& name() const { return name_; }
  const ShmNonce& nonce() const { return nonce_; }
  std::span<std::byte> payload() const { return {base_ + kShmHeaderBytes, payload_bytes_}; }
  uint64_t payload_bytes() const { return payload_bytes_; }
  bool creator() const { return creator_; }
  bool unlinked() const { return unlinked_; }

 private:
  ShmRegion() = default;
  void Release();

  std::string name_;
  ShmNonce nonce_{};
  std::byte* base_ = nullptr;
  uint64_t payload_bytes_ = 0;
  bool creator_ = false;
  bool unlinked_ = false;
};

// The nonce as 32 lowercase hex digits and back (for messages and the stream's hello);
// FromHex refuses anything else with INVALID_ARGUMENT.
std::string ShmNonceHex(const ShmNonce& nonce);
absl::StatusOr<ShmNonce> ShmNonceFromHex(const std::string& hex);

}  // namespace pipetrain::stage_server
