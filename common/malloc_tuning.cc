#include "common/malloc_tuning.h"

#include <malloc.h>

namespace pipetrain::common {

bool KeepFreedMemoryForReuse() {
  // Setting the mmap threshold also turns off glibc's dynamic adjustment of it.
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 64 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return mmap_ok && trim_ok;
}

}  // namespace pipetrain::common
