#include "attn/internal/residency.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace attn::internal {

// A memory's fixed fields; what changes is the set's Slot, under its lock.
class Residency::Entry {
 public:
  Entry(std::shared_ptr<Residency> set, std::string label,
        std::vector<HostSpan> spans)
      : set(std::move(set)),
        label(std::move(label)),
        spans(std::move(spans)),
        bytes(TotalBytes(this->spans)) {}
  ~Entry() { set->Forget(this); }

  const std::shared_ptr<Residency> set;
  const std::string label;
  const std::vector<HostSpan> spans;
  const int64_t bytes;

 private:
  static int64_t TotalBytes(const std::vector<HostSpan>& spans) {
    int64_t total = 0;
    for (const HostSpan& span : spans) total += span.bytes;
    return total;
  }
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
  auto entry = std::make_shared<Entry>(shared_from_this(), std::move(label),
                                       std::move(spans));
  absl::MutexLock lock(&mutex_);
  slots_[entry.get()];
  return entry;
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
    while (slots_[entry.get()].placing) placement_ended_.Wait(&mutex_);
    Slot& slot = slots_[entry.get()];
    slot.last_use = ++tick_;
    if (slot.device.empty()) {
      if (entry->bytes > budget_bytes_) {
        refused = Refuse(*entry, slot,
                         absl::StrCat(entry->bytes, " bytes exceed the budget of ",
                                      budget_bytes_),
                         &events);
      } else {
        // Evict the least recently used unpinned copies until it fits.
        while (bytes_held_ + entry->bytes > budget_bytes_) {
          const Entry* oldest = nullptr;
          Slot* oldest_slot = nullptr;
          for (auto& [other, other_slot] : slots_) {
            if (!other_slot.device.empty() && other_slot.pins == 0 &&
                (oldest == nullptr ||
                 other_slot.last_use < oldest_slot->last_use)) {
              oldest = other;
              oldest_slot = &other_slot;
            }
          }
          if (oldest == nullptr) break;
          events.push_back({HeldMemoryEvent::Kind::kEvicted, oldest->label,
                            oldest->bytes, ""});
          ++evictions_;
          DropCopy(*oldest, *oldest_slot, &to_free);
        }
        if (bytes_held_ + entry->bytes > budget_bytes_) {
          refused = Refuse(*entry, slot,
                           absl::StrCat("no room: ", bytes_held_,
                                        " bytes of the budget of ",
                                        budget_bytes_, " are in use by calls"),
                           &events);
        } else {
          // Its room is taken now; the copy is made below, unlocked.
          bytes_held_ += entry->bytes;
          slot.placing = true;
          place = true;
        }
      }
    }
    if (refused.ok() && !place) {
      ++slot.pins;
      device = slot.device;
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
    Slot& slot = slots_[entry.get()];
    slot.placing = false;
    placement_ended_.SignalAll();
    if (!status.ok()) {
      bytes_held_ -= entry->bytes;
      refused = Refuse(*entry, slot,
                       absl::StrCat("the device refused: ", status.message()),
                       &events);
    } else {
      slot.device = std::move(placed);
      ++placements_;
      slot.refusal_said = false;
      events.push_back(
          {HeldMemoryEvent::Kind::kPlaced, entry->label, entry->bytes, ""});
      ++slot.pins;
      device = slot.device;
    }
  }
  Emit(events);
  if (!refused.ok()) return refused;
  std::vector<const void*> host;
  for (const HostSpan& span : entry->spans) host.push_back(span.data);
  return Pin(entry, std::move(device), std::move(host));
}

absl::Status Residency::Refuse(const Entry& entry, Slot& slot, std::string why,
                               std::vector<HeldMemoryEvent>* events) {
  ++refusals_;
  if (!slot.refusal_said) {
    slot.refusal_said = true;
    events->push_back(
        {HeldMemoryEvent::Kind::kRefused, entry.label, entry.bytes, why});
  }
  return absl::UnavailableError(absl::StrCat(
      "held memory '", entry.label, "' is not on the device: ", why));
}

void Residency::Unpin(const Entry* entry) {
  absl::MutexLock lock(&mutex_);
  --slots_[entry].pins;
}

void Residency::Forget(const Entry* entry) {
  std::vector<void*> to_free;
  std::vector<HeldMemoryEvent> events;
  {
    absl::MutexLock lock(&mutex_);
    auto slot = slots_.find(entry);
    if (slot != slots_.end() && !slot->second.device.empty()) {
      events.push_back({HeldMemoryEvent::Kind::kFreed, entry->label,
                        entry->bytes, ""});
      DropCopy(*entry, slot->second, &to_free);
    }
    if (slot != slots_.end()) slots_.erase(slot);
  }
  for (void* block : to_free) arena_->Free(block);
  Emit(events);
}

void Residency::DropCopy(const Entry& entry, Slot& slot,
                         std::vector<void*>* to_free) {
  to_free->insert(to_free->end(), slot.device.begin(), slot.device.end());
  slot.device.clear();
  bytes_held_ -= entry.bytes;
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
  for (const auto& [entry, slot] : slots_) {
    if (!slot.device.empty()) ++stats.memories_held;
  }
  stats.placements = placements_;
  stats.evictions = evictions_;
  stats.refusals = refusals_;
  return stats;
}

}  // namespace attn::internal
