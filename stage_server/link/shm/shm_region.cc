#include "stage_server/link/shm/shm_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pipetrain::stage_server {
namespace {

constexpr uint64_t kMagic = 0x4d48535f50495045ull;  // "EPIP_SHM" little-endian
constexpr uint32_t kVersion = 1;

// The first bytes of the region.
struct Header {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t payload_bytes;
  ShmNonce nonce;
};
static_assert(sizeof(Header) <= kShmHeaderBytes);

std::string Errno(const char* call) { return absl::StrCat(call, ": ", std::strerror(errno)); }

absl::Status RandomFill(std::span<uint8_t> out) {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = getrandom(out.data() + done, out.size() - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError(Errno("getrandom"));
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

bool ValidName(const std::string& name) {
  const std::string prefix = kShmNamePrefix;
  if (name.size() != prefix.size() + 32 || name.compare(0, prefix.size(), prefix) != 0) {
    return false;
  }
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    const char c = name[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// Equal in time independent of where they differ.
bool SameNonce(const ShmNonce& a, const ShmNonce& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

absl::StatusOr<std::byte*> Map(int fd, uint64_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("shared-memory region ", name, ": ", Errno("mmap")));
  }
  return static_cast<std::byte*>(p);
}

}  // namespace

std::string ShmNonceHex(const ShmNonce& nonce) {
  std::string out;
  for (uint8_t b : nonce) absl::StrAppendFormat(&out, "%02x", b);
  return out;
}

absl::StatusOr<ShmNonce> ShmNonceFromHex(const std::string& hex) {
  ShmNonce nonce{};
  const auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  bool ok = hex.size() == 2 * nonce.size();
  for (size_t i = 0; ok && i < nonce.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    ok = hi >= 0 && lo >= 0;
    nonce[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a shared-memory nonce is 32 lowercase hex digits, not '", hex.substr(0, 40), "'"));
  }
  return nonce;
}

absl::StatusOr<ShmRegion> ShmRegion::Create(uint64_t payload_bytes) {
  if (payload_bytes == 0 || payload_bytes > kMaxShmPayloadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a shared-memory region holds 1 to ", kMaxShmPayloadBytes, " bytes, not ", payload_bytes));
  }
  ShmRegion r;
  std::array<uint8_t, 16> id{};
  if (absl::Status s = RandomFill(id); !s.ok()) return s;
  if (absl::Status s = RandomFill(r.nonce_); !s.ok()) return s;
  r.name_ = absl::StrCat(kShmNamePrefix, ShmNonceHex(id));
  const int fd = shm_open(r.name_.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot make a shared-memory region of ",
                                               payload_bytes, " bytes: ", Errno("shm_open")));
  }
  r.creator_ = true;  // from here on the destructor unlinks the name
  const uint64_t total = kShmHeaderBytes + payload_bytes;
  absl::StatusOr<std::byte*> base = absl::UnavailableError("not mapped");
  // The pages are reserved now: a tmpfs too small for them (a container's 64 MiB
  // /dev/shm) refuses here, instead of a SIGBUS on the first write past its end.
  int reserved = 0;
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    base = absl::UnavailableError(absl::StrCat("shared-memory region ", r.name_, " of ", total,
                                               " bytes: ", Errno("ftruncate")));
  } else if ((reserved = posix_fallocate(fd, 0, static_cast<off_t>(total))) != 0) {
    base = absl::ResourceExhaustedError(absl::StrCat(
        "shared-memory region ", r.name_, " of ", total, " bytes: posix_fallocate: ",
        std::strerror(reserved), " (/dev/shm too small? the link keeps to TCP)"));
  } else {
    base = Map(fd, total, r.name_);
  }
  close(fd);
  if (!base.ok()) return base.status();  // r's destructor unlinks the name
  r.base_ = *base;
  r.payload_bytes_ = payload_bytes;
  Header h{kMagic, kVersion, 0, payload_bytes, r.nonce_};
  std::memcpy(r.base_, &h, sizeof(h));
  return r;
}

absl::StatusOr<ShmRegion> ShmRegion::Open(const std::string& name, uint64_t payload_bytes,
                                          const ShmNonce& nonce) {
  if (!ValidName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory region '", name.substr(0, 80), "': not a name of the form ",
        kShmNamePrefix, "<32 hex digits>"));
  }
  const std::string what = absl::StrCat("shared-memory region ", name);
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) {
      return absl::NotFoundError(absl::StrCat(what, " is not on this host (or already "
                                                    "unlinked): ", std::strerror(e)));
    }
    return absl::PermissionDeniedError(absl::StrCat(what, ": ", std::strerror(e)));
  }
  struct stat st {};
  const uint64_t total = kShmHeaderBytes + payload_bytes;
  absl::Status refused;
  if (fstat(fd, &st) != 0) {
    refused = absl::UnavailableError(absl::StrCat(what, ": ", Errno("fstat")));
  } else if (st.st_uid != geteuid() || (st.st_mode & 0077) != 0) {
    refused = absl::PermissionDeniedError(absl::StrFormat(
        "%s belongs to uid %d with mode %o; only this user's regions of mode 600 are used",
        what, st.st_uid, st.st_mode & 0777));
  } else if (static_cast<uint64_t>(st.st_size) != total) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        what, " holds ", st.st_size, " bytes, not the ", total, " it was announced with"));
  }
  absl::StatusOr<std::byte*> base = refused.ok() ? Map(fd, total, name) : refused;
  close(fd);
  if (!base.ok()) return base.status();
  ShmRegion r;
  r.name_ = name;
  r.base_ = *base;
  r.payload_bytes_ = payload_bytes;
  Header h;
  std::memcpy(&h, r.base_, sizeof(h));
  r.nonce_ = h.nonce;
  if (h.magic != kMagic || h.version != kVersion || h.payload_bytes != payload_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " has no pipetrain header of version ", kVersion, " for ", payload_bytes, " bytes"));
  }
  if (!SameNonce(h.nonce, nonce)) {
    return absl::PermissionDeniedError(absl::StrCat(what, ": its nonce is not the one its "
                                                          "creator announced"));
  }
  return r;
}

ShmRegion::ShmRegion(ShmRegion&& other) noexcept { *this = std::move(other); }

ShmRegion& ShmRegion::operator=(ShmRegion&& other) noexcept {
  if (this != &other) {
    Release();
    name_ = std::move(other.name_);
    nonce_ = other.nonce_;
    base_ = std::exchange(other.base_, nullptr);
    payload_bytes_ = std::exchange(other.payload_bytes_, 0);
    creator_ = std::exchange(other.creator_, false);
    unlinked_ = std::exchange(other.unlinked_, false);
    other.name_.clear();
  }
  return *this;
}

ShmRegion::~ShmRegion() { Release(); }

void ShmRegion::Release() {
  if (base_ != nullptr) munmap(base_, kShmHeaderBytes + payload_bytes_);
  base_ = nullptr;
  if (creator_ && !unlinked_ && !name_.empty()) (void)Unlink();
}

absl::Status ShmRegion::Unlink() {
  if (unlinked_) return absl::OkStatus();
  unlinked_ = true;
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(absl::StrCat("shared-memory region ", name_, ": ",
                                               Errno("shm_unlink")));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::stage_server
