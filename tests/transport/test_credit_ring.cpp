// CreditRing, the one definition of ring credits (the client's tx ring, the server's rx ring):
// lowest free slot first, release in any order, refusals of a release of a slot not held or out
// of range, assign resetting every credit, the all-free / any-free queries.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "transport/credit_ring.hpp"

using muon::transport::CreditRing;

TEST(CreditRing, EmptyUntilAssigned) {
  CreditRing r;
  EXPECT_EQ(r.size(), 0u);
  EXPECT_FALSE(r.any_free());
  EXPECT_TRUE(r.all_free());
  EXPECT_EQ(r.acquire(), std::nullopt);
  EXPECT_FALSE(r.release(0));
}

TEST(CreditRing, AcquiresLowestFirstUntilEmpty) {
  CreditRing r(4);
  EXPECT_EQ(r.size(), 4u);
  EXPECT_TRUE(r.all_free());
  for (uint32_t want = 0; want < 4; ++want) {
    EXPECT_TRUE(r.any_free());
    EXPECT_EQ(r.acquire(), std::optional<uint32_t>(want));
    EXPECT_TRUE(r.held(want));
    EXPECT_FALSE(r.all_free());
  }
  EXPECT_FALSE(r.any_free());
  EXPECT_EQ(r.acquire(), std::nullopt);
  EXPECT_EQ(r.size(), 4u);
}

TEST(CreditRing, ReleaseOutOfOrderThenLowestFreeIsTakenFirst) {
  CreditRing r(4);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(r.acquire().has_value());
  EXPECT_TRUE(r.release(2));
  EXPECT_TRUE(r.release(0));
  EXPECT_FALSE(r.held(0));
  EXPECT_FALSE(r.held(2));
  EXPECT_TRUE(r.held(1));
  EXPECT_TRUE(r.held(3));
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(0));  // 0 before 2, whatever the release order
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(2));
  EXPECT_EQ(r.acquire(), std::nullopt);
  EXPECT_TRUE(r.release(3));
  EXPECT_TRUE(r.release(1));
  EXPECT_TRUE(r.release(2));
  EXPECT_TRUE(r.release(0));
  EXPECT_TRUE(r.all_free());
}

TEST(CreditRing, DoubleReleaseIsRefusedAndChangesNothing) {
  CreditRing r(3);
  ASSERT_EQ(r.acquire(), std::optional<uint32_t>(0));
  ASSERT_EQ(r.acquire(), std::optional<uint32_t>(1));
  EXPECT_TRUE(r.release(1));
  EXPECT_FALSE(r.release(1));
  EXPECT_FALSE(r.release(2));  // in range, never taken
  EXPECT_TRUE(r.held(0));
  EXPECT_FALSE(r.held(1));
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(1));
}

TEST(CreditRing, OutOfRangeReleaseIsRefused) {
  CreditRing r(2);
  ASSERT_TRUE(r.acquire().has_value());
  ASSERT_TRUE(r.acquire().has_value());
  EXPECT_FALSE(r.release(2));
  EXPECT_FALSE(r.release(UINT32_MAX));
  EXPECT_FALSE(r.held(2));
  EXPECT_FALSE(r.any_free());  // both still held
}

TEST(CreditRing, AssignResizesAndFreesEverySlot) {
  CreditRing r(2);
  ASSERT_TRUE(r.acquire().has_value());
  ASSERT_TRUE(r.acquire().has_value());
  r.assign(5);  // a new hello: the old credits are forgotten
  EXPECT_EQ(r.size(), 5u);
  EXPECT_TRUE(r.all_free());
  EXPECT_FALSE(r.held(0));
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(0));
  r.assign(1);
  EXPECT_EQ(r.size(), 1u);
  EXPECT_TRUE(r.all_free());
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(0));
  EXPECT_EQ(r.acquire(), std::nullopt);
  EXPECT_FALSE(r.release(3));
  r.assign(0);
  EXPECT_EQ(r.size(), 0u);
  EXPECT_FALSE(r.any_free());
  EXPECT_TRUE(r.all_free());
}

// ---- segment mode: a shm session's tx credits in its segment (transport/shm_credits.hpp) --------

namespace {

using muon::transport::ShmCreditWords;

// A credit block in (zeroed) process memory, as the server's fresh tmpfs pages are.
struct Block {
  explicit Block(uint32_t slots) : bytes(ShmCreditWords::bytes(slots) / 8, 0), slots(slots) {}
  ShmCreditWords words() {
    return ShmCreditWords(reinterpret_cast<std::byte*>(bytes.data()), slots);
  }
  std::vector<uint64_t> bytes;  // 8-byte aligned storage
  uint32_t slots;
};

}  // namespace

TEST(CreditRing, InSegmentASlotIsFreeOnceTheServerReleasedEveryChunkAnnouncedInIt) {
  Block block(2);
  auto server = block.words();
  CreditRing r(2);
  r.use_segment(block.words());
  EXPECT_TRUE(r.in_segment());
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(0));
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(1));
  EXPECT_EQ(r.acquire(), std::nullopt);
  EXPECT_FALSE(r.any_free());
  // A frame cannot release a slot here: a stale push_ack must not free a slot in use again.
  EXPECT_FALSE(r.release(1));
  EXPECT_TRUE(r.held(1));
  EXPECT_FALSE(server.release(1));  // nobody asked to be woken
  EXPECT_TRUE(r.any_free());
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(1));  // its second chunk
  EXPECT_FALSE(server.release(0));
  EXPECT_EQ(r.acquire(), std::optional<uint32_t>(0));
  EXPECT_FALSE(r.all_free());
  // Slot 1 holds its second chunk: one release (of the first) long ago is not enough.
  EXPECT_EQ(server.released(1), 1u);
  EXPECT_FALSE(r.any_free());
  server.release(0);
  server.release(1);
  EXPECT_TRUE(r.all_free());
}

TEST(CreditRing, InSegmentACreditGivenBackUnannouncedIsNotWaitedFor) {
  Block block(1);
  auto server = block.words();
  CreditRing r(1);
  r.use_segment(block.words());
  ASSERT_EQ(r.acquire(), std::optional<uint32_t>(0));
  EXPECT_TRUE(r.give_back(0));  // the copy into the slot failed: nothing announced
  EXPECT_FALSE(r.give_back(0));
  ASSERT_EQ(r.acquire(), std::optional<uint32_t>(0));
  EXPECT_FALSE(r.any_free());
  server.release(0);  // the one chunk that was announced
  EXPECT_TRUE(r.all_free());
}

TEST(CreditRing, InSegmentAskingForAWakeMakesTheNextReleaseSayWake) {
  Block block(1);
  auto server = block.words();
  CreditRing r(1);
  r.use_segment(block.words());
  ASSERT_TRUE(r.acquire().has_value());
  EXPECT_FALSE(r.any_free(CreditRing::IfNot::stay_quiet));
  EXPECT_FALSE(server.release(0)) << "nobody asked";
  ASSERT_TRUE(r.acquire().has_value());
  EXPECT_FALSE(r.any_free(CreditRing::IfNot::ask_wake));
  EXPECT_TRUE(server.release(0)) << "the pusher sleeps and asked to be woken";
  ASSERT_TRUE(r.acquire().has_value());
  EXPECT_FALSE(server.release(0)) << "one wake per request";
  // A query that finds a free slot asks for nothing.
  EXPECT_TRUE(r.any_free(CreditRing::IfNot::ask_wake));
  ASSERT_TRUE(r.acquire().has_value());
  EXPECT_FALSE(server.release(0));
}

TEST(CreditRing, AssignGoesBackToFramesMode) {
  Block block(2);
  CreditRing r(2);
  r.use_segment(block.words());
  r.assign(2);
  EXPECT_FALSE(r.in_segment());
  ASSERT_EQ(r.acquire(), std::optional<uint32_t>(0));
  EXPECT_TRUE(r.release(0));
}

// No lost wake-up between two threads: a pusher takes a slot of a one-slot ring, sleeps on a
// condition variable when the ring says none is free (after asking for a wake), and is woken only
// when the server side's release says so. 20000 hand-offs; a lost wake-up hangs (the test's
// timeout fails it).
TEST(CreditRing, InSegmentEveryReleaseThatFindsASleeperWakesIt) {
  Block block(1);
  auto server = block.words();
  std::mutex mu;
  std::condition_variable cv;
  uint64_t wakes = 0;
  CreditRing r(1);
  r.use_segment(block.words());
  constexpr int kChunks = 20000;
  std::atomic<int> announced{0};
  std::thread reader([&] {
    for (int done = 0; done < kChunks; ++done) {
      while (announced.load() <= done) std::this_thread::yield();
      if (server.release(0)) {  // the wake frame
        std::lock_guard lk(mu);
        ++wakes;
        cv.notify_all();
      }
    }
  });
  uint64_t slept = 0;
  for (int i = 0; i < kChunks; ++i) {
    std::unique_lock lk(mu);
    if (!r.any_free()) {
      ++slept;
      cv.wait(lk, [&] { return r.any_free(CreditRing::IfNot::ask_wake); });
    }
    ASSERT_TRUE(r.acquire().has_value());
    announced.fetch_add(1);
  }
  reader.join();
  std::unique_lock lk(mu);
  EXPECT_TRUE(r.all_free(CreditRing::IfNot::ask_wake) || server.released(0) == kChunks);
  EXPECT_LE(wakes, slept);
}
