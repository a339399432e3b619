// Vectors whose data start on a cache line (64 bytes), for the kernels'
// buffers: a row of 64 bytes there (an AMX tile row, an AVX-512 vector)
// lies in one line. std::allocator gives 16 bytes, and a large block comes
// from mmap 16 bytes past a page boundary, so every such row laid out in a
// std::vector straddled two lines: cpu-amx-columns ran its large case 10%
// and its long one 12% faster once its layout was aligned
// (attention_benchmark, 2-core Intel Xeon with AMX).
//
// Include it before the ISA region (attn/internal/isa.h): the allocator is
// compiled once, for the baseline, like the rest of std::vector.
#ifndef ATTN_INTERNAL_ALIGNED_VECTOR_H_
#define ATTN_INTERNAL_ALIGNED_VECTOR_H_

#include <cstddef>
#include <new>
#include <vector>

namespace attn::internal {

inline constexpr std::size_t kCacheLine = 64;

template <typename T>
struct CacheLineAllocator {
  using value_type = T;

  CacheLineAllocator() = default;
  template <typename U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}  // NOLINT: rebinding

  T* allocate(std::size_t n) {
    return static_cast<T*>(
        ::operator new(n * sizeof(T), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, std::size_t) {
    ::operator delete(p, std::align_val_t{kCacheLine});
  }

  friend bool operator==(const CacheLineAllocator&,
                         const CacheLineAllocator&) {
    return true;
  }
  friend bool operator!=(const CacheLineAllocator&,
                         const CacheLineAllocator&) {
    return false;
  }
};

template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace attn::internal

#endif  // ATTN_INTERNAL_ALIGNED_VECTOR_H_
