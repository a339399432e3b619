// `attnctl load`'s request pool: the serialized requests a load run cycles
// through, built once before it starts so that no protobuf work happens per
// call. A pool can mix shapes (--mix), draw key lengths (--lk_range) and
// valid lengths (--valid_lens_range) per entry.
//
// Thread-compatible: pure functions over the caller's objects; none blocks.
// Every error is INVALID_ARGUMENT (a usage error; not retryable).
#ifndef ATTNSERVE_CLIENT_LOAD_POOL_H_
#define ATTNSERVE_CLIENT_LOAD_POOL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/load_rpc.h"
#include "client/requests.h"

namespace attnctl {

// An inclusive integer range, "lo:hi".
struct IntRange {
  int64_t lo = 0;
  int64_t hi = 0;
};

// "16:128" -> {16, 128}; needs min_lo <= lo <= hi. INVALID_ARGUMENT
// otherwise (the message does not name the flag).
absl::StatusOr<IntRange> ParseRange(absl::string_view text, int64_t min_lo);

// One --mix variant: --shape items and the variant's share of the pool.
struct MixVariant {
  double weight = 1.0;
  std::vector<NamedShape> shapes;
};

// "[W:]NAME=DIMS,NAME=DIMS;[W:]NAME=DIMS,..." -> variants. W is a positive
// number (default 1); empty variants (a trailing ';') are skipped; at least
// one is needed. INVALID_ARGUMENT names the variant at fault.
absl::StatusOr<std::vector<MixVariant>> ParseMix(absl::string_view text);

inline constexpr int kDefaultPoolSize = 64;
// The most bytes of serialized requests a pool may hold.
inline constexpr int64_t kMaxPoolBytes = int64_t{1} << 30;

struct PoolOptions {
  LoadRpc rpc = LoadRpc::kScaledDotProductAttention;
  // The request flags, as for the RPC's own subcommand. Entry i of the pool
  // is generated with seed request.seed + i; `shapes` is the base that every
  // mix variant's shapes override, name by name.
  RequestOptions request;
  // A request in protobuf's JSON mapping (--input) that every entry starts
  // from; empty: start from an empty request.
  std::string input_json;
  // Empty: one variant, `request.shapes` alone.
  std::vector<MixVariant> mix;
  // Per entry, a key length drawn uniformly from the range: the length
  // (second-to-last) dimension of keys and values for attention and
  // additive-attention, the last dimension of x for masked-softmax.
  std::optional<IntRange> lk_range;
  // Per entry, valid lengths of shape (B,), each drawn uniformly from the
  // range clipped to [0, K] (K: the entry's key length). Same RPCs as
  // lk_range; excludes request.valid_lens.
  std::optional<IntRange> valid_lens_range;
  int pool_size = kDefaultPoolSize;
  // grpc.health.v1 Check's `service` (for LoadRpc::kHealth).
  std::string health_service;
};

struct RequestPool {
  LoadRpc rpc = LoadRpc::kScaledDotProductAttention;
  // The full method name, like "/attention.v1.AttentionService/BatchMatmul".
  std::string method;
  // Serialized request messages, in the order calls cycle through them.
  std::vector<std::string> requests;
  // How many entries each mix variant got (one count without --mix).
  std::vector<int> variant_counts;
  int64_t bytes = 0;
};

// Builds the pool: `pool_size` requests (one for health, whose request never
// varies), each variant getting a share proportional to its weight
// (largest remainder; a variant whose share rounds to zero gets no entry),
// in a seeded shuffled order. Deterministic for given options.
//
// Thread-compatible; does not block. INVALID_ARGUMENT (a usage error):
// a bad --input or --shape for the RPC, lk_range/valid_lens_range for an RPC
// they do not apply to or a tensor of too low rank, valid_lens_range with
// request.valid_lens, pool_size < 1, or a pool over kMaxPoolBytes.
absl::StatusOr<RequestPool> BuildRequestPool(const PoolOptions& options);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_LOAD_POOL_H_
