// Admission of kernel calls: the server's bound on the memory its calls hold,
// and its drain.
//
// A call is admitted once its request has been decoded and its result's size
// is known, and holds a Ticket until gRPC is done with it (its response sent
// or the call cancelled: the reactor's OnDone), not merely until it is
// computed: a response the client does not read stays in the server's memory
// and stays charged. The charge is the call's payload bytes, request and
// result (4 bytes per float32 element); the server's memory for a call is at
// most about twice that (decode copies, the result before it is encoded).
//
// Refusals are immediate and say what to do:
//  - RESOURCE_EXHAUSTED when the bytes in flight would pass
//    `max_inflight_bytes`, or the caller's connection's share of it
//    (`max_inflight_bytes_per_peer`: one client that never reads its
//    responses cannot take the whole budget from the others). A call alone
//    is always admitted, however large: the message size limits bound it.
//  - UNAVAILABLE once draining: the call was not started, and is safe to
//    send elsewhere.
//
// Thread-safe. The Admission must outlive every Ticket.
#ifndef ATTNSERVE_SERVER_EXECUTION_ADMISSION_H_
#define ATTNSERVE_SERVER_EXECUTION_ADMISSION_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace attnserve {

class Admission {
 public:
  struct Options {
    // Payload bytes of all admitted calls together.
    int64_t max_inflight_bytes = int64_t{1} << 30;
    // Payload bytes of the admitted calls of one peer (one connection).
    int64_t max_inflight_bytes_per_peer = int64_t{512} << 20;
  };

  // Released (the bytes returned, the call no longer in flight) when
  // destroyed. Movable; a moved-from or default Ticket holds nothing.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept;
    Ticket& operator=(Ticket&& other) noexcept;
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    ~Ticket();

   private:
    friend class Admission;
    Ticket(Admission* admission, std::string peer, int64_t bytes)
        : admission_(admission), peer_(std::move(peer)), bytes_(bytes) {}
    void Release();

    Admission* admission_ = nullptr;
    std::string peer_;
    int64_t bytes_ = 0;
  };

  // INVALID_ARGUMENT unless both limits are positive.
  static absl::Status Check(const Options& options);
  explicit Admission(const Options& options);

  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // UNAVAILABLE while draining, without looking at the request: cheap, so
  // that a draining server refuses before decoding.
  absl::Status CheckAccepting() const;
  // Admits a call of `bytes` payload bytes from `peer` (any key naming the
  // caller's connection, e.g. grpc::ServerContext::peer()).
  absl::StatusOr<Ticket> Admit(const std::string& peer, int64_t bytes);

  // From now on every call is refused with UNAVAILABLE. Idempotent.
  void StartDraining();
  bool draining() const;
  // Blocks until no ticket is held or `deadline` passes; true when none is.
  bool WaitUntilIdle(absl::Time deadline);

  int64_t inflight_calls() const;
  int64_t inflight_bytes() const;

 private:
  void Release(const std::string& peer, int64_t bytes);
  bool Idle() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ == 0; }

  const Options options_;
  mutable absl::Mutex mu_;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Calls and bytes in flight per peer; a peer's entry goes when its last
  // call does.
  struct PeerLoad {
    int64_t calls = 0;
    int64_t bytes = 0;
  };
  absl::flat_hash_map<std::string, PeerLoad> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace attnserve

#endif  // ATTNSERVE_SERVER_EXECUTION_ADMISSION_H_
