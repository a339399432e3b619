// onednn-softmax: a masked softmax without valid lengths is a plain softmax
// of every row, oneDNN's softmax primitive.

#include "absl/status/status.h"
#include "attn/internal/cpu/implementation.h"
#include "attn/internal/cpu/onednn_primitives.h"
#include "attn/params.h"

namespace attn::internal {
namespace {

// Every call without valid lengths.
bool Takes(const CpuCall<MaskedSoftmaxParams>& call) {
  return call.params.valid.kind == ValidLengths::Kind::kNone;
}

absl::Status Run(const CpuCall<MaskedSoftmaxParams>& call) {
  const MaskedSoftmaxParams& p = call.params;
  return call.primitives.Softmax(p.x, p.out, p.batch * p.rows, p.columns);
}

}  // namespace

const CpuImplementation<MaskedSoftmaxParams> kOneDnnSoftmax = {
    "onednn-softmax", Takes, Run};

}  // namespace attn::internal
