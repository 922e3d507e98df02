// CreditRing, the one definition of ring credits (the client's tx ring, the server's rx ring):
// lowest free slot first, release in any order, refusals of a release of a slot not held or out
// of range, assign resetting every credit, the all-free / any-free queries.
#include <gtest/gtest.h>

#include <optional>

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
