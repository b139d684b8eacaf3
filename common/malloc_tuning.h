// Keeps freed heap memory in the process for reuse. gRPC allocates a fresh buffer for
// every large read; with glibc's defaults those come from mmap and go back on free, so
// every message first-touches new pages, which on these virtual machines is slower
// than the network itself. Servers that move tensors call this once at start-up.
#pragma once

namespace pipetrain::common {

// Raises glibc's mmap threshold (64 MiB) and trim threshold (1 GiB). Returns false if
// the C library refused.
bool KeepFreedMemoryForReuse();

}  // namespace pipetrain::common
