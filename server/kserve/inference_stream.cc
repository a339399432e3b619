// ModelStreamInfer: many inferences on one bidirectional stream.
#include <deque>
#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/kserve/inference_service.h"
#include "server/transport/unary_call.h"

namespace attnserve {

// One stream. Reads requests one after another and hands each to the core as
// a call of its own; writes each answer when it comes (one write in flight
// at a time, in completion order). Ends when the client has half-closed and
// every answer is written; if the stream breaks, once every call in flight
// has answered (their responders point here), so nothing outlives it.
class InferenceService::StreamReactor final
    : public grpc::ServerBidiReactor<inference::ModelInferRequest,
                                     inference::ModelStreamInferResponse> {
 public:
  StreamReactor(InferenceService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context) {
    ReadNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-closed by the client, or broken
      bool finish;
      {
        absl::MutexLock lock(&mu_);
        reads_done_ = true;
        finish = ShouldFinish();
      }
      reading_.reset();
      if (finish) FinishStream();
      return;
    }
    Call* call = reading_.release();
    {
      absl::MutexLock lock(&mu_);
      ++pending_;
    }
    ReadNext();
    service_->Infer(&call->request, call->response.mutable_infer_response(),
                    ContextOf(context_), call);
  }

  void OnWriteDone(bool ok) override {
    Call* next = nullptr;
    bool finish;
    std::unique_ptr<Call> written;
    std::deque<std::unique_ptr<Call>> dropped;
    {
      absl::MutexLock lock(&mu_);
      written.reset(queue_.front());
      queue_.pop_front();
      --pending_;
      if (!ok) broken_ = true;
      if (broken_) {
        // Nothing more can be written: let the queued answers go (their
        // admission tickets with them).
        for (Call* call : queue_) dropped.emplace_back(call);
        pending_ -= static_cast<int>(queue_.size());
        queue_.clear();
      }
      if (queue_.empty()) {
        writing_ = false;
      } else {
        next = queue_.front();
      }
      finish = ShouldFinish();
    }
    written.reset();
    dropped.clear();
    if (next != nullptr) StartWrite(&next->response);
    if (finish) FinishStream();
  }

  void OnDone() override { delete this; }
  void OnCancel() override {}

 private:
  // One request of the stream, its answer, and the core's responder for it.
  class Call final : public CallResponder {
   public:
    Call(StreamReactor* stream, int64_t max_response_bytes)
        : stream_(stream), max_response_bytes_(max_response_bytes) {}

    absl::Status Computed(const CallRecord&) override {
      return CheckResponseSize(response, max_response_bytes_);
    }

    void Answer(const absl::Status& status, const CallRecord&,
                Admission::Ticket ticket) override {
      ticket_ = std::move(ticket);
      if (!status.ok()) {
        // Triton's stream reports errors in error_message; the response
        // still names its request, so a client can match it.
        response.set_error_message(absl::StrCat(
            absl::StatusCodeToString(status.code()), ": ", status.message()));
        inference::ModelInferResponse* infer = response.mutable_infer_response();
        infer->Clear();
        infer->set_model_name(request.model_name());
        infer->set_model_version(request.model_version());
        infer->set_id(request.id());
      }
      stream_->Send(this);
    }

    inference::ModelInferRequest request;
    inference::ModelStreamInferResponse response;

   private:
    StreamReactor* const stream_;
    const int64_t max_response_bytes_;
    Admission::Ticket ticket_;  // held until the answer is written
  };

  void ReadNext() {
    reading_ = std::make_unique<Call>(
        this, service_->calls_->limits().max_response_bytes);
    StartRead(&reading_->request);
  }

  // Queues an answered call's response; the first one in starts writing.
  // On a broken stream the answer is dropped.
  void Send(Call* call) {
    bool start = false, finish = false;
    std::unique_ptr<Call> dropped;
    {
      absl::MutexLock lock(&mu_);
      if (broken_) {
        dropped.reset(call);
        --pending_;
        finish = ShouldFinish();
      } else {
        queue_.push_back(call);
        start = !writing_;
        writing_ = true;
      }
    }
    dropped.reset();
    if (start) StartWrite(&call->response);
    if (finish) FinishStream();
  }

  bool ShouldFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!reads_done_ || pending_ > 0 || writing_ || finished_) return false;
    finished_ = true;
    return true;
  }

  void FinishStream() {
    Finish(Broken() ? grpc::Status(grpc::StatusCode::CANCELLED,
                                              "the stream broke")
                               : grpc::Status::OK);
  }
  bool Broken() {
    absl::MutexLock lock(&mu_);
    return broken_;
  }

  InferenceService* const service_;
  grpc::CallbackServerContext* const context_;
  std::unique_ptr<Call> reading_;  // only touched by the read reactions
  absl::Mutex mu_;
  std::deque<Call*> queue_ ABSL_GUARDED_BY(mu_);  // answered, to write; owned
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // read, not yet written or dropped
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerBidiReactor<inference::ModelInferRequest,
                        inference::ModelStreamInferResponse>*
InferenceService::ModelStreamInfer(grpc::CallbackServerContext* context) {
  return new StreamReactor(this, context);
}

}  // namespace attnserve
