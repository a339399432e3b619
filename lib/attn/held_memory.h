// A stored memory's identity across calls: keys and values that many calls
// read unchanged (a server's stored attention memory), so that a device
// backend can keep its own copy of them between calls instead of copying
// them in with every call.
//
// Whoever owns the host tensors creates one beside them, names it in each
// AttentionRequest over them (AttentionRequest::held), and destroys it no
// later than the tensors. A backend attaches what it keeps (its device copy)
// the first time a call names the memory; destruction drops every
// attachment, and a copy that a call is still reading is freed when that
// call ends (the call holds its own reference).
//
// The host tensors must not change while the object lives: a backend may
// answer from a copy taken at the first call.
//
// Thread safety: Attachment may be called concurrently; the label is
// immutable.
#ifndef ATTN_HELD_MEMORY_H_
#define ATTN_HELD_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"

namespace attn {

// What a device backend holds of the memories it keeps (Engine::
// held_memory_stats): within a byte budget, least recently used first out.
struct HeldMemoryStats {
  int64_t budget_bytes = 0;
  int64_t bytes_held = 0;     // device copies now placed
  int64_t memories_held = 0;
  int64_t placements = 0;     // copies made, since start
  int64_t evictions = 0;      // copies dropped for room (not for an unload)
  int64_t refusals = 0;       // calls that ran elsewhere: no room
};

// One change to what a device holds, for a log line: a memory placed,
// evicted for room, refused (larger than the budget, or no room while the
// others are in use; said once per memory), or freed (its HeldMemory gone).
struct HeldMemoryEvent {
  enum class Kind { kPlaced, kEvicted, kRefused, kFreed };
  Kind kind;
  std::string label;
  int64_t bytes = 0;
  std::string reason;  // kRefused: why
};
const char* HeldMemoryEventName(HeldMemoryEvent::Kind kind);

class HeldMemory {
 public:
  // `label` names the memory in a backend's log and errors (a server passes
  // the model's name).
  explicit HeldMemory(std::string label) : label_(std::move(label)) {}
  HeldMemory(const HeldMemory&) = delete;
  HeldMemory& operator=(const HeldMemory&) = delete;

  const std::string& label() const { return label_; }

  // For backends: what `owner` attached, or else what `make` returns,
  // attached now (a null result attaches nothing, so a later call asks
  // again). `make` runs at most once per owner at a time, under this
  // object's lock: keep it short.
  std::shared_ptr<void> Attachment(
      const void* owner, absl::FunctionRef<std::shared_ptr<void>()> make) const;

 private:
  const std::string label_;
  mutable absl::Mutex mutex_;
  mutable std::vector<std::pair<const void*, std::shared_ptr<void>>>
      attachments_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace attn

#endif  // ATTN_HELD_MEMORY_H_
