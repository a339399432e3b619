// What the gRPC front ends share to hand a call to the execution stack
// (server/execution/call_runner.h): the call's context in the core's terms, the
// response size check, and the reactor that answers a unary call.
//
// Thread safety: the functions are pure; a UnaryCallReactor is driven by the
// core (Computed, then Answer, once each, from any one thread at a time) and
// by gRPC (OnDone), and deletes itself in OnDone.
#ifndef ATTNSERVE_SERVER_TRANSPORT_UNARY_CALL_H_
#define ATTNSERVE_SERVER_TRANSPORT_UNARY_CALL_H_

#include <cstdint>
#include <string>

#include <functional>
#include <utility>

#include "google/protobuf/message.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/server_context.h"
#include "server/execution/call_runner.h"

namespace attnserve {

// RESOURCE_EXHAUSTED naming --max_message_bytes when `response` encodes to
// more than `max_response_bytes`; OK otherwise.
absl::Status CheckResponseSize(const google::protobuf::Message& response,
                               int64_t max_response_bytes);

// The core's view of a gRPC call: its peer, deadline and cancellation, and
// the model it counts for (empty: none). `context` must outlive the call.
CallContext ContextOf(grpc::CallbackServerContext* context,
                      std::string model = {});

// The typed API's per-request priority and timeout, from request metadata
// (Triton's parameters of the same names): `attnserve-priority` (1 the
// highest; see CallContext) and `attnserve-timeout-us` (microseconds), both
// decimal. INVALID_ARGUMENT naming the key for anything else.
inline constexpr char kPriorityMetadata[] = "attnserve-priority";
inline constexpr char kTimeoutMetadata[] = "attnserve-timeout-us";
absl::Status ApplyCallMetadata(grpc::CallbackServerContext* context,
                               CallContext* call);

// The reactor of one unary kernel call, and the core's responder for it:
// lets the service describe the computed call in its response (`describe`,
// when given: the typed API's ExecutionInfo), refuses a
// response over `max_response_bytes` with RESOURCE_EXHAUSTED, and holds the
// call's admission ticket until gRPC is done with the call (OnDone), then
// deletes itself. `response` belongs to gRPC's call.
class UnaryCallReactor final : public grpc::ServerUnaryReactor,
                               public CallResponder {
 public:
  // Fills the response from what the core recorded of the call.
  using Describe = std::function<void(const CallRecord&)>;

  UnaryCallReactor(google::protobuf::Message* response, Describe describe,
                   int64_t max_response_bytes)
      : response_(response),
        describe_(std::move(describe)),
        max_response_bytes_(max_response_bytes) {}

  absl::Status Computed(const CallRecord& record) override;
  void Answer(const absl::Status& status, const CallRecord& record,
              Admission::Ticket ticket) override;
  void OnDone() override { delete this; }
  void OnCancel() override {}

 private:
  google::protobuf::Message* const response_;
  const Describe describe_;
  const int64_t max_response_bytes_;
  Admission::Ticket ticket_;
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_TRANSPORT_UNARY_CALL_H_
