// What may be batched, and how: the rules that let the batcher
// (server/execution/batcher.h) run several requests of one operation as one
// library call, each result equal to the request run alone.
//
// Every operation with a batch dimension is batchable. Requests join the
// same class when everything but their batch and ragged extents agree; the
// class key says what must agree:
// - masked softmax x (B, Q, K): nothing but the layout. Q and K are padded
//   to the batch's longest; padded columns are masked through per-row valid
//   lengths (exactly zero weight), padded rows are dropped.
// - batch matmul a (n, m, k) x b (n, k, p): k, p and the precision; m is
//   padded with zero rows, which are dropped.
// - scaled dot-product attention: heads, d, v, score kind, resolved scale,
//   causal flag, precision, layout and the weights flag; Lq and Lk padded
//   and masked as for the softmax.
// - additive attention: the feature sizes, the weights flag and the
//   weights W_q, W_k, w_v themselves (equal contents: a repository model's,
//   or any client's identical ones); Lq and Lk padded and masked.
// - Nadaraya-Watson: the training set itself (x_train, y_train contents),
//   kernel, bandwidth, weights flag and layout; the queries are
//   concatenated.
// - a call on a stored version (StoredRequest): the version itself, by
//   identity (its contents are never hashed: it may hold gigabytes), and
//   what its library request must agree on as above; the query rows are
//   stacked, so the batch reads the version once.
// Operands that must be equal are keyed by a hash of their contents and
// compared in full before they are combined: a request whose operands only
// collide in the hash runs alone.
//
// Thread-safe; RunTogether blocks while the engine computes, and keeps the
// combined inputs in buffers of the calling thread (up to 4 x 4 MiB),
// reused by its next batch: a batch's buffers freed and faulted in again
// every time cost more than the batch's copies (server/process/malloc_policy.h).
#ifndef ATTNSERVE_SERVER_EXECUTION_BATCHABLE_H_
#define ATTNSERVE_SERVER_EXECUTION_BATCHABLE_H_

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "attn/engine.h"
#include "attn/ops.h"
#include "server/execution/operation.h"

namespace attnserve {

// Where a request may be batched.
struct BatchClass {
  // Requests with equal keys may run together.
  std::string key;
  // Its input elements, as a batch would hold them (the request's own, not
  // padded): what max_batch_elements bounds.
  int64_t elements = 0;
  // A batch's work is one pass over keys the class's requests share (a
  // stored version's) that the wide engine spreads across its threads: it
  // can run on every core, one batch at a time (Batcher's wide engine).
  bool shares_a_pass = false;
};

// Validates `request` (INVALID_ARGUMENT in the library's words, as the
// engine would answer) and classifies it; `wide_engine` (may be null: no
// class then shares a pass) answers whether a batch is worth every core.
absl::StatusOr<BatchClass> ClassifyForBatching(
    const OperationRequest& request,
    const attn::Engine* wide_engine = nullptr);

// What a combined run computed: the padded batch's and the members' own
// score (or output) elements; their difference is padding.
struct CombinedWork {
  int64_t computed_elements = 0;
  int64_t useful_elements = 0;
  // How many requests the combined call computed together (0 when none
  // was made), and whether each request was one of them (the others ran
  // alone), by position.
  int combined_requests = 0;
  std::vector<bool> in_combined_call;
};

// Runs valid requests of one class (equal ClassifyForBatching keys) as one
// library call and splits the result: results[i] belongs to requests[i].
// A member whose hash-keyed operands differ from the first member's runs
// alone, and if the combined call fails (e.g. out of memory) every member
// is retried alone, so that each answer is the request's own.
std::vector<absl::StatusOr<attn::OpResult>> RunTogether(
    attn::Engine& engine, absl::Span<const OperationRequest* const> requests,
    CombinedWork* work);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_BATCHABLE_H_
