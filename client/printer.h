// How attnctl prints a response: one line of JSON on stdout.
//
// Thread-compatible: pure functions over the caller's objects.
#ifndef ATTNSERVE_CLIENT_PRINTER_H_
#define ATTNSERVE_CLIENT_PRINTER_H_

#include <string>

#include "absl/status/statusor.h"
#include "google/protobuf/message.h"

namespace attnctl {

// --summary shows tensors and numeric lists of more elements than this as
// statistics; smaller ones are shown in full.
inline constexpr int kSummaryMaxElements = 16;

struct PrintOptions {
  // Keep `raw` tensors as protobuf's base64 instead of decoding them into
  // `values`. Ignored by the summary, which always reads the numbers.
  bool keep_raw = false;
  // Print the summary form instead of the full response.
  bool summary = false;
};

// Formats `response` as one line of JSON, without a trailing newline.
//
// Full form: protobuf's canonical JSON mapping (proto field names, fields at
// their default value left out; int64 as strings, NaN as "NaN"), after
// decoding every `raw` tensor into `values` unless options.keep_raw. This
// decodes `response` in place; a tensor whose raw bytes are not a whole
// number of float32s stays raw.
//
// Summary form, for people: the same fields in the same order, but a tensor
// of more than kSummaryMaxElements elements becomes
//   {"shape": [2, 1, 10], "count": 20, "min": ..., "max": ..., "mean": ...}
// (statistics over the finite elements, plus "non_finite": k when some are
// NaN or infinite), and so does a longer numeric list such as
// loss_per_epoch, without the shape. Shapes and integers are plain numbers.
//
// Errors: INTERNAL when protobuf cannot print the message (not expected for
// attention.v1 responses).
absl::StatusOr<std::string> FormatResponse(const PrintOptions& options,
                                           google::protobuf::Message* response);

}  // namespace attnctl

#endif  // ATTNSERVE_CLIENT_PRINTER_H_
