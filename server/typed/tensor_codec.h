// Converts the wire's tensors (attention.v1.Tensor, Lengths) to the kernel
// library's views and back.
//
// Decoding is zero-copy where it can be, and checks every tensor as every
// front end does (server/models/input_decoding.h): as many elements as its
// shape says, every element finite, the element budget; and exactly one of
// values/raw set. Errors are INVALID_ARGUMENT naming the field.
//
// Thread-compatible: pure functions over the caller's objects.
#ifndef ATTNSERVE_SERVER_TYPED_TENSOR_CODEC_H_
#define ATTNSERVE_SERVER_TYPED_TENSOR_CODEC_H_

#include <cstdint>
#include <deque>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/v1/attention.pb.h"
#include "attn/tensor.h"
#include "server/execution/element_budget.h"
#include "server/models/input_decoding.h"

namespace attnserve {

// An unset tensor (no shape, no data) decodes to an empty view, which the
// library then rejects naming the field and the shape it expected.
absl::StatusOr<attn::TensorView> DecodeTensor(
    absl::string_view field, const attention::v1::Tensor& tensor,
    ElementBudget* budget, DecodeStorage* storage);

// An unset Lengths (no shape, no values) decodes to "no valid lengths".
absl::StatusOr<attn::LengthsView> DecodeLengths(
    absl::string_view field, const attention::v1::Lengths& lengths);

void EncodeTensor(const attn::Tensor& tensor,
                  attention::v1::TensorEncoding encoding,
                  attention::v1::Tensor* out);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_TYPED_TENSOR_CODEC_H_
