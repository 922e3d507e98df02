// CompletionQueue (daemon/completion_queue.hpp): the io thread's waits for device copies. Here
// each wait's `ready` is a flag the test sets, standing where cudaEventQuery stands on a GPU;
// the continuations are the Engine's (a read-back's chunks going out, a snapshot's set).
#include "daemon/completion_queue.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace muon::daemon {
namespace {

TEST(CompletionQueue, AddingAWaitRunsNothingEvenWhenItIsAlreadyOver) {
  int arms = 0;
  CompletionQueue q([&] { ++arms; });
  bool ran = false;
  q.when([] { return true; }, [&](std::exception_ptr) { ran = true; });
  EXPECT_FALSE(ran);  // a caller may finish its own work first (e.g. record `released`)
  EXPECT_EQ(q.pending(), 1u);
  EXPECT_EQ(arms, 1);
  EXPECT_FALSE(q.poll());
  EXPECT_TRUE(ran);
  EXPECT_EQ(q.pending(), 0u);
}

TEST(CompletionQueue, ContinuationsRunInOrderAndNoneOvertakesAWaitNotOver) {
  CompletionQueue q;
  std::vector<bool> done(3, false);
  std::vector<int> order;
  for (int i = 0; i < 3; ++i) {
    q.when([&done, i] { return static_cast<bool>(done[i]); },
           [&order, i](std::exception_ptr e) {
             EXPECT_EQ(e, nullptr);
             order.push_back(i);
           });
  }
  done[0] = true;
  done[2] = true;  // over, but behind one that is not
  EXPECT_TRUE(q.poll());
  EXPECT_EQ(order, std::vector<int>({0}));
  EXPECT_TRUE(q.poll());
  EXPECT_EQ(order, std::vector<int>({0}));
  done[1] = true;
  EXPECT_FALSE(q.poll());
  EXPECT_EQ(order, std::vector<int>({0, 1, 2}));
}

TEST(CompletionQueue, AFailedWaitHandsItsErrorToItsContinuationAndTheRestGoOn) {
  CompletionQueue q;
  std::string error;
  bool later = false;
  q.when([]() -> bool { throw std::runtime_error("an illegal address was encountered"); },
         [&](std::exception_ptr e) {
           ASSERT_NE(e, nullptr);
           try {
             std::rethrow_exception(e);
           } catch (const std::runtime_error& x) {
             error = x.what();
           }
         });
  q.when([] { return true; }, [&](std::exception_ptr e) { later = e == nullptr; });
  EXPECT_FALSE(q.poll());
  EXPECT_EQ(error, "an illegal address was encountered");
  EXPECT_TRUE(later);
}

TEST(CompletionQueue, AWaitAddedByAContinuationRunsOnTheNextPollAndArmsNothing) {
  int arms = 0;
  CompletionQueue q([&] { ++arms; });
  std::vector<std::string> ran;
  q.when([] { return true; }, [&](std::exception_ptr) {
    ran.push_back("read-back");
    // e.g. the replication's momentum read after its update's
    q.when([] { return true; }, [&](std::exception_ptr) { ran.push_back("momentum"); });
  });
  EXPECT_EQ(arms, 1);
  EXPECT_TRUE(q.poll());  // the owner polls again: its poll said waits remain
  EXPECT_EQ(ran, std::vector<std::string>({"read-back"}));
  EXPECT_EQ(arms, 1);
  EXPECT_FALSE(q.poll());
  EXPECT_EQ(ran, std::vector<std::string>({"read-back", "momentum"}));
  q.when([] { return true; }, [](std::exception_ptr) {});
  EXPECT_EQ(arms, 2);  // empty again: the next wait arms the owner's poll again
}

TEST(CompletionQueue, AContinuationThatThrowsLeavesTheQueueUsable) {
  CompletionQueue q;
  bool second = false;
  q.when([] { return true; }, [](std::exception_ptr) { throw std::logic_error("a bug"); });
  q.when([] { return true; }, [&](std::exception_ptr) { second = true; });
  EXPECT_THROW(q.poll(), std::logic_error);
  EXPECT_EQ(q.pending(), 1u);
  EXPECT_FALSE(q.poll());
  EXPECT_TRUE(second);
}

TEST(CompletionQueue, DrainRunsEveryWaitOnceEachIsOver) {
  CompletionQueue q;
  int polls_left = 5;  // the copy finishes after a few queries
  int ran = 0;
  q.when([&] { return --polls_left <= 0; }, [&](std::exception_ptr) { ++ran; });
  q.when([] { return true; }, [&](std::exception_ptr) { ++ran; });
  q.drain();
  EXPECT_EQ(ran, 2);
  EXPECT_EQ(polls_left, 0);
  EXPECT_EQ(q.pending(), 0u);
}

}  // namespace
}  // namespace muon::daemon
