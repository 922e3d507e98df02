// PushBatch (client/push_batch.hpp): push frames held until they announce kPushBatchBytes of
// chunks or fill half the tx ring, then written as one byte string in the order they were added.
#include <gtest/gtest.h>

#include <vector>

#include "client/push_batch.hpp"

using muon::client::PushBatch;

namespace {

std::vector<std::byte> frame(int tag, size_t bytes) {
  return std::vector<std::byte>(bytes, static_cast<std::byte>(tag));
}

}  // namespace

TEST(PushBatch, IsFullOnceItsFramesAnnounceTheByteLimit) {
  PushBatch batch(1 << 20, 100);
  EXPECT_TRUE(batch.empty());
  EXPECT_FALSE(batch.add(frame(1, 40), 256 << 10));
  EXPECT_FALSE(batch.add(frame(2, 40), 256 << 10));
  EXPECT_FALSE(batch.add(frame(3, 40), 256 << 10));
  EXPECT_TRUE(batch.add(frame(4, 40), 256 << 10));  // 1 MiB announced
  EXPECT_EQ(batch.size(), 4u);
}

TEST(PushBatch, IsFullAtTheFrameLimitWhateverTheBytes) {
  PushBatch batch(1 << 20, 2);
  EXPECT_FALSE(batch.add(frame(1, 40), 4096));
  EXPECT_TRUE(batch.add(frame(2, 40), 4096));
  // A batch of one frame (a connection that does not batch) is full at every frame.
  PushBatch single(1, 1);
  EXPECT_TRUE(single.add(frame(1, 40), 0));
}

TEST(PushBatch, HoldsTheFramesEndToEndInOrderAndStartsOverWhenCleared) {
  PushBatch batch(1 << 20, 8);
  batch.add(frame(1, 3), 10);
  batch.add(frame(2, 5), 10);
  std::vector<std::byte> want = frame(1, 3);
  const auto second = frame(2, 5);
  want.insert(want.end(), second.begin(), second.end());
  EXPECT_EQ(batch.bytes(), want);
  batch.clear();
  EXPECT_TRUE(batch.empty());
  EXPECT_TRUE(batch.bytes().empty());
  // The counts start over too: one more frame does not make a full batch of 8.
  EXPECT_FALSE(batch.add(frame(3, 7), 10));
  EXPECT_EQ(batch.bytes(), frame(3, 7));
}
