// Shape arithmetic for the fuzz targets' own checks, written independently of
// the library's (attn/tensor.h), so that the two can disagree.
#ifndef ATTN_FUZZ_COMMON_SHAPES_H_
#define ATTN_FUZZ_COMMON_SHAPES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attn_fuzz {

// 2^31 - 1: the documented per-tensor element limit.
inline constexpr int64_t kMaxElements = 2147483647;

// The element count of `dims` when every dimension is >= 1 and the product
// is at most kMaxElements; nullopt otherwise. Computed in 128-bit arithmetic.
template <typename Dims>
std::optional<int64_t> ElementCount(const Dims& dims) {
  __int128 count = 1;
  for (const auto dim : dims) {
    if (dim < 1) return std::nullopt;
    count *= static_cast<__int128>(dim);
    if (count > kMaxElements) return std::nullopt;
  }
  return static_cast<int64_t>(count);
}

// "(2, 3)", for messages.
template <typename Dims>
std::string DimsToString(const Dims& dims) {
  std::string text = "(";
  for (const auto dim : dims) {
    if (text.size() > 1) text += ", ";
    text += std::to_string(static_cast<long long>(dim));
  }
  return text + ")";
}

}  // namespace attn_fuzz

#endif  // ATTN_FUZZ_COMMON_SHAPES_H_
