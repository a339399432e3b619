// How the server's process uses glibc's malloc.
//
// A batch (server/execution/batchable.h) allocates its combined result and its
// members' slices, and frees them together. With glibc's defaults the top
// of a heap is returned to the system whenever more than twice the largest
// freed block sits there (and blocks over the dynamic mmap threshold are
// unmapped), so the next batch faulted all its pages in again: a batch of 32
// 64x64 products ran 3-6x slower than its requests alone for that alone
// (~570 page faults a batch; bench/core_benchmark.cc, BM_Combine). One call
// at a time reuses its blocks under the defaults, so only --batching turns
// this on. KeepFreedMemoryForReuse fixes the thresholds so that blocks under
// 1 MiB come from malloc's arenas and up to 16 MiB free at a heap's top
// stays there; memory still goes back to the system when the server is idle
// (malloc_trim in server/execution/execution_stack.cc). Its cost, measured with the policy
// forced on for fault_test's memory scenario (--quick --only=memory, two
// runs each): peak RSS 425-498 MiB against 395-416 with the defaults (bound
// ~590), RSS 2 s after the load 64-135 against 36-38 MiB.
//
// Call at start-up, before the serving threads start.
#ifndef ATTNSERVE_SERVER_PROCESS_MALLOC_POLICY_H_
#define ATTNSERVE_SERVER_PROCESS_MALLOC_POLICY_H_

namespace attnserve {

void KeepFreedMemoryForReuse();

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_PROCESS_MALLOC_POLICY_H_
