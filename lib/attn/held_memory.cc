#include "attn/held_memory.h"

namespace attn {

const char* HeldMemoryEventName(HeldMemoryEvent::Kind kind) {
  switch (kind) {
    case HeldMemoryEvent::Kind::kPlaced:
      return "placed";
    case HeldMemoryEvent::Kind::kEvicted:
      return "evicted";
    case HeldMemoryEvent::Kind::kRefused:
      return "refused";
    case HeldMemoryEvent::Kind::kFreed:
      return "freed";
  }
  return "unknown";
}

std::shared_ptr<void> HeldMemory::Attachment(
    const void* owner, absl::FunctionRef<std::shared_ptr<void>()> make) const {
  absl::MutexLock lock(&mutex_);
  for (const auto& [attached_owner, attachment] : attachments_) {
    if (attached_owner == owner) return attachment;
  }
  std::shared_ptr<void> attachment = make();
  if (attachment != nullptr) attachments_.emplace_back(owner, attachment);
  return attachment;
}

}  // namespace attn
