#include "server/process/malloc_policy.h"

#include <malloc.h>

namespace attnserve {

void KeepFreedMemoryForReuse() {
  // Larger blocks are mapped and unmapped per call, as before: their
  // pages' faults are small next to their compute.
  mallopt(M_MMAP_THRESHOLD, 1 << 20);
  mallopt(M_TRIM_THRESHOLD, 16 << 20);
}

}  // namespace attnserve
