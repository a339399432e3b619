// Device copies of held memories (attn/held_memory.h) within a byte budget:
// the bookkeeping a device backend shares, behind an arena interface that
// the CUDA backend implements with cudaMalloc and a test with host memory.
//
// - A memory is placed (allocated and copied in) at the first call that
//   needs it, and stays until it is evicted or its HeldMemory is gone.
// - A call pins the copy it reads (Pin); a pinned copy is never evicted,
//   and a copy whose memory is gone is freed when its last pin goes.
// - When a placement would pass the budget, the least recently used
//   unpinned copies are evicted first. A memory larger than the budget, or
//   one with no room while the others are pinned, is refused: the call runs
//   on another backend, and the refusal is counted (and said once).
//
// Thread safety: every method may be called concurrently. A placement takes
// its room under the set's lock and copies without it, so calls on memories
// already placed go on meanwhile; other calls on the memory being placed
// wait for that copy. A warm acquisition is a few lookups under the lock.
#ifndef ATTN_INTERNAL_RESIDENCY_H_
#define ATTN_INTERNAL_RESIDENCY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "attn/held_memory.h"

namespace attn::internal {

// Where a device keeps memories.
class DeviceArena {
 public:
  virtual ~DeviceArena() = default;
  // RESOURCE_EXHAUSTED when the device has no room.
  virtual absl::StatusOr<void*> Allocate(int64_t bytes) = 0;
  virtual void Free(void* device) = 0;
  // Host -> device; blocks until the copy is done.
  virtual absl::Status CopyIn(void* device, const void* host,
                              int64_t bytes) = 0;
};

// One host tensor of a memory.
struct HostSpan {
  const void* data;
  int64_t bytes;
};

class Residency : public std::enable_shared_from_this<Residency> {
 public:
  using EventSink = std::function<void(const HeldMemoryEvent&)>;

  // `on_event` may be empty; it is called without the set's lock held.
  static std::shared_ptr<Residency> Create(std::unique_ptr<DeviceArena> arena,
                                           int64_t budget_bytes,
                                           EventSink on_event);
  ~Residency();

  // One memory's record, attached to its HeldMemory.
  class Entry;

  // A call's use of a memory's device copy; the addresses stay valid while
  // the Pin lives. Move-only.
  class Pin {
   public:
    Pin(Pin&&) noexcept = default;
    Pin& operator=(Pin&&) = delete;
    ~Pin();
    // The device address of each of the memory's spans, in order.
    const std::vector<void*>& device() const { return device_; }
    // The host address each copy was taken from.
    const std::vector<const void*>& host() const { return host_; }

   private:
    friend class Residency;
    Pin(std::shared_ptr<Entry> entry, std::vector<void*> device,
        std::vector<const void*> host)
        : entry_(std::move(entry)),
          device_(std::move(device)),
          host_(std::move(host)) {}
    std::shared_ptr<Entry> entry_;
    std::vector<void*> device_;
    std::vector<const void*> host_;
  };

  std::shared_ptr<Entry> NewEntry(std::string label,
                                  std::vector<HostSpan> spans);
  // The device copy of `entry` for one call, placed now when it is not.
  // UNAVAILABLE (the entry stays unplaced) when it does not fit, with why.
  // stats().bytes_held counts a copy from the moment its room is taken.
  absl::StatusOr<Pin> Acquire(const std::shared_ptr<Entry>& entry);

  HeldMemoryStats stats() const;

 private:
  // What the set knows of one memory beside its entry's fixed fields.
  struct Slot {
    std::vector<void*> device;  // empty: not placed
    int pins = 0;
    int64_t last_use = 0;
    bool refusal_said = false;
    bool placing = false;  // a call is copying it in, unlocked
  };

  Residency(std::unique_ptr<DeviceArena> arena, int64_t budget_bytes,
            EventSink on_event);

  // Counts a refusal of `entry`, says it once, and returns the status.
  absl::Status Refuse(const Entry& entry, Slot& slot, std::string why,
                      std::vector<HeldMemoryEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Unpin(const Entry* entry);
  // The entry is gone (its HeldMemory and every pin): frees its copy.
  void Forget(const Entry* entry);
  // Drops `entry`'s copy (locked); the caller frees `*to_free` unlocked.
  void DropCopy(const Entry& entry, Slot& slot, std::vector<void*>* to_free)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  void Emit(const std::vector<HeldMemoryEvent>& events) const;

  const std::unique_ptr<DeviceArena> arena_;
  const int64_t budget_bytes_;
  const EventSink on_event_;
  mutable absl::Mutex mutex_;
  // Signalled when a placement ends, for the calls waiting on it.
  absl::CondVar placement_ended_;
  absl::flat_hash_map<const Entry*, Slot> slots_ ABSL_GUARDED_BY(mutex_);
  int64_t bytes_held_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t tick_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t placements_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t evictions_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t refusals_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace attn::internal

#endif  // ATTN_INTERNAL_RESIDENCY_H_
