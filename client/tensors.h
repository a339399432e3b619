// Wire tensors (attention.v1.Tensor) as attnctl handles them: reading and
// writing their data in either encoding, and visiting every tensor inside a
// request or response message.
//
// The `raw` encoding is little-endian float32, whatever the host's byte order.
// Thread-compatible: pure functions over the caller's objects.
#ifndef ATTNSERVE_CLIENT_TENSORS_H_
#define ATTNSERVE_CLIENT_TENSORS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attention/v1/attention.pb.h"
#include "google/protobuf/message.h"

namespace attnctl {

// The tensor's elements, from `values` or decoded from `raw`, whichever is
// set (`values` when both are). INVALID_ARGUMENT when `raw` is not a whole
// number of float32s.
absl::StatusOr<std::vector<float>> ReadElements(
    const attention::v1::Tensor& tensor);

// Replaces the tensor's data (not its shape) with `elements` in `encoding`,
// clearing the other encoding's field.
void WriteElements(absl::Span<const float> elements,
                   attention::v1::TensorEncoding encoding,
                   attention::v1::Tensor* tensor);

// Moves the tensor's data into `encoding`. A tensor with malformed `raw`
// bytes is left as it is and INVALID_ARGUMENT is returned.
absl::Status Reencode(attention::v1::TensorEncoding encoding,
                      attention::v1::Tensor* tensor);

// Calls `visit` on every attention.v1.Tensor set inside `message`, at any
// depth (a request's inputs, additive attention's weights, a response's
// outputs), in field-number order. `path` names the tensor's field from
// `message`, e.g. "queries" or "weights.w_q".
using TensorVisitor =
    std::function<void(const std::string& path, attention::v1::Tensor*)>;
void ForEachTensor(google::protobuf::Message* message,
                   const TensorVisitor& visit);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_TENSORS_H_
