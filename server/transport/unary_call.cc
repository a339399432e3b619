#include "server/transport/unary_call.h"

#include <chrono>
#include <optional>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/transport/status.h"

namespace attnserve {

absl::Status CheckResponseSize(const google::protobuf::Message& response,
                               int64_t max_response_bytes) {
  const size_t bytes = response.ByteSizeLong();
  if (static_cast<int64_t>(bytes) <= max_response_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the response would be ", bytes, " bytes, over the limit of ",
      max_response_bytes,
      " (--max_message_bytes); ask for less (e.g. no weights)"));
}

CallContext ContextOf(grpc::CallbackServerContext* context, std::string model) {
  CallContext call;
  call.peer = context->peer();
  call.deadline = absl::FromChrono(context->deadline());
  call.cancelled = [context] { return context->IsCancelled(); };
  call.model = std::move(model);
  return call;
}

namespace {

// The value of metadata `key` as a non-negative integer; nullopt if absent.
absl::StatusOr<std::optional<uint64_t>> MetadataNumber(
    grpc::CallbackServerContext* context, absl::string_view key) {
  const auto& metadata = context->client_metadata();
  auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return std::nullopt;
  const absl::string_view text(it->second.data(), it->second.size());
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value > (uint64_t{1} << 62)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metadata ", key, ": expected a non-negative integer, got \"", text,
        "\""));
  }
  return value;
}

}  // namespace

absl::Status ApplyCallMetadata(grpc::CallbackServerContext* context,
                               CallContext* call) {
  absl::StatusOr<std::optional<uint64_t>> priority =
      MetadataNumber(context, kPriorityMetadata);
  if (!priority.ok()) return priority.status();
  if (priority->has_value()) call->priority = **priority;
  absl::StatusOr<std::optional<uint64_t>> timeout =
      MetadataNumber(context, kTimeoutMetadata);
  if (!timeout.ok()) return timeout.status();
  if (timeout->has_value()) ApplyTimeout(static_cast<int64_t>(**timeout), call);
  return absl::OkStatus();
}

absl::Status UnaryCallReactor::Computed(const CallRecord& record) {
  if (describe_) describe_(record);
  absl::Status fits = CheckResponseSize(*response_, max_response_bytes_);
  if (!fits.ok()) response_->Clear();
  return fits;
}

void UnaryCallReactor::Answer(const absl::Status& status,
                              const CallRecord& /*record*/,
                              Admission::Ticket ticket) {
  ticket_ = std::move(ticket);
  Finish(ToGrpcStatus(status));
}

}  // namespace attnserve
