#include "server/kserve/rest_service.h"

#include <charconv>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/kserve/infer_call.h"
#include "server/kserve/metadata.h"
#include "server/kserve/model_control.h"
#include "server/kserve/statistics.h"

namespace attnserve {
namespace {

constexpr char kJson[] = "application/json";

// One path segment, percent-decoded; nullopt for a malformed escape.
std::optional<std::string> Decode(absl::string_view segment) {
  std::string out;
  out.reserve(segment.size());
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] != '%') {
      out.push_back(segment[i]);
      continue;
    }
    if (i + 2 >= segment.size()) return std::nullopt;
    int value = 0;
    auto [end, error] = std::from_chars(segment.data() + i + 1,
                                        segment.data() + i + 3, value, 16);
    if (error != std::errc() || end != segment.data() + i + 3) {
      return std::nullopt;
    }
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

void ReplyStatus(RestResponder* responder, const absl::Status& status) {
  responder->Reply(HttpStatusOf(status.code()), kJson,
                   RestBody{RestErrorBody(status), std::nullopt, {}},
                   Admission::Ticket());
}

void ReplyJson(RestResponder* responder, std::string json) {
  responder->Reply(200, kJson, RestBody{std::move(json), std::nullopt, {}},
                   Admission::Ticket());
}

void ReplyEmpty(RestResponder* responder, int http_status) {
  responder->Reply(http_status, "", RestBody{}, Admission::Ticket());
}

// The core's responder for one REST inference: writes the body on the
// worker that computed it (Computed), refuses one over the response limit,
// and hands it to the HTTP responder with the admission ticket (Answer).
// Owns the call's decoded request and the response; deletes itself.
class RestInferCall final : public CallResponder {
 public:
  RestInferCall(RestResponder* responder, int64_t max_response_bytes)
      : responder_(responder), max_response_bytes_(max_response_bytes) {}

  RestInferRequest& request() { return request_; }
  inference::ModelInferResponse* response() { return &response_; }

  absl::Status Computed(const CallRecord&) override {
    WriteRestInferResponse(request_, response_, &body_);
    response_.Clear();
    if (static_cast<int64_t>(body_.bytes.size()) > max_response_bytes_) {
      const size_t size = body_.bytes.size();
      body_ = RestBody{};
      return absl::ResourceExhaustedError(absl::StrCat(
          "the response body would be ", size,
          " bytes, over the limit of ", max_response_bytes_,
          " (--max_message_bytes); ask for binary_data outputs, which "
          "take 4 bytes per element"));
    }
    return absl::OkStatus();
  }

  void Answer(const absl::Status& status, const CallRecord&,
              Admission::Ticket ticket) override {
    if (status.ok()) {
      const bool binary = body_.json_length.has_value();
      responder_->Reply(200, binary ? "application/octet-stream" : kJson,
                        std::move(body_), std::move(ticket));
    } else {
      responder_->Reply(HttpStatusOf(status.code()), kJson,
                        RestBody{RestErrorBody(status), std::nullopt, {}},
                        std::move(ticket));
    }
    delete this;
  }

 private:
  RestResponder* const responder_;
  const int64_t max_response_bytes_;
  RestInferRequest request_;
  inference::ModelInferResponse response_;
  RestBody body_;
};

}  // namespace

KServeRestService::KServeRestService(ExecutionStack* stack,
                                     ModelCatalogue* catalogue,
                                     int max_batch_size)
    : stack_(stack),
      calls_(&stack->calls()),
      catalogue_(catalogue),
      max_batch_size_(max_batch_size) {}

void KServeRestService::Handle(const RestCall& call,
                               RestResponder* responder) {
  // The segments after the leading '/', the query string dropped.
  absl::string_view path = call.path;
  if (size_t query = path.find('?'); query != absl::string_view::npos) {
    path = path.substr(0, query);
  }
  std::vector<std::string> parts;
  for (absl::string_view segment :
       absl::StrSplit(path, '/', absl::SkipEmpty())) {
    std::optional<std::string> decoded = Decode(segment);
    if (!decoded.has_value()) {
      return Unresolved(responder, absl::InvalidArgumentError(absl::StrCat(
                                       "malformed percent-escape in the "
                                       "path '", path, "'")));
    }
    parts.push_back(*std::move(decoded));
  }
  const bool get = call.method == "GET";
  const bool post = call.method == "POST";
  // 405 with Allow, as RFC 9110 asks (no gRPC code maps to it).
  auto wrong_method = [&](const char* allowed) {
    const absl::Status status = absl::InvalidArgumentError(
        absl::StrCat(call.method, " ", path, ": use ", allowed));
    stack_->metrics().RequestRefused(std::nullopt, Protocol::kHttp,
                                     status.code());
    RestBody body{RestErrorBody(status), std::nullopt, {{"Allow", allowed}}};
    responder->Reply(405, kJson, std::move(body), Admission::Ticket());
  };
  const size_t n = parts.size();
  if (n == 0 || parts[0] != "v2") {
    return Unresolved(responder, absl::NotFoundError(absl::StrCat(
                                     "no endpoint at '", path,
                                     "'; the KServe v2 API is under /v2")));
  }
  if (n == 1) {
    if (!get) return wrong_method("GET");
    inference::ServerMetadataResponse metadata;
    DescribeServer(&metadata);
    return ReplyJson(responder, MessageToRestJson(metadata));
  }
  if (parts[1] == "health" && n == 3 &&
      (parts[2] == "live" || parts[2] == "ready")) {
    if (!get) return wrong_method("GET");
    const bool ok = parts[2] == "live" || stack_->ready();
    return ReplyEmpty(responder, ok ? 200 : 503);
  }
  if (parts[1] == "repository") {
    if (!post) return wrong_method("POST");
    if (n == 3 && parts[2] == "index") {
      inference::RepositoryIndexRequest request;
      if (absl::Status status = ParseRestRepositoryIndex(call.body, &request);
          !status.ok()) {
        return ReplyStatus(responder, status);
      }
      inference::RepositoryIndexResponse index;
      EncodeIndex(catalogue_->Index(stack_->ready(), request.ready()), &index);
      // Triton answers the list itself.
      std::string json = "[";
      for (int i = 0; i < index.models_size(); ++i) {
        if (i > 0) json.push_back(',');
        json.append(MessageToRestJson(index.models(i)));
      }
      json.push_back(']');
      return ReplyJson(responder, std::move(json));
    }
    if (n == 5 && parts[2] == "models" &&
        (parts[4] == "load" || parts[4] == "unload")) {
      absl::Status status;
      if (parts[4] == "load") {
        inference::RepositoryModelLoadRequest request;
        request.set_model_name(parts[3]);
        status = ParseRestRepositoryParameters(call.body,
                                               request.mutable_parameters());
        if (status.ok()) {
          status = LoadModel(*catalogue_, call.may_control_models, parts[3],
                             request.mutable_parameters());
        }
      } else {
        inference::RepositoryModelUnloadRequest request;
        request.set_model_name(parts[3]);
        status = ParseRestRepositoryParameters(call.body,
                                               request.mutable_parameters());
        if (status.ok()) {
          status = catalogue_->Unload(call.may_control_models, parts[3],
                                      ParameterNames(request.parameters()));
        }
      }
      if (!status.ok()) return ReplyStatus(responder, status);
      return ReplyEmpty(responder, 200);
    }
  }
  if (parts[1] == "models") {
    if (n == 3 && parts[2] == "stats") {
      if (!get) return wrong_method("GET");
      inference::ModelStatisticsResponse statistics;
      for (const std::string& name : catalogue_->Names()) {
        ReportModelStatistics(name, calls_->statistics().Get(name),
                              statistics.add_model_stats());
      }
      return ReplyJson(responder, MessageToRestJson(statistics));
    }
    // /v2/models/{m}[/versions/{v}][/{action}]
    if (n >= 3) {
      const std::string& model = parts[2];
      size_t next = 3;
      std::string version;
      if (n >= 5 && parts[3] == "versions") {
        version = parts[4];
        next = 5;
      }
      if (n <= next + 1) {
        const std::string action = n == next + 1 ? parts[next] : "";
        if (action == "infer") {
          if (!post) return wrong_method("POST");
          return Infer(call, model, version, responder);
        }
        if (action.empty() || action == "ready" || action == "config" ||
            action == "stats") {
          if (!get) return wrong_method("GET");
          absl::StatusOr<ServedModel> resolved =
              catalogue_->Resolve(model, version);
          if (!resolved.ok()) return ReplyStatus(responder, resolved.status());
          if (action == "ready") {
            return ReplyEmpty(responder, stack_->ready() ? 200 : 503);
          }
          if (action.empty()) {
            inference::ModelMetadataResponse metadata;
            DescribeModel(resolved->signature, &metadata);
            return ReplyJson(responder, MessageToRestJson(metadata));
          }
          if (action == "config") {
            inference::ModelConfig config;
            ConfigureModel(*resolved, max_batch_size_,
                           stack_->batching(),
                           &config);
            return ReplyJson(responder, MessageToRestJson(config));
          }
          inference::ModelStatisticsResponse statistics;
          ReportModelStatistics(model, calls_->statistics().Get(model),
                                statistics.add_model_stats());
          return ReplyJson(responder, MessageToRestJson(statistics));
        }
      }
    }
  }
  Unresolved(responder,
             absl::NotFoundError(absl::StrCat(
                 "no endpoint at '", path,
                 "' (see docs/kserve.md, \"HTTP/REST\", for the list)")));
}

void KServeRestService::Unresolved(RestResponder* responder,
                                   const absl::Status& status) {
  stack_->metrics().RequestRefused(std::nullopt, Protocol::kHttp,
                                   status.code());
  ReplyStatus(responder, status);
}

void KServeRestService::Infer(const RestCall& call, const std::string& model,
                              const std::string& version,
                              RestResponder* responder) {
  std::optional<uint64_t> json_length;
  if (call.json_header_length.has_value()) {
    uint64_t value = 0;
    const absl::string_view text = *call.json_header_length;
    auto [end, error] =
        std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) {
      return Unresolved(responder,
                        absl::InvalidArgumentError(absl::StrCat(
                            "Inference-Header-Content-Length: '", text,
                            "' is not a non-negative integer")));
    }
    json_length = value;
  }
  auto* infer = new RestInferCall(responder,
                                  calls_->limits().max_response_bytes);
  if (absl::Status status = ParseRestInferRequest(
          model, version, call.body, json_length, &infer->request());
      !status.ok()) {
    delete infer;
    return Unresolved(responder, status);
  }
  CallContext context;
  context.peer = call.peer;
  context.protocol = Protocol::kHttp;
  KServeInferCall::Start(*catalogue_, calls_, &infer->request().request,
                         infer->response(), std::move(context), infer);
}

}  // namespace attnserve
