#include "server/execution/admission.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace attnserve {

Admission::Ticket::Ticket(Ticket&& other) noexcept
    : admission_(std::exchange(other.admission_, nullptr)),
      peer_(std::move(other.peer_)),
      bytes_(std::exchange(other.bytes_, 0)) {}

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    admission_ = std::exchange(other.admission_, nullptr);
    peer_ = std::move(other.peer_);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

Admission::Ticket::~Ticket() { Release(); }

void Admission::Ticket::Release() {
  if (admission_ == nullptr) return;
  std::exchange(admission_, nullptr)->Release(peer_, bytes_);
}

absl::Status Admission::Check(const Options& options) {
  if (options.max_inflight_bytes <= 0 ||
      options.max_inflight_bytes_per_peer <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_inflight_bytes (", options.max_inflight_bytes,
        ") and --max_inflight_bytes_per_connection (",
        options.max_inflight_bytes_per_peer, ") must be positive"));
  }
  return absl::OkStatus();
}

Admission::Admission(const Options& options) : options_(options) {}

absl::Status Admission::CheckAccepting() const {
  absl::MutexLock lock(&mu_);
  if (!draining_) return absl::OkStatus();
  return absl::UnavailableError(
      "attnserve is shutting down; this call was not started: send it to "
      "another replica");
}

absl::StatusOr<Admission::Ticket> Admission::Admit(const std::string& peer,
                                                   int64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (draining_) {
    return absl::UnavailableError(
        "attnserve is shutting down; this call was not started: send it to "
        "another replica");
  }
  PeerLoad& load = peers_[peer];
  // A call alone is always admitted (the message limits bound it); so is
  // a peer's first call, unless the server as a whole is full.
  const bool server_full =
      calls_ > 0 && bytes_ + bytes > options_.max_inflight_bytes;
  const bool peer_full = load.calls > 0 &&
                         load.bytes + bytes > options_.max_inflight_bytes_per_peer;
  if (server_full || peer_full) {
    if (load.calls == 0) peers_.erase(peer);
    return absl::ResourceExhaustedError(absl::StrCat(
        server_full ? "the server holds " : "this connection's calls hold ",
        server_full ? bytes_ : load.bytes, " bytes of requests and results "
        "not yet taken, and this call's ", bytes, " would pass the limit of ",
        server_full ? options_.max_inflight_bytes
                    : options_.max_inflight_bytes_per_peer,
        server_full ? " (--max_inflight_bytes)"
                    : " (--max_inflight_bytes_per_connection)",
        "; retry after a backoff, or read the responses already sent"));
  }
  ++calls_;
  bytes_ += bytes;
  ++load.calls;
  load.bytes += bytes;
  return Ticket(this, peer, bytes);
}

void Admission::Release(const std::string& peer, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  --calls_;
  bytes_ -= bytes;
  auto it = peers_.find(peer);
  if (it != peers_.end() && --it->second.calls == 0) {
    peers_.erase(it);
  } else if (it != peers_.end()) {
    it->second.bytes -= bytes;
  }
}

void Admission::StartDraining() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

bool Admission::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

bool Admission::WaitUntilIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(this, &Admission::Idle),
                               deadline);
}

int64_t Admission::inflight_calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

int64_t Admission::inflight_bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace attnserve
