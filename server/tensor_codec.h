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
#ifndef ATTNSERVE_SERVER_TENSOR_CODEC_H_
#define ATTNSERVE_SERVER_TENSOR_CODEC_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/v1/attention.pb.h"
#include "attn/tensor.h"

namespace attnserve {

// Counts the elements of every tensor one request decodes against a limit,
// and the elements of its result once they are known: together, the call's
// payload (server/admission.h charges it).
class ElementBudget {
 public:
  explicit ElementBudget(int64_t limit) : remaining_(limit), limit_(limit) {}
  // RESOURCE_EXHAUSTED once the request's tensors together exceed the limit.
  absl::Status Take(absl::string_view field, int64_t elements);
  void CountResult(int64_t elements) { result_elements_ += elements; }

  // The request's decoded elements and the result's counted ones.
  int64_t payload_elements() const {
    return (limit_ - remaining_) + result_elements_;
  }

 private:
  int64_t remaining_;
  const int64_t limit_;
  int64_t result_elements_ = 0;
};

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

#endif  // ATTNSERVE_SERVER_TENSOR_CODEC_H_
