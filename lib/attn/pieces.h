// Attention over a memory held in pieces: its keys and values cut by rows
// (rows appended at different times, or held by different replicas), each
// piece attended on its own, and the answers merged into the one the whole
// memory gives.
//
// A call over piece i that asks for AttentionRequest::return_log_sum_exp
// gives its output O_i (the softmax over its own keys) and, per query row,
// l_i = log sum_{j in piece i} exp(s_j). A softmax's sum splits over any
// partition of its keys, so with L = log sum_i exp(l_i):
//
//   output      = sum_i exp(l_i - L) O_i
//   weights     = [exp(l_i - L) W_i for each piece i], along the keys' axis
//   log-sum-exp = L
//
// exactly. L is a log-sum-exp again, so merged answers merge further, in
// any grouping: a replica may merge its own pieces, and whoever asked the
// replicas merge their answers.
//
// MergeAttentionPieces is a pure function of its arguments (thread-safe,
// blocking only for its own arithmetic); AttendInPieces runs the pieces on
// an engine first. In double, rounded once to float at the end. Beyond the pieces' own
// errors, a weight's error grows by those of l_i and L (each that of the
// row's sum of exponentials, plus float's rounding of the value l_i);
// attn/testing/error_bounds.h derives the bound the tests hold it to.
#ifndef ATTN_PIECES_H_
#define ATTN_PIECES_H_

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attn/engine.h"
#include "attn/ops.h"
#include "attn/tensor.h"

namespace attn {

// One piece's answer: the views must stay valid during the merge.
struct AttentionPiece {
  TensorView output;       // (..., Lq, v)
  TensorView log_sum_exp;  // (..., Lq): the output's shape without v
  TensorView weights;      // (..., Lq, n_i); no shape (an empty Tensor's
                           // view) when the pieces were asked for none
};

struct MergedAttention {
  Tensor output;       // the pieces' output shape
  Tensor weights;      // (..., Lq, n_0 + n_1 + ...), in the pieces' order;
                       // empty when the pieces have none
  Tensor log_sum_exp;  // (..., Lq); -inf for a row no piece had a key for
};

// Merges `pieces` (at least one), in their order. A row whose log-sum-exp
// is -inf in a piece (no key of that piece for it) takes nothing from it; a
// row with no key in any piece is all zeros. INVALID_ARGUMENT naming the
// piece and its field for: no piece; an output not of rank >= 2, or not of
// pieces[0]'s shape; a log_sum_exp not of the output's shape without its
// last axis; weights on some pieces but not all, or not of the output's
// leading axes with at least one key; a log-sum-exp that is NaN or +inf
// (past float's range: merging it would pass off a NaN as an answer).
// RESOURCE_EXHAUSTED when the merged weights would exceed
// kMaxTensorElements or cannot be allocated.
absl::StatusOr<MergedAttention> MergeAttentionPieces(
    absl::Span<const AttentionPiece> pieces);

// One call over a memory in pieces: `pieces` (at least one) are the call
// over each piece's keys and values, alike in everything else (queries,
// score, scale, masks, precision, return_weights). Runs each on `engine`
// with its log-sum-exp, in order, and merges them: the output, the weights
// (when asked for) over every piece's keys in order, and the log-sum-exp
// when pieces[0] asks for it. The implementation and backend reported are
// those of the piece with the most keys. A piece's failure is returned as
// the engine gave it; MergeAttentionPieces' statuses otherwise.
absl::StatusOr<OpResult> AttendInPieces(Engine& engine,
                                        absl::Span<const AttentionRequest> pieces);

}  // namespace attn

#endif  // ATTN_PIECES_H_
