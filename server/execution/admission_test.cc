// Admission: the bytes-in-flight bounds (server-wide and per peer), tickets
// held until released, and the drain.
#include "server/execution/admission.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace attnserve {
namespace {

Admission::Options Limits(int64_t total, int64_t per_peer) {
  Admission::Options options;
  options.max_inflight_bytes = total;
  options.max_inflight_bytes_per_peer = per_peer;
  return options;
}

TEST(AdmissionTest, ServerLimitRefusesAtOnceAndFreesOnRelease) {
  Admission admission(Limits(100, 100));
  absl::StatusOr<Admission::Ticket> a = admission.Admit("p1", 60);
  ASSERT_TRUE(a.ok());
  absl::StatusOr<Admission::Ticket> b = admission.Admit("p2", 40);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(admission.inflight_bytes(), 100);
  EXPECT_EQ(admission.inflight_calls(), 2);
  absl::StatusOr<Admission::Ticket> c = admission.Admit("p3", 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("--max_inflight_bytes"),
            std::string::npos)
      << c.status();
  { Admission::Ticket released = *std::move(a); }
  EXPECT_EQ(admission.inflight_bytes(), 40);
  EXPECT_TRUE(admission.Admit("p3", 60).ok());  // and released at once
  EXPECT_EQ(admission.inflight_bytes(), 40);
}

// One connection that holds its share cannot take the rest from the others.
TEST(AdmissionTest, PeerLimitLeavesRoomForOthers) {
  Admission admission(Limits(1000, 100));
  std::vector<Admission::Ticket> stalled;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<Admission::Ticket> t = admission.Admit("stalled", 25);
    ASSERT_TRUE(t.ok());
    stalled.push_back(*std::move(t));
  }
  absl::StatusOr<Admission::Ticket> more = admission.Admit("stalled", 25);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(more.status().message().find("per_connection"), std::string::npos)
      << more.status();
  EXPECT_TRUE(admission.Admit("polite", 90).ok());
}

// A call alone is admitted whatever its size: the message limits bound it,
// and refusing it would make it fail forever.
TEST(AdmissionTest, CallAloneIsAlwaysAdmitted) {
  Admission admission(Limits(100, 10));
  absl::StatusOr<Admission::Ticket> big = admission.Admit("p", 5000);
  ASSERT_TRUE(big.ok());
  // Not so when another call is in flight.
  EXPECT_FALSE(admission.Admit("q", 5000).ok());
}

TEST(AdmissionTest, DrainingRefusesWithUnavailableAndWaitsForTickets) {
  Admission admission(Limits(100, 100));
  EXPECT_TRUE(admission.CheckAccepting().ok());
  absl::StatusOr<Admission::Ticket> held = admission.Admit("p", 10);
  ASSERT_TRUE(held.ok());
  admission.StartDraining();
  EXPECT_TRUE(admission.draining());
  EXPECT_EQ(admission.CheckAccepting().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(admission.Admit("p", 1).status().code(),
            absl::StatusCode::kUnavailable);
  // Not idle while a ticket is held: the wait times out.
  EXPECT_FALSE(admission.WaitUntilIdle(absl::Now() + absl::Milliseconds(20)));
  std::thread releaser([ticket = *std::move(held)]() mutable {
    absl::SleepFor(absl::Milliseconds(20));
    Admission::Ticket gone = std::move(ticket);
  });
  EXPECT_TRUE(admission.WaitUntilIdle(absl::Now() + absl::Seconds(30)));
  releaser.join();
  EXPECT_EQ(admission.inflight_calls(), 0);
}

TEST(AdmissionTest, MovedTicketReleasesOnce) {
  Admission admission(Limits(100, 100));
  Admission::Ticket a = *admission.Admit("p", 30);
  Admission::Ticket b = std::move(a);
  Admission::Ticket c;
  c = std::move(b);
  EXPECT_EQ(admission.inflight_bytes(), 30);
  c = Admission::Ticket();
  EXPECT_EQ(admission.inflight_bytes(), 0);
  EXPECT_EQ(admission.inflight_calls(), 0);
}

TEST(AdmissionTest, LimitsMustBePositive) {
  EXPECT_FALSE(Admission::Check(Limits(0, 1)).ok());
  EXPECT_FALSE(Admission::Check(Limits(1, -1)).ok());
  EXPECT_TRUE(Admission::Check(Limits(1, 1)).ok());
}

}  // namespace
}  // namespace attnserve
