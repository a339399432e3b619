// Converts the wire's tensors (attention.v1.Tensor, Lengths) to the kernel
// library's views and back.
//
// Decoding is zero-copy where it can be: a `values` field, or `raw` bytes
// that happen to be 4-byte aligned, are viewed in place, so the views live
// only as long as the request message (and `storage`). Every decoded tensor
// is checked: exactly one of values/raw set, as many elements as its shape
// says, every element finite (NaN and infinities are rejected, so no result
// is ever computed from them). Errors are INVALID_ARGUMENT naming the field.
// The element budget is RESOURCE_EXHAUSTED naming the limit.
//
// Thread-compatible: pure functions over the caller's objects.
#ifndef ATTNSERVE_SERVER_API_TENSOR_CODEC_H_
#define ATTNSERVE_SERVER_API_TENSOR_CODEC_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/v1/attention.pb.h"
#include "attn/tensor.h"
#include "server/core/element_budget.h"

namespace attnserve {

// Owns the copies decoding had to make (unaligned raw bytes); keep it alive
// as long as the views.
using DecodeStorage = std::deque<attn::FloatBuffer>;

// An unset tensor (no shape, no data) decodes to an empty view, which the
// library then rejects naming the field and the shape it expected.
absl::StatusOr<attn::TensorView> DecodeTensor(
    absl::string_view field, const attention::v1::Tensor& tensor,
    ElementBudget* budget, DecodeStorage* storage);

// The two encodings on their own (the KServe service carries them in other
// messages): float32 `values`, or little-endian float32 `raw` bytes, for a
// tensor of `shape`; the same checks as DecodeTensor.
absl::StatusOr<attn::TensorView> DecodeFloatValues(
    absl::string_view field, attn::Shape shape, const float* values,
    int64_t count, ElementBudget* budget);
absl::StatusOr<attn::TensorView> DecodeRawFloats(absl::string_view field,
                                                 attn::Shape shape,
                                                 const std::string& raw,
                                                 ElementBudget* budget,
                                                 DecodeStorage* storage);

// An unset Lengths (no shape, no values) decodes to "no valid lengths".
absl::StatusOr<attn::LengthsView> DecodeLengths(
    absl::string_view field, const attention::v1::Lengths& lengths);

void EncodeTensor(const attn::Tensor& tensor,
                  attention::v1::TensorEncoding encoding,
                  attention::v1::Tensor* out);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_API_TENSOR_CODEC_H_
