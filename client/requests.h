// attnctl's requests: the parsers for its flag values, and the functions that
// apply the flags to a request message, generating random inputs where asked.
//
// Generated data is reproducible: one std::mt19937 seeded with
// RequestOptions::seed per request, tensors drawn in field-number order.
// - Every tensor is N(0, 1), except for the two regression operations, which
//   get the textbook's data (Dive into Deep Learning, section 11.2):
//   x_train ~ U[0, 5) sorted, y_train = 2 sin(x) + x^0.8 + N(0, 0.5^2)
//   (x is the first column when x_train is (n, dx); |x|^0.8 if x < 0), and
//   x_query evenly spaced over [0, 5) (0, 0.1, ..., 4.9 for 50 points).
// - Without --input, tensors not named in --shape get the textbook's example
//   shapes:
//     masked-softmax      x 2x2x4
//     batch-matmul        a 2x1x4, b 2x4x6
//     attention           queries 2x1x2, keys 2x10x2, values 2x10x4
//     additive-attention  queries 2x1x20, keys 2x10x2, values 2x10x4,
//                         w_q (h, queries' width), w_k (h, keys' width),
//                         w_v (h,), h = 8 unless a --shape of w_* says
//     nadaraya-watson     x_train 50, y_train (x_train's rows,),
//                         x_query 50 (50xdx when x_train is (n, dx))
//     fit-bandwidth       x_train 50, y_train (x_train's rows,)
//     append              keys 10x2, values 10x4 (the chapter's memory)
//
// Thread-compatible: pure functions over the caller's objects. Every error is
// INVALID_ARGUMENT (a usage error; not retryable) and says what is wrong.
#ifndef ATTNSERVE_CLIENT_REQUESTS_H_
#define ATTNSERVE_CLIENT_REQUESTS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "attention/v1/attention.pb.h"

namespace attnctl {

// A tensor shape, outermost dimension first.
using Dims = std::vector<int64_t>;

// The most elements attnctl generates for one tensor (256 MiB of float32).
inline constexpr int64_t kMaxGeneratedElements = int64_t{1} << 26;

// One --shape item: a request tensor's field name and the shape to generate.
struct NamedShape {
  std::string name;
  Dims dims;
};

// What the request flags say. An unset field leaves the request as it is
// (as read from --input, or empty).
struct RequestOptions {
  // Tensors to fill with fresh random data, by field name.
  std::vector<NamedShape> shapes;
  // True without --input: every tensor not in `shapes` is generated too,
  // with its default shape.
  bool generate_missing = false;
  uint32_t seed = 0;

  std::optional<attention::v1::Lengths> valid_lens;
  std::optional<bool> causal;
  std::optional<float> scale;
  std::optional<attention::v1::Score> score;
  std::optional<bool> return_weights;
  std::optional<attention::v1::Precision> precision;
  std::optional<attention::v1::RegressionKernel> kernel;
  std::optional<float> bandwidth;
  std::optional<int32_t> epochs;
  std::optional<float> learning_rate;
  std::optional<float> initial_bandwidth;
  // attention: a stored memory of the server answers the queries; keys and
  // values are then generated only when named in `shapes`.
  std::optional<std::string> memory_name;
  // nadaraya-watson: a stored nadaraya_watson model serves its bandwidth
  // (and training set, when it holds one); the training set is then
  // generated only when named in `shapes`.
  std::optional<std::string> model_name;
  // fit-bandwidth: saves the fitted model into the server's repository.
  std::optional<std::string> save_as;
  // append: the model to append to (from --memory_name), and whether the
  // append may make the memory, with `score`, `scale` and `precision`.
  bool create = false;
  // evict: the rows to drop (with memory_name).
  std::optional<int64_t> oldest;
  // append with create: the memory's max_rows window.
  std::optional<int64_t> max_rows;
  // Re-encodes every request tensor and sets output_encoding (where the
  // request has one).
  std::optional<attention::v1::TensorEncoding> encoding;
};

// --- Parsers for flag values. Their messages do not name the flag; the
// caller prefixes it.

// "2x10x4" -> {2, 10, 4}: 1 to 8 dimensions, each >= 0, at most
// kMaxGeneratedElements elements in all.
absl::StatusOr<Dims> ParseDims(absl::string_view text);

// Items like "queries=2x1x2"; every name at most once.
absl::StatusOr<std::vector<NamedShape>> ParseShapes(
    const std::vector<std::string>& items);

// "2,6" -> {2, 6}. `shape` (empty: (count,)) must hold as many values.
absl::StatusOr<attention::v1::Lengths> ParseLengths(absl::string_view values,
                                                    const Dims& shape);

// "dot" | "gaussian".
absl::StatusOr<attention::v1::Score> ParseScore(absl::string_view text);
// "fp32" | "bf16".
absl::StatusOr<attention::v1::Precision> ParsePrecision(absl::string_view text);
// "gaussian" | "boxcar" | "constant" | "epanechnikov".
absl::StatusOr<attention::v1::RegressionKernel> ParseKernel(
    absl::string_view text);
// "values" | "raw".
absl::StatusOr<attention::v1::TensorEncoding> ParseEncoding(
    absl::string_view text);

// --- Applying the options. Each overwrites the fields `options` sets and
// generates the tensors it asks for. Errors: a --shape name the request does
// not have, shapes the data generator cannot honour (y_train rows differ
// from x_train's), malformed raw bytes when re-encoding.
absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::MaskedSoftmaxRequest* request);
absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::BatchMatmulRequest* request);
absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::AttentionRequest* request);
absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::AdditiveAttentionRequest* request);
absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::NadarayaWatsonRequest* request);
absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::FitBandwidthRequest* request);
// Also INVALID_ARGUMENT for score, scale or precision without `create`.
absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::AppendMemoryRequest* request);
absl::Status ApplyOptions(const RequestOptions& options,
                          attention::v1::EvictMemoryRequest* request);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_REQUESTS_H_
