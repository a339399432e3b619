// Turns user-facing requests (attn/ops.h) into the validated params structs
// of attn/params.h, or INVALID_ARGUMENT naming the argument, the shape it got
// and the shape it expected.
//
// Pure functions: thread-safe, never block, never allocate tensors. The
// returned params have null output pointers; the caller allocates
// `output_shape` (and `weights_shape` when non-empty) and sets them.
#ifndef ATTN_VALIDATE_H_
#define ATTN_VALIDATE_H_

#include "absl/status/statusor.h"
#include "attn/ops.h"
#include "attn/params.h"
#include "attn/tensor.h"

namespace attn {

template <typename Params>
struct Plan {
  Params params;
  Shape output_shape;
  Shape weights_shape;  // empty when the weights were not requested
};

absl::StatusOr<Plan<MaskedSoftmaxParams>> ValidateMaskedSoftmax(
    const MaskedSoftmaxRequest& request);
absl::StatusOr<Plan<BatchMatmulParams>> ValidateBatchMatmul(
    const BatchMatmulRequest& request);
absl::StatusOr<Plan<AttentionParams>> ValidateAttention(
    const AttentionRequest& request);
absl::StatusOr<Plan<AdditiveAttentionParams>> ValidateAdditiveAttention(
    const AdditiveAttentionRequest& request);
absl::StatusOr<Plan<NadarayaWatsonParams>> ValidateNadarayaWatson(
    const NadarayaWatsonRequest& request);
// The same checks of shapes and options without reading the operands: a
// reduced precision's range check, which reads every element, is left to the
// validation before the kernel (keys and values held as bfloat16 keep their
// precision, which they alone decide). The params keep the request's
// precision. For sizing and batching a request before it runs.
absl::StatusOr<Plan<BatchMatmulParams>> ValidateBatchMatmulShapes(
    const BatchMatmulRequest& request);
absl::StatusOr<Plan<AttentionParams>> ValidateAttentionShapes(
    const AttentionRequest& request);
// ValidateAttention's check that a reduced precision's operands round to
// finite values (INVALID_ARGUMENT naming the operand and the element), alone:
// ValidateAttentionShapes plus this is ValidateAttention. For a caller that
// lets the kernel check the range as it rounds (attn/engine.cc).
absl::Status CheckAttentionOperandRange(const AttentionRequest& request);
// Checks the fit's inputs and hyperparameters; output_shape is unused.
absl::StatusOr<Plan<NadarayaWatsonParams>> ValidateFitBandwidth(
    const FitBandwidthRequest& request);

// A valid request's result, from its shapes alone: what a caller must be
// ready to hold and send before anything is allocated or computed (a server
// refuses a result it could not send, rather than computing it first). The
// request's validation error when it is not valid, except that operands
// beyond a reduced precision's range are not looked for here (reading every
// element; the kernel's own validation refuses them). Pure, like the rest.
struct ResultSize {
  Shape output_shape;
  Shape weights_shape;   // empty when the weights were not requested
  int64_t elements = 0;  // output and weights together, float32 each
};
absl::StatusOr<ResultSize> SizeOfResult(const MaskedSoftmaxRequest& request);
absl::StatusOr<ResultSize> SizeOfResult(const BatchMatmulRequest& request);
absl::StatusOr<ResultSize> SizeOfResult(const AttentionRequest& request);
absl::StatusOr<ResultSize> SizeOfResult(
    const AdditiveAttentionRequest& request);
absl::StatusOr<ResultSize> SizeOfResult(const NadarayaWatsonRequest& request);

}  // namespace attn

#endif  // ATTN_VALIDATE_H_
