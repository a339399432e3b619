#include "server/api/unary_call.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/api/status.h"

namespace attnserve {

CallContext ContextOf(grpc::CallbackServerContext* context, std::string model) {
  CallContext call;
  call.peer = context->peer();
  call.deadline = absl::FromChrono(context->deadline());
  call.cancelled = [context] { return context->IsCancelled(); };
  call.model = std::move(model);
  return call;
}

absl::Status UnaryCallReactor::Computed(const CallRecord& record) {
  if (info_ != nullptr) {
    info_->set_implementation(record.implementation);
    info_->set_kernel_seconds(absl::ToDoubleSeconds(record.compute));
    info_->set_queue_seconds(absl::ToDoubleSeconds(record.queue));
  }
  const size_t bytes = response_->ByteSizeLong();
  if (static_cast<int64_t>(bytes) > max_response_bytes_) {
    response_->Clear();
    return absl::ResourceExhaustedError(absl::StrCat(
        "the response would be ", bytes, " bytes, over the limit of ",
        max_response_bytes_,
        " (--max_message_bytes); ask for less (e.g. no weights)"));
  }
  return absl::OkStatus();
}

void UnaryCallReactor::Answer(const absl::Status& status,
                              const CallRecord& /*record*/,
                              Admission::Ticket ticket) {
  ticket_ = std::move(ticket);
  Finish(ToGrpcStatus(status));
}

}  // namespace attnserve
