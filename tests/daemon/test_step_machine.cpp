// The per-parameter step machine in process (daemon/step/step_machine.hpp): every transition of
// its diagram, the step rules, timeouts driven by a fake clock (time points handed in, never
// read from a clock) and lost ranks. No sockets, no timers, no threads.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "daemon/registration.hpp"
#include "daemon/step/step_machine.hpp"

using namespace muon;
using namespace muon::daemon;
using namespace std::chrono_literals;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

namespace {

/// A clock the test moves by hand: the machine only ever sees the time points it is given.
struct FakeClock {
  StepMachine::Clock::time_point t{};  // the epoch: nothing here depends on the real time
  StepMachine::Clock::time_point now() const { return t; }
  void advance(std::chrono::milliseconds d) { t += d; }
};

constexpr auto kTimeout = 1000ms;

// A 2x4 parameter: ranks 0 and 1 push halves [0, 4) and [4, 8) (one contributor per element),
// rank 2 only wants the update back.
ParameterLayout sharded_layout() {
  ParameterSpec spec;
  spec.name = "w";
  spec.shape = MatrixShape{1, 2, 4};
  PendingRegistration reg(spec, 3);
  reg.add(0, spec, {{0, 4}}, {{0, 8}});
  reg.add(1, spec, {{4, 8}}, {{0, 8}});
  reg.add(2, spec, {}, {{0, 8}});
  return reg.finish();
}

auto host_store = [] { return make_host_contribution_store(); };

// Rank `rank` pushes its half of step `step` (values rank + 1) and commits.
void push_and_commit(StepReducer& r, int rank) {
  const std::vector<float> v(4, static_cast<float>(rank + 1));
  r.add(rank, rank == 0 ? 0 : 4, v);
  r.commit(rank);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A machine already registered (owned) and idle.
StepMachine idle_machine() {
  StepMachine m("w", kTimeout);
  m.registration_started({});
  m.registration_complete(/*relayed=*/false);
  return m;
}

}  // namespace

TEST(StepMachine, RegistrationOwnedGoesIdleAndClearsTheDeadline) {
  FakeClock clock;
  StepMachine m("w", kTimeout);
  EXPECT_EQ(m.phase(), Phase::registering);
  EXPECT_FALSE(m.deadline());
  m.registration_started(clock.now());
  ASSERT_TRUE(m.deadline());
  EXPECT_EQ(*m.deadline(), clock.now() + kTimeout);
  clock.advance(300ms);
  m.registration_started(clock.now());  // a later registrant does not move the deadline
  EXPECT_EQ(*m.deadline(), StepMachine::Clock::time_point{} + kTimeout);
  m.registration_complete(false);
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_FALSE(m.deadline());
  EXPECT_EQ(m.last_step(), -1);
}

TEST(StepMachine, RegistrationRelayedAwaitsTheOwnerThenTakesItsLastStep) {
  StepMachine m("w", kTimeout);
  m.registration_started({});
  m.registration_complete(/*relayed=*/true);
  EXPECT_EQ(m.phase(), Phase::awaiting_owner);
  EXPECT_CONTAINS(error_of([&] { m.check_step(0); }), "before its registration completed");
  m.owner_registered(41);
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_EQ(m.last_step(), 41);
  EXPECT_NO_THROW(m.check_step(42));
}

TEST(StepMachine, RegistrationTimeoutFiresOnceAtTheDeadlineAndRegistrationStaysOpen) {
  FakeClock clock;
  StepMachine m("w", kTimeout);
  m.registration_started(clock.now());
  clock.advance(kTimeout - 1ms);
  EXPECT_FALSE(m.expire_registration(clock.now()));
  clock.advance(1ms);
  EXPECT_TRUE(m.expire_registration(clock.now()));
  EXPECT_FALSE(m.expire_registration(clock.now() + kTimeout));  // once
  EXPECT_EQ(m.phase(), Phase::registering);
  m.registration_started(clock.now());  // a late registrant does not restart it
  EXPECT_FALSE(m.deadline());
  m.registration_complete(false);  // the last registrant still completes it
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_FALSE(m.expire_registration(clock.now() + 10 * kTimeout));
}

TEST(StepMachine, TransitionsOutOfTheirPhaseAreRefused) {
  StepMachine m("w", kTimeout);
  EXPECT_CONTAINS(error_of([&] { m.owner_registered(0); }), "while registering");
  EXPECT_CONTAINS(error_of([&] { m.start_computing(); }), "start_computing while registering");
  EXPECT_CONTAINS(error_of([&] { m.check_step(0); }), "before its registration completed");
  m.registration_complete(false);
  EXPECT_CONTAINS(error_of([&] { m.registration_complete(false); }), "while idle");
  EXPECT_CONTAINS(error_of([&] { m.registration_started({}); }), "while idle");
  EXPECT_CONTAINS(error_of([&] { m.start_computing(); }), "start_computing while idle");
  EXPECT_FALSE(m.drop());
  EXPECT_FALSE(m.lose(0));
  EXPECT_FALSE(m.expire_step(StepMachine::Clock::time_point{} + 100 * kTimeout));
  EXPECT_EQ(m.phase(), Phase::idle);
}

TEST(StepMachine, AStepGathersComputesAndFinishes) {
  const auto layout = sharded_layout();
  FakeClock clock;
  auto m = idle_machine();
  clock.advance(5000ms);
  StepReducer& r = m.open(7, layout, clock.now(), host_store);
  EXPECT_EQ(m.phase(), Phase::gathering);
  EXPECT_EQ(m.gathering(), &r);
  EXPECT_EQ(r.step(), 7);
  EXPECT_EQ(*m.deadline(), clock.now() + kTimeout);
  push_and_commit(r, 0);
  // A second chunk of the same step finds the same reducer (and keeps the deadline).
  clock.advance(10ms);
  EXPECT_EQ(&m.open(7, layout, clock.now(), host_store), &r);
  EXPECT_EQ(*m.deadline(), clock.now() - 10ms + kTimeout);
  EXPECT_CONTAINS(error_of([&] { m.start_computing(); }), "before every contributor committed");
  push_and_commit(r, 1);
  std::vector<float> grad(8);
  r.reduce(grad.data());
  EXPECT_EQ(grad, (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2}));
  m.start_computing();
  EXPECT_EQ(m.phase(), Phase::computing);
  EXPECT_EQ(m.gathering(), nullptr);
  EXPECT_FALSE(m.deadline());
  m.finish(7, /*consumed=*/true);
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_EQ(m.last_step(), 7);
}

TEST(StepMachine, AReplicatedStepHoldsTheNextOneUntilTheBuddyHasIt) {
  const auto layout = sharded_layout();
  auto m = idle_machine();
  StepReducer& r = m.open(7, layout, {}, host_store);
  push_and_commit(r, 0);
  push_and_commit(r, 1);
  m.start_computing();
  m.finish(7, /*consumed=*/true, /*replicate=*/true);
  EXPECT_EQ(m.phase(), Phase::replicating);
  EXPECT_EQ(m.last_step(), 7);  // applied: the momentum is final
  EXPECT_STREQ(phase_name(m.phase()), "replicating");
  EXPECT_CONTAINS(error_of([&] { m.check_step(8); }),
                  "step 8 pushed while step 7 is still being replicated to its buddy");
  m.replicated();
  EXPECT_EQ(m.phase(), Phase::idle);
  m.check_step(8);
  // A relayed step the owner dropped does not replicate (nothing was applied).
  StepReducer& r8 = m.open(8, layout, {}, host_store);
  push_and_commit(r8, 0);
  push_and_commit(r8, 1);
  m.start_computing();
  m.finish(8, /*consumed=*/false, /*replicate=*/true);
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_EQ(m.last_step(), 7);
  m.replicated();  // outside replicating: nothing
  EXPECT_EQ(m.phase(), Phase::idle);
}

TEST(StepMachine, StepRulesNameTheParameterAndTheSteps) {
  const auto layout = sharded_layout();
  auto m = idle_machine();
  // The first step after registration may be any number.
  StepReducer& r = m.open(3, layout, {}, host_store);
  EXPECT_CONTAINS(error_of([&] { m.check_step(4); }),
                  "parameter 'w': step 4 pushed while step 3 is being gathered");
  push_and_commit(r, 0);
  push_and_commit(r, 1);
  m.start_computing();
  EXPECT_CONTAINS(error_of([&] { m.check_step(4); }),
                  "step 4 pushed while step 3 is still being computed");
  EXPECT_CONTAINS(error_of([&] { m.load(3); }), "while step is in progress");
  m.finish(3, true);
  EXPECT_CONTAINS(error_of([&] { m.check_step(3); }),
                  "step 3 was already applied (last applied step 3)");
  EXPECT_CONTAINS(error_of([&] { m.check_step(6); }), "step gap: got step 6, expected 4");
  EXPECT_CONTAINS(error_of([&] { m.open(6, layout, {}, host_store); }), "step gap");
  // These two are StepMismatch (code step_mismatch on the wire); the others plain InvalidArgument.
  EXPECT_THROW(m.check_step(3), StepMismatch);
  EXPECT_THROW(m.check_step(6), StepMismatch);
  EXPECT_EQ(m.phase(), Phase::idle);  // a refused open leaves it idle
  EXPECT_NO_THROW(m.check_step(4));
}

TEST(StepMachine, TheReducerIsReusedAcrossStepsAndStartsEachStepAfresh) {
  const auto layout = sharded_layout();
  auto m = idle_machine();
  StepReducer* first = &m.open(0, layout, {}, host_store);
  push_and_commit(*first, 0);
  push_and_commit(*first, 1);
  m.start_computing();
  m.finish(0, true);
  int stores = 0;
  StepReducer& second = m.open(1, layout, {}, [&] {
    ++stores;
    return make_host_contribution_store();
  });
  EXPECT_EQ(&second, first);  // the same buffers
  EXPECT_EQ(stores, 0);       // no new store
  EXPECT_EQ(second.step(), 1);
  EXPECT_EQ(second.missing_ranks(), (std::vector<int>{0, 1}));  // nothing carried over
}

TEST(StepMachine, StepTimeoutDropsAnIncompleteStepAtTheDeadlineOnly) {
  const auto layout = sharded_layout();
  FakeClock clock;
  auto m = idle_machine();
  StepReducer& r = m.open(0, layout, clock.now(), host_store);
  push_and_commit(r, 1);
  clock.advance(kTimeout - 1ms);
  EXPECT_FALSE(m.expire_step(clock.now()));
  EXPECT_EQ(m.phase(), Phase::gathering);
  clock.advance(1ms);
  const auto dropped = m.expire_step(clock.now());
  ASSERT_TRUE(dropped);
  EXPECT_EQ(dropped->step, 0);
  EXPECT_EQ(dropped->missing, (std::vector<int>{0}));
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_FALSE(m.deadline());
  EXPECT_EQ(m.last_step(), -1);  // nothing applied: the same step may be pushed again
  EXPECT_NO_THROW(m.check_step(0));
  // Pushed again later: a fresh deadline from its new first chunk.
  clock.advance(5000ms);
  m.open(0, layout, clock.now(), host_store);
  EXPECT_EQ(*m.deadline(), clock.now() + kTimeout);
  EXPECT_FALSE(m.expire_step(clock.now() + kTimeout - 1ms));
}

TEST(StepMachine, AStaleTimerOfAnEarlierStepDoesNotDropTheNextOne) {
  const auto layout = sharded_layout();
  FakeClock clock;
  auto m = idle_machine();
  StepReducer& r = m.open(0, layout, clock.now(), host_store);
  push_and_commit(r, 0);
  push_and_commit(r, 1);
  m.start_computing();
  m.finish(0, true);
  clock.advance(kTimeout / 2);
  m.open(1, layout, clock.now(), host_store);
  // The first step's deadline passes: the second step is not due yet.
  EXPECT_FALSE(m.expire_step(StepMachine::Clock::time_point{} + kTimeout));
  EXPECT_EQ(m.phase(), Phase::gathering);
  EXPECT_TRUE(m.expire_step(clock.now() + kTimeout));
}

TEST(StepMachine, ACompleteStepIsNotDroppedByItsDeadline) {
  const auto layout = sharded_layout();
  auto m = idle_machine();
  StepReducer& r = m.open(0, layout, {}, host_store);
  push_and_commit(r, 0);
  push_and_commit(r, 1);
  EXPECT_FALSE(m.expire_step(StepMachine::Clock::time_point{} + 2 * kTimeout));
  EXPECT_EQ(m.phase(), Phase::gathering);  // the hand-off is the caller's next move
}

TEST(StepMachine, ALostContributorDropsTheStepOnlyWhenItHasNotCommitted) {
  const auto layout = sharded_layout();
  auto m = idle_machine();
  StepReducer& r = m.open(2, layout, {}, host_store);
  push_and_commit(r, 0);
  EXPECT_FALSE(m.lose(0));  // committed already: its contribution is in
  EXPECT_FALSE(m.lose(2));  // pushes nothing
  EXPECT_FALSE(m.lose(9));  // not a rank of the parameter
  EXPECT_EQ(m.phase(), Phase::gathering);
  const auto dropped = m.lose(1);
  ASSERT_TRUE(dropped);
  EXPECT_EQ(dropped->step, 2);
  EXPECT_EQ(dropped->missing, (std::vector<int>{1}));
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_EQ(m.last_step(), -1);
}

TEST(StepMachine, ALostRankDoesNotTouchAComputingStep) {
  const auto layout = sharded_layout();
  auto m = idle_machine();
  StepReducer& r = m.open(0, layout, {}, host_store);
  push_and_commit(r, 0);
  push_and_commit(r, 1);
  m.start_computing();
  EXPECT_FALSE(m.lose(0));
  EXPECT_FALSE(m.drop());
  EXPECT_EQ(m.phase(), Phase::computing);
}

TEST(StepMachine, ShutdownDropsTheOpenStepWithItsMissingRanks) {
  const auto layout = sharded_layout();
  auto m = idle_machine();
  m.open(5, layout, {}, host_store);
  const auto dropped = m.drop();
  ASSERT_TRUE(dropped);
  EXPECT_EQ(dropped->step, 5);
  EXPECT_EQ(dropped->missing, (std::vector<int>{0, 1}));
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_FALSE(m.deadline());
}

TEST(StepMachine, AStepTheOwnerDroppedLeavesTheLastStepSoItCanBePushedAgain) {
  const auto layout = sharded_layout();
  StepMachine m("w", kTimeout);
  m.registration_complete(/*relayed=*/true);
  m.owner_registered(9);
  StepReducer& r = m.open(10, layout, {}, host_store);
  push_and_commit(r, 0);
  push_and_commit(r, 1);
  m.start_computing();
  m.finish(10, /*consumed=*/false);  // e.g. the owner timed out on another domain
  EXPECT_EQ(m.phase(), Phase::idle);
  EXPECT_EQ(m.last_step(), 9);
  EXPECT_NO_THROW(m.check_step(10));
  // Refused by the owner's policy (non-finite): consumed like an applied step.
  StepReducer& again = m.open(10, layout, {}, host_store);
  push_and_commit(again, 0);
  push_and_commit(again, 1);
  m.start_computing();
  m.finish(10, /*consumed=*/true);
  EXPECT_EQ(m.last_step(), 10);
}

TEST(StepMachine, OwnerWordsAndMomentumLoadsSetTheLastStep) {
  auto m = idle_machine();
  m.record_step(12);  // an unasked update of a domain that pushes nothing
  EXPECT_EQ(m.last_step(), 12);
  EXPECT_EQ(m.phase(), Phase::idle);
  m.load(30);  // momentum loaded at step 30
  EXPECT_EQ(m.last_step(), 30);
  EXPECT_CONTAINS(error_of([&] { m.check_step(30); }), "already applied");
}
