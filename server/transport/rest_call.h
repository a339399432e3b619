// What the HTTP server (server/transport/http_server.h) hands the REST
// front end behind it, and what it takes back: one request, the responder
// that answers it, and the response body. The transport knows no model and
// no protocol beyond HTTP; the front end (KServe's REST face,
// server/kserve/rest_service.h) knows no HTTP library.
//
// Plain values and interfaces; a RestHandler must be thread-safe (every
// event loop calls it).
#ifndef ATTNSERVE_SERVER_TRANSPORT_REST_CALL_H_
#define ATTNSERVE_SERVER_TRANSPORT_REST_CALL_H_

#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/execution/admission.h"

namespace attnserve {

// One HTTP request as the front end sees it. Borrowed for the duration of
// Handle; `body` must live until the call's Reply.
struct RestCall {
  absl::string_view method;  // "GET", "POST", ...
  absl::string_view path;    // the URI's path, still percent-encoded
  absl::string_view body;
  // The Inference-Header-Content-Length header, when given.
  std::optional<absl::string_view> json_header_length;
  std::string peer;  // the connection, for admission's per-peer share
  // The caller's bearer token grants model_control (or tokens are off).
  bool may_control_models = true;
};

// A response body: JSON, then (when `json_length` is set) the binary
// section; the Inference-Header-Content-Length header is `json_length`.
struct RestBody {
  std::string bytes;
  std::optional<size_t> json_length;
  // Response headers beyond Content-Type and the header length (a 405's
  // Allow).
  std::vector<std::pair<std::string, std::string>> headers;
};

// Answers one RestCall, exactly once, from any thread.
class RestResponder {
 public:
  virtual ~RestResponder() = default;
  // `content_type` is empty for an empty body. Keep `ticket` (the call's
  // admitted bytes) until the response has been sent.
  virtual void Reply(int http_status, std::string content_type, RestBody body,
                     Admission::Ticket ticket) = 0;
};

// Appends `text` as a JSON string literal, quotes included.
void AppendJsonString(absl::string_view text, std::string* out);
// A JSON string literal, quotes included, for `text`.
std::string JsonString(absl::string_view text);

// {"error": "<message>"}: the body of every REST error.
std::string RestErrorBody(const absl::Status& status);

// The HTTP status a gRPC status code maps to (google.rpc.Code's mapping:
// 400 for INVALID_ARGUMENT, FAILED_PRECONDITION and OUT_OF_RANGE, 401
// UNAUTHENTICATED, 403 PERMISSION_DENIED, 404 NOT_FOUND, 409 ALREADY_EXISTS
// and ABORTED, 429 RESOURCE_EXHAUSTED, 499 CANCELLED, 501 UNIMPLEMENTED,
// 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED, 500 otherwise; 200 for OK).
int HttpStatusOf(absl::StatusCode code);

// The front end behind the HTTP server.
class RestHandler {
 public:
  virtual ~RestHandler() = default;
  // Routes `call`; `responder` answers it, before Handle returns or later
  // (from a worker).
  virtual void Handle(const RestCall& call, RestResponder* responder) = 0;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_TRANSPORT_REST_CALL_H_
