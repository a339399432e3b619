// KServe v2's HTTP/REST encoding, in terms of the gRPC messages the KServe
// service already serves: a REST inference body becomes the
// ModelInferRequest the gRPC front end would have received, and the
// ModelInferResponse the core filled becomes the REST body, so both
// protocols share one inference path (server/kserve/infer_call.h) and
// differ only here. The Open Inference Protocol's REST binding with
// Triton's binary tensor data extension, as tritonclient.http and
// perf_analyzer send it:
//
// - Inputs as JSON `data` (row-major, flat or nested; numbers for the
//   numeric datatypes, true/false for BOOL) or as binary: the input's
//   parameter `binary_data_size` says how many bytes of the binary section
//   (the body past the JSON header, whose length the request's
//   Inference-Header-Content-Length header gives) are its raw contents, in
//   input order. Either way an input becomes raw_input_contents.
// - Outputs as JSON `data` (FP32 in the shortest form that reads back to
//   the same float; negative zero as -0.0, so that its sign survives
//   parsers that read -0 as an integer) or binary, per output (its parameter `binary_data`) or
//   for all (the request's parameter `binary_data_output`).
// - Every other parameter goes through as an InferParameter: a JSON bool,
//   integer, other number or string as bool_param, int64_param (uint64_param
//   above int64's range), double_param or string_param.
//
// The codec's parts, one file each: the inference request's reader
// (rest_infer_request.cc), the response's writer (rest_infer_response.cc),
// protobuf messages as JSON (rest_json.cc, over the readers' shared JSON
// parse in rest_json.h) and the repository extension's bodies
// (rest_repository.cc). Error bodies and the HTTP status of a status code
// are the HTTP transport's (server/transport/rest_call.h).
//
// Pure functions over the caller's objects; thread-compatible; none blocks.
// Every error is INVALID_ARGUMENT naming the field, except where noted. The
// parse is iterative (RapidJSON's kParseIterativeFlag) and nesting is capped,
// so a deep body costs no stack; a field given twice and a \u escape of a
// lone surrogate are refused. A data array whose datatype came first is
// read by the codec's own number scanner, past RapidJSON's (two fifths of
// the parse's cost on large tensors); anything but `number,` and `number]` in
// it goes back to RapidJSON, so errors read the same either way.
#ifndef ATTNSERVE_SERVER_KSERVE_REST_H_
#define ATTNSERVE_SERVER_KSERVE_REST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"
#include "google/protobuf/message.h"
#include "inference/grpc_service.pb.h"
#include "server/transport/rest_call.h"

namespace attnserve {

// A REST inference request, decoded.
struct RestInferRequest {
  inference::ModelInferRequest request;
  // The request's `binary_data_output` (default for every output), and the
  // outputs that said `binary_data` for themselves.
  bool binary_data_output = false;
  std::map<std::string, bool> output_binary;

  // Whether `output` goes back as binary data.
  bool Binary(const std::string& output) const;
};

// Decodes `body` for model `model_name` at `model_version` (empty: the
// served one). `json_length`: the Inference-Header-Content-Length header,
// absent when the body is JSON alone. Errors name the field: a body that is
// not JSON, an unknown field, a field of the wrong type, data that does not
// fit its datatype or has a count other than its shape's, a binary section
// shorter or longer than the inputs' binary_data_size, a header length
// beyond the body.
absl::Status ParseRestInferRequest(absl::string_view model_name,
                                   absl::string_view model_version,
                                   absl::string_view body,
                                   std::optional<uint64_t> json_length,
                                   RestInferRequest* out);

// The body of `response`, answering `request`: each output as JSON data or
// binary (RestInferRequest::Binary). Outputs other than FP32 go as binary.
void WriteRestInferResponse(const RestInferRequest& request,
                            const inference::ModelInferResponse& response,
                            RestBody* out);

// `message` as the REST API writes it: field names as in the .proto, 64-bit
// integers as JSON numbers, enums by name; unset messages, oneofs and empty
// repeated fields left out, plain scalars written even at their default
// (Triton's statistics have their zero counts to read).
std::string MessageToRestJson(const google::protobuf::Message& message);

// The body of a repository load or unload (`{"parameters": {...}}`,
// possibly empty) into `parameters`.
absl::Status ParseRestRepositoryParameters(
    absl::string_view body,
    google::protobuf::Map<std::string, inference::ModelRepositoryParameter>*
        parameters);

// The body of a repository index request (`{"ready": bool}`, possibly
// empty) into `request`.
absl::Status ParseRestRepositoryIndex(absl::string_view body,
                                      inference::RepositoryIndexRequest* request);

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_KSERVE_REST_H_
