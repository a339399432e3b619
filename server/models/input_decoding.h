// Float input tensors, as every front end receives them (a list of float32
// values, or little-endian float32 bytes), into the kernel library's views,
// with the checks every front end makes: as many elements as the shape
// says, each finite (NaN and infinities are refused, so no result is ever
// computed from them), and the call's element budget.
//
// Decoding is zero-copy where it can be: values, or raw bytes that happen
// to be 4-byte aligned, are viewed in place, so the views live only as long
// as the request (and `storage`). Errors are INVALID_ARGUMENT naming the
// field; the budget is RESOURCE_EXHAUSTED naming the limit.
//
// Thread-compatible: pure functions over the caller's objects.
#ifndef ATTNSERVE_SERVER_MODELS_INPUT_DECODING_H_
#define ATTNSERVE_SERVER_MODELS_INPUT_DECODING_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attn/tensor.h"
#include "server/execution/element_budget.h"

namespace attnserve {

// Owns the copies decoding had to make (unaligned raw bytes); keep it alive
// as long as the views.
using DecodeStorage = std::deque<attn::FloatBuffer>;

// `count` float32 values for a tensor of `shape`.
absl::StatusOr<attn::TensorView> DecodeFloatValues(
    absl::string_view field, attn::Shape shape, const float* values,
    int64_t count, ElementBudget* budget);
// Little-endian float32 bytes for a tensor of `shape`.
absl::StatusOr<attn::TensorView> DecodeRawFloats(absl::string_view field,
                                                 attn::Shape shape,
                                                 const std::string& raw,
                                                 ElementBudget* budget,
                                                 DecodeStorage* storage);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_MODELS_INPUT_DECODING_H_
