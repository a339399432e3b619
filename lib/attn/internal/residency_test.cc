// The held-memory bookkeeping over a fake device (host memory that counts
// what it holds): placement at first use, the budget, least-recently-used
// eviction, pins, refusals, and that a memory's copy is freed once its
// HeldMemory is gone and its last call has ended.
#include "attn/internal/residency.h"

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "attn/held_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace attn::internal {
namespace {

using ::testing::ElementsAre;

// Host memory posing as a device; counts the bytes it holds and can be told
// to run out.
class FakeArena : public DeviceArena {
 public:
  struct Counts {
    absl::Mutex mutex;
    int64_t bytes = 0;
    int64_t copies = 0;
    int64_t fail_above = -1;  // refuse an allocation beyond this total
    // Called before each copy, unlocked (a test blocks a copy in it).
    std::function<void(const void* host)> before_copy;
  };
  explicit FakeArena(std::shared_ptr<Counts> counts)
      : counts_(std::move(counts)) {}

  absl::StatusOr<void*> Allocate(int64_t bytes) override {
    absl::MutexLock lock(&counts_->mutex);
    if (counts_->fail_above >= 0 && counts_->bytes + bytes > counts_->fail_above) {
      return absl::ResourceExhaustedError("fake device full");
    }
    counts_->bytes += bytes;
    auto* block = new unsigned char[bytes + sizeof(int64_t)];
    std::memcpy(block, &bytes, sizeof(int64_t));
    return block + sizeof(int64_t);
  }
  void Free(void* device) override {
    auto* block = static_cast<unsigned char*>(device) - sizeof(int64_t);
    int64_t bytes;
    std::memcpy(&bytes, block, sizeof(int64_t));
    absl::MutexLock lock(&counts_->mutex);
    counts_->bytes -= bytes;
    delete[] block;
  }
  absl::Status CopyIn(void* device, const void* host, int64_t bytes) override {
    if (counts_->before_copy) counts_->before_copy(host);
    std::memcpy(device, host, bytes);
    absl::MutexLock lock(&counts_->mutex);
    ++counts_->copies;
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<Counts> counts_;
};

class ResidencyTest : public ::testing::Test {
 protected:
  void MakeSet(int64_t budget) {
    set_ = Residency::Create(std::make_unique<FakeArena>(counts_), budget,
                             [this](const HeldMemoryEvent& event) {
                               absl::MutexLock lock(&events_mutex_);
                               events_.push_back(
                                   std::string(HeldMemoryEventName(event.kind)) +
                                   " " + event.label);
                             });
  }
  int64_t DeviceBytes() {
    absl::MutexLock lock(&counts_->mutex);
    return counts_->bytes;
  }
  std::vector<std::string> Events() {
    absl::MutexLock lock(&events_mutex_);
    return events_;
  }
  // A memory of `floats` floats (keys and values halves) named `label`.
  std::shared_ptr<Residency::Entry> Memory(const std::string& label,
                                           std::vector<float>& host) {
    const int64_t half = static_cast<int64_t>(host.size() / 2);
    return set_->NewEntry(
        label, {{host.data(), half * 4}, {host.data() + half, half * 4}});
  }

  std::shared_ptr<FakeArena::Counts> counts_ =
      std::make_shared<FakeArena::Counts>();
  std::shared_ptr<Residency> set_;
  absl::Mutex events_mutex_;
  std::vector<std::string> events_;
};

TEST_F(ResidencyTest, PlacesAtFirstUseAndCopiesOnce) {
  MakeSet(1 << 20);
  std::vector<float> host(256);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) + 0.5f;
  auto entry = Memory("a", host);
  EXPECT_EQ(DeviceBytes(), 0);  // nothing before the first call
  for (int call = 0; call < 3; ++call) {
    absl::StatusOr<Residency::Pin> pin = set_->Acquire(entry);
    ASSERT_TRUE(pin.ok()) << pin.status();
    ASSERT_EQ(pin->device().size(), 2u);
    EXPECT_EQ(std::memcmp(pin->device()[0], host.data(), 512), 0);
    EXPECT_EQ(std::memcmp(pin->device()[1], host.data() + 128, 512), 0);
  }
  EXPECT_EQ(counts_->copies, 2);  // two spans, once
  EXPECT_EQ(DeviceBytes(), 1024);
  const HeldMemoryStats stats = set_->stats();
  EXPECT_EQ(stats.bytes_held, 1024);
  EXPECT_EQ(stats.memories_held, 1);
  EXPECT_EQ(stats.placements, 1);
  EXPECT_THAT(Events(), ElementsAre("placed a"));
}

TEST_F(ResidencyTest, APlacementInProgressHoldsUpOnlyCallsOnItsOwnMemory) {
  MakeSet(1 << 20);
  std::vector<float> a_host(256, 1.0f), b_host(256, 2.0f);
  auto a = Memory("a", a_host), b = Memory("b", b_host);
  ASSERT_TRUE(set_->Acquire(b).ok());  // b is placed
  absl::Notification copying, release;
  counts_->before_copy = [&](const void* host) {
    if (host != a_host.data()) return;
    copying.Notify();
    release.WaitForNotification();
  };
  std::thread placing([&] { EXPECT_TRUE(set_->Acquire(a).ok()); });
  copying.WaitForNotification();  // a's copy has begun, and is held there
  // A call on b goes on while a is copied in (it waited for a's copy when
  // that was made under the set's lock).
  absl::Notification b_done;
  std::thread b_call([&] {
    absl::StatusOr<Residency::Pin> b_pin = set_->Acquire(b);
    EXPECT_TRUE(b_pin.ok());
    if (b_pin.ok()) {
      EXPECT_EQ(std::memcmp(b_pin->device()[0], b_host.data(), 512), 0);
    }
    b_done.Notify();
  });
  EXPECT_TRUE(b_done.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "a call on a placed memory waited for another memory's copy";
  // a's room is taken from the start of its copy.
  if (b_done.HasBeenNotified()) {
    EXPECT_EQ(set_->stats().bytes_held, 2048);
  }
  // A second call on a waits for that copy and shares it.
  std::thread waiting([&] {
    absl::StatusOr<Residency::Pin> pin = set_->Acquire(a);
    ASSERT_TRUE(pin.ok());
    EXPECT_EQ(std::memcmp(pin->device()[0], a_host.data(), 512), 0);
  });
  release.Notify();
  placing.join();
  waiting.join();
  b_call.join();
  EXPECT_EQ(counts_->copies, 4);  // b's two spans, then a's two, once
  EXPECT_EQ(set_->stats().placements, 2);
  EXPECT_THAT(Events(), ElementsAre("placed b", "placed a"));
}

TEST_F(ResidencyTest, AGoneMemoryIsFreedWhenItsLastCallEnds) {
  MakeSet(1 << 20);
  std::vector<float> host(256, 1.0f);
  auto entry = Memory("a", host);
  absl::StatusOr<Residency::Pin> pin = set_->Acquire(entry);
  ASSERT_TRUE(pin.ok());
  entry.reset();  // the version is unloaded or replaced while a call runs
  EXPECT_EQ(DeviceBytes(), 1024) << "freed under a call still reading it";
  EXPECT_EQ(set_->stats().bytes_held, 1024);
  {
    Residency::Pin ending = std::move(*pin);
  }  // the last call ends
  EXPECT_EQ(DeviceBytes(), 0);
  EXPECT_EQ(set_->stats().bytes_held, 0);
  EXPECT_THAT(Events(), ElementsAre("placed a", "freed a"));
}

TEST_F(ResidencyTest, EvictsTheLeastRecentlyUsedFirst) {
  MakeSet(3000);  // room for two memories of 1 KiB, not three
  std::vector<float> a_host(256, 1.0f), b_host(256, 2.0f), c_host(256, 3.0f);
  auto a = Memory("a", a_host), b = Memory("b", b_host), c = Memory("c", c_host);
  ASSERT_TRUE(set_->Acquire(a).ok());
  ASSERT_TRUE(set_->Acquire(b).ok());
  ASSERT_TRUE(set_->Acquire(a).ok());  // b is now the least recently used
  ASSERT_TRUE(set_->Acquire(c).ok());
  EXPECT_THAT(Events(), ElementsAre("placed a", "placed b", "evicted b",
                                    "placed c"));
  EXPECT_EQ(DeviceBytes(), 2048);
  const HeldMemoryStats stats = set_->stats();
  EXPECT_EQ(stats.evictions, 1);
  EXPECT_EQ(stats.memories_held, 2);
  // b comes back at its next call, evicting a (older than c).
  absl::StatusOr<Residency::Pin> again = set_->Acquire(b);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(std::memcmp(again->device()[0], b_host.data(), 512), 0);
  EXPECT_EQ(Events().back(), "placed b");
  EXPECT_EQ(Events()[Events().size() - 2], "evicted a");
}

TEST_F(ResidencyTest, APinnedCopyIsNeverEvicted) {
  MakeSet(1500);  // one memory at a time
  std::vector<float> a_host(256, 1.0f), b_host(256, 2.0f);
  auto a = Memory("a", a_host), b = Memory("b", b_host);
  absl::StatusOr<Residency::Pin> reading_a = set_->Acquire(a);
  ASSERT_TRUE(reading_a.ok());
  absl::StatusOr<Residency::Pin> b_pin = set_->Acquire(b);
  EXPECT_EQ(b_pin.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(b_pin.status().message(), ::testing::HasSubstr("in use by calls"));
  EXPECT_EQ(std::memcmp(reading_a->device()[0], a_host.data(), 512), 0);
  // Once a's call ends, b may take its room.
  { Residency::Pin done = std::move(*reading_a); }
  ASSERT_TRUE(set_->Acquire(b).ok());
  EXPECT_THAT(Events(), ElementsAre("placed a", "refused b", "evicted a",
                                    "placed b"));
}

TEST_F(ResidencyTest, AMemoryBeyondTheBudgetIsRefusedAndSaidOnce) {
  MakeSet(1000);
  std::vector<float> host(512, 1.0f);  // 2 KiB
  auto big = Memory("big", host);
  for (int call = 0; call < 3; ++call) {
    absl::StatusOr<Residency::Pin> pin = set_->Acquire(big);
    EXPECT_EQ(pin.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(pin.status().message(),
                ::testing::HasSubstr("exceed the budget of 1000"));
  }
  EXPECT_EQ(set_->stats().refusals, 3);
  EXPECT_THAT(Events(), ElementsAre("refused big"));
  EXPECT_EQ(DeviceBytes(), 0);
}

TEST_F(ResidencyTest, ADeviceOutOfMemoryIsARefusalThatLeaksNothing) {
  MakeSet(1 << 20);
  counts_->fail_above = 700;  // the first span fits, the second does not
  std::vector<float> host(256, 1.0f);
  auto entry = Memory("a", host);
  absl::StatusOr<Residency::Pin> pin = set_->Acquire(entry);
  EXPECT_EQ(pin.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(pin.status().message(), ::testing::HasSubstr("fake device full"));
  EXPECT_EQ(DeviceBytes(), 0);
  EXPECT_EQ(set_->stats().bytes_held, 0);
  counts_->fail_above = -1;
  EXPECT_TRUE(set_->Acquire(entry).ok());
}

TEST_F(ResidencyTest, HeldMemoryKeepsOneAttachmentPerOwnerAndDropsItOnDestruction) {
  MakeSet(1 << 20);
  std::vector<float> host(256, 1.0f);
  int made = 0;
  auto held = std::make_unique<HeldMemory>("m");
  auto attach = [&] {
    return held->Attachment(set_.get(), [&]() -> std::shared_ptr<void> {
      ++made;
      return Memory(held->label(), host);
    });
  };
  std::shared_ptr<void> first = attach();
  std::shared_ptr<void> second = attach();
  EXPECT_EQ(first, second);
  EXPECT_EQ(made, 1);
  {
    absl::StatusOr<Residency::Pin> pin = set_->Acquire(
        std::static_pointer_cast<Residency::Entry>(first));
    ASSERT_TRUE(pin.ok());
  }
  first.reset();
  second.reset();
  EXPECT_EQ(DeviceBytes(), 1024);  // the HeldMemory still holds it
  held.reset();
  EXPECT_EQ(DeviceBytes(), 0);
  EXPECT_THAT(Events(), ElementsAre("placed m", "freed m"));
}

}  // namespace
}  // namespace attn::internal
