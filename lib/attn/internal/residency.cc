#include "attn/internal/residency.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace attn::internal {

// The fields are the set's, guarded by its mutex (an Entry has no lock of
// its own: every change to it changes the set's totals too).
class Residency::Entry {
 public:
  Entry(std::shared_ptr<Residency> set, std::string label,
        std::vector<HostSpan> spans)
      : set(std::move(set)), label(std::move(label)), spans(std::move(spans)) {
    for (const HostSpan& span : this->spans) bytes += span.bytes;
  }
  ~Entry() { set->Forget(this); }

  const std::shared_ptr<Residency> set;
  const std::string label;
  const std::vector<HostSpan> spans;
  int64_t bytes = 0;
  std::vector<void*> device;  // empty: not placed
  int pins = 0;
  int64_t last_use = 0;
  bool refusal_said = false;
  bool placing = false;  // a call is copying it in, unlocked
};

std::shared_ptr<Residency> Residency::Create(std::unique_ptr<DeviceArena> arena,
                                             int64_t budget_bytes,
                                             EventSink on_event) {
  return std::shared_ptr<Residency>(
      new Residency(std::move(arena), budget_bytes, std::move(on_event)));
}

Residency::Residency(std::unique_ptr<DeviceArena> arena, int64_t budget_bytes,
                     EventSink on_event)
    : arena_(std::move(arena)),
      budget_bytes_(budget_bytes),
      on_event_(std::move(on_event)) {}

// Entries hold the set, so none is left when it goes.
Residency::~Residency() = default;

Residency::Pin::~Pin() {
  if (entry_ != nullptr) entry_->set->Unpin(entry_.get());
}

std::shared_ptr<Residency::Entry> Residency::NewEntry(
    std::string label, std::vector<HostSpan> spans) {
  return std::make_shared<Entry>(shared_from_this(), std::move(label),
                                 std::move(spans));
}

absl::StatusOr<Residency::Pin> Residency::Acquire(
    const std::shared_ptr<Entry>& entry) {
  std::vector<HeldMemoryEvent> events;
  std::vector<void*> to_free;
  absl::Status refused;
  std::vector<void*> device;
  bool place = false;  // this call copies the memory in
  {
    absl::MutexLock lock(&mutex_);
    // Another call is copying it in: that copy serves this call too.
    mutex_.Await(absl::Condition(
        +[](Entry* placing) { return !placing->placing; }, entry.get()));
    entry->last_use = ++tick_;
    if (entry->device.empty()) {
      if (entry->bytes > budget_bytes_) {
        refused = Refuse(entry.get(),
                         absl::StrCat(entry->bytes, " bytes exceed the budget of ",
                                      budget_bytes_),
                         &events);
      } else {
        // Evict the least recently used unpinned copies until it fits.
        while (bytes_held_ + entry->bytes > budget_bytes_) {
          Entry* oldest = nullptr;
          for (Entry* placed : placed_) {
            if (placed->pins == 0 &&
                (oldest == nullptr || placed->last_use < oldest->last_use)) {
              oldest = placed;
            }
          }
          if (oldest == nullptr) break;
          events.push_back({HeldMemoryEvent::Kind::kEvicted, oldest->label,
                            oldest->bytes, ""});
          ++evictions_;
          DropCopy(oldest, &to_free);
        }
        if (bytes_held_ + entry->bytes > budget_bytes_) {
          refused = Refuse(entry.get(),
                           absl::StrCat("no room: ", bytes_held_,
                                        " bytes of the budget of ",
                                        budget_bytes_, " are in use by calls"),
                           &events);
        } else {
          // Its room is taken now; the copy is made below, unlocked.
          bytes_held_ += entry->bytes;
          entry->placing = true;
          place = true;
        }
      }
    }
    if (refused.ok() && !place) {
      ++entry->pins;
      device = entry->device;
    }
  }
  for (void* block : to_free) arena_->Free(block);
  if (place) {
    // Allocated and copied without the set's lock: calls on the memories
    // already placed go on meanwhile (a copy of 512 MiB takes ~100 ms).
    std::vector<void*> placed;
    absl::Status status;
    for (const HostSpan& span : entry->spans) {
      absl::StatusOr<void*> block = arena_->Allocate(span.bytes);
      if (!block.ok()) {
        status = block.status();
        break;
      }
      placed.push_back(*block);
      status = arena_->CopyIn(*block, span.data, span.bytes);
      if (!status.ok()) break;
    }
    if (!status.ok()) {
      for (void* block : placed) arena_->Free(block);
    }
    absl::MutexLock lock(&mutex_);
    entry->placing = false;
    if (!status.ok()) {
      bytes_held_ -= entry->bytes;
      refused = Refuse(entry.get(),
                       absl::StrCat("the device refused: ", status.message()),
                       &events);
    } else {
      entry->device = std::move(placed);
      placed_.push_back(entry.get());
      ++placements_;
      entry->refusal_said = false;
      events.push_back(
          {HeldMemoryEvent::Kind::kPlaced, entry->label, entry->bytes, ""});
      ++entry->pins;
      device = entry->device;
    }
  }
  Emit(events);
  if (!refused.ok()) return refused;
  std::vector<const void*> host;
  for (const HostSpan& span : entry->spans) host.push_back(span.data);
  return Pin(entry, std::move(device), std::move(host));
}

absl::Status Residency::Refuse(Entry* entry, std::string why,
                               std::vector<HeldMemoryEvent>* events) {
  ++refusals_;
  if (!entry->refusal_said) {
    entry->refusal_said = true;
    events->push_back(
        {HeldMemoryEvent::Kind::kRefused, entry->label, entry->bytes, why});
  }
  return absl::UnavailableError(absl::StrCat(
      "held memory '", entry->label, "' is not on the device: ", why));
}

void Residency::Unpin(Entry* entry) {
  absl::MutexLock lock(&mutex_);
  --entry->pins;
}

void Residency::Forget(Entry* entry) {
  std::vector<void*> to_free;
  std::vector<HeldMemoryEvent> events;
  {
    absl::MutexLock lock(&mutex_);
    if (!entry->device.empty()) {
      events.push_back({HeldMemoryEvent::Kind::kFreed, entry->label,
                        entry->bytes, ""});
      DropCopy(entry, &to_free);
    }
  }
  for (void* block : to_free) arena_->Free(block);
  Emit(events);
}

void Residency::DropCopy(Entry* entry, std::vector<void*>* to_free) {
  to_free->insert(to_free->end(), entry->device.begin(), entry->device.end());
  entry->device.clear();
  bytes_held_ -= entry->bytes;
  placed_.erase(std::find(placed_.begin(), placed_.end(), entry));
}

void Residency::Emit(const std::vector<HeldMemoryEvent>& events) const {
  if (!on_event_) return;
  for (const HeldMemoryEvent& event : events) on_event_(event);
}

HeldMemoryStats Residency::stats() const {
  absl::MutexLock lock(&mutex_);
  HeldMemoryStats stats;
  stats.budget_bytes = budget_bytes_;
  stats.bytes_held = bytes_held_;
  stats.memories_held = static_cast<int64_t>(placed_.size());
  stats.placements = placements_;
  stats.evictions = evictions_;
  stats.refusals = refusals_;
  return stats;
}

}  // namespace attn::internal
