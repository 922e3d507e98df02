// The server's core without networking: registration (contributor derivation), per-step
// reduction (bitwise reproducibility), momentum snapshots (safetensors layout, strict reading)
// and the batching scheduler (bitwise equal to unbatched, errors isolated per job).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "daemon/parameter.hpp"
#include "daemon/pool_routes.hpp"
#include "daemon/replica_store.hpp"
#include "daemon/registration.hpp"
#include "daemon/scheduler.hpp"
#include "daemon/snapshot.hpp"
#include "daemon/snapshot_writer.hpp"
#include "daemon/step_reducer.hpp"
#include "kernels/blas_threads.hpp"
#include "kernels/ns_choice.hpp"
#include "transport/bf16.hpp"
#include "transport/messages.hpp"

using namespace muon;
using namespace muon::daemon;

// `text` contains `part` (gtest without gmock).
#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

namespace {

ParameterSpec make_spec(const std::string& name, MatrixShape shape, MuonOptions options = {}) {
  ParameterSpec s;
  s.name = name;
  s.shape = shape;
  s.options = std::move(options);
  return s;
}

// Runs `f`, expecting exception E whose what() contains every one of `parts`.
template <class E, class F>
void expect_throw_with(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no exception thrown";
  } catch (const E& e) {
    for (const auto& p : parts) EXPECT_CONTAINS(e.what(), p);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> random_values(size_t n, uint32_t seed, bool wide_magnitudes = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-8.0f, 8.0f);
  std::vector<float> v(n);
  for (auto& x : v)
    x = wide_magnitudes ? normal(rng) * std::pow(10.0f, exponent(rng)) : normal(rng);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// same_spec / same_options

TEST(ParameterSpec, SameSpecComparesEveryField) {
  const auto a = make_spec("w", {1, 4, 6});
  EXPECT_TRUE(same_spec(a, a));
  auto b = a;
  b.name = "v";
  EXPECT_FALSE(same_spec(a, b));
  b = a;
  b.shape.batch = 2;
  EXPECT_FALSE(same_spec(a, b));
  b = a;
  b.grad_dtype = DType::bf16;
  EXPECT_FALSE(same_spec(a, b));
  b = a;
  b.update_dtype = DType::bf16;
  EXPECT_FALSE(same_spec(a, b));
  b = a;
  b.options.momentum.mu = 0.9f;
  EXPECT_FALSE(same_spec(a, b));
  b = a;
  b.options.orthogonalize.row_splits = {2, 2};
  EXPECT_FALSE(same_spec(a, b));
  b = a;
  b.options.orthogonalize.nonfinite = NonFinitePolicy::skip;
  EXPECT_FALSE(same_spec(a, b));
}

TEST(ParameterSpec, SameOptionsAgreesWithTheJsonForm) {
  MuonOptions a;
  std::vector<MuonOptions> variants(12, a);
  variants[0].momentum.convention = MomentumConvention::ema;
  variants[1].momentum.mu = 0.9f;
  variants[2].momentum.nesterov = false;
  variants[3].orthogonalize.schedule = "polar_express";
  variants[4].orthogonalize.steps = 7;
  variants[5].orthogonalize.eps = 1e-6f;
  variants[6].orthogonalize.eps_mode = EpsMode::clamp;
  variants[7].orthogonalize.scale_rule = ScaleRule::none;
  variants[8].orthogonalize.extra_scale = 2.0;
  variants[9].orthogonalize.algorithm = NsAlgorithm::syrk;
  variants[10].orthogonalize.precision = Precision::fp32;
  variants[11].orthogonalize.nonfinite = NonFinitePolicy::skip;
  EXPECT_TRUE(same_options(a, a));
  for (const auto& v : variants) {
    EXPECT_FALSE(same_options(a, v)) << transport::options_to_json(v);
    EXPECT_NE(transport::options_to_json(a), transport::options_to_json(v));
    EXPECT_TRUE(same_options(v, transport::options_from_json(transport::options_to_json(v))));
  }
}

TEST(ParameterSpec, TotalElements) {
  EXPECT_EQ(total_elements({}), 0);
  EXPECT_EQ(total_elements({{0, 5}, {7, 10}, {10, 10}}), 8);
}

// ---------------------------------------------------------------------------------------------
// PendingRegistration

TEST(Registration, RowShardsGiveOneContributor) {
  const auto spec = make_spec("w", {1, 8, 4});  // 32 elements, 2 rows per rank
  PendingRegistration reg(spec, 4);
  EXPECT_EQ(reg.missing_ranks(), (std::vector<int>{0, 1, 2, 3}));
  for (int r = 3; r >= 0; --r) {
    const bool done = reg.add(r, spec, {{r * 8, r * 8 + 8}}, {{r * 8, r * 8 + 8}});
    EXPECT_EQ(done, r == 0);
  }
  const auto layout = reg.finish();
  EXPECT_EQ(layout.contributors, 1);
  ASSERT_EQ(layout.ranks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(layout.ranks[r].rank, r);
    ASSERT_EQ(layout.ranks[r].push.size(), 1u);
    EXPECT_EQ(layout.ranks[r].push[0].begin, r * 8);
  }
}

TEST(Registration, FlatUnevenShardsSortedPerRank) {
  const auto spec = make_spec("w", {1, 5, 7});  // 35 elements
  PendingRegistration reg(spec, 3);
  reg.add(0, spec, {{20, 23}, {0, 11}}, {});  // unsorted on purpose
  reg.add(1, spec, {{11, 20}}, {{0, 35}});
  EXPECT_TRUE(reg.add(2, spec, {{23, 35}}, {}));
  const auto layout = reg.finish();
  EXPECT_EQ(layout.contributors, 1);
  ASSERT_EQ(layout.ranks[0].push.size(), 2u);
  EXPECT_EQ(layout.ranks[0].push[0].begin, 0);
  EXPECT_EQ(layout.ranks[0].push[1].begin, 20);
  EXPECT_EQ(total_elements(layout.ranks[1].want), 35);
}

TEST(Registration, EmptyShardForOneRank) {
  const auto spec = make_spec("w", {1, 4, 4});
  PendingRegistration reg(spec, 3);
  reg.add(0, spec, {{0, 10}}, {{0, 16}});
  reg.add(1, spec, {}, {{0, 16}});  // pushes nothing, only wants the update
  EXPECT_TRUE(reg.add(2, spec, {{10, 16}}, {}));
  const auto layout = reg.finish();
  EXPECT_EQ(layout.contributors, 1);
  EXPECT_TRUE(layout.ranks[1].push.empty());
}

TEST(Registration, DataParallelTwoContributorsPerElement) {
  const auto spec = make_spec("w", {2, 3, 4});  // 24 elements
  PendingRegistration reg(spec, 2);
  reg.add(0, spec, {{0, 24}}, {{0, 24}});
  EXPECT_TRUE(reg.add(1, spec, {{0, 24}}, {{0, 24}}));
  EXPECT_EQ(reg.finish().contributors, 2);
}

TEST(Registration, NonUniformCoverageRefused) {
  const auto spec = make_spec("w", {1, 4, 5});  // 20 elements
  PendingRegistration reg(spec, 2);
  reg.add(0, spec, {{0, 20}}, {});
  reg.add(1, spec, {{0, 8}}, {});
  expect_throw_with<InvalidArgument>(
      [&] { reg.finish(); },
      {"'w'", "elements [0, 8) have 2 contributors", "elements [8, 20) have 1 contributor"});
}

TEST(Registration, UncoveredElementRefused) {
  const auto spec = make_spec("w", {1, 4, 5});
  PendingRegistration reg(spec, 2);
  reg.add(0, spec, {{0, 7}}, {});
  reg.add(1, spec, {{9, 20}}, {});
  expect_throw_with<InvalidArgument>([&] { reg.finish(); },
                                     {"'w'", "elements [7, 9) have no contributor"});
}

TEST(Registration, ExplicitRegistrantsLeaveOtherRankIdsEmpty) {
  // An owner's registrants under a plan: ranks 2 and 3 push directly, relay rank 9 (world 8 +
  // server 1) forwards another domain's partial sum.
  const auto spec = make_spec("w", {1, 4, 4});
  PendingRegistration reg(spec, std::vector<int>{9, 3, 2, 3});
  EXPECT_EQ(reg.registrants(), (std::vector<int>{2, 3, 9}));
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(0, spec, {{0, 16}}, {});
      },
      {"'w'", "rank 0", "not expected to register", "registrants: 2, 3, 9"});
  EXPECT_FALSE(reg.add(9, spec, {{0, 16}}, {{0, 16}}));
  EXPECT_FALSE(reg.add(2, spec, {{0, 8}}, {{0, 8}}));
  EXPECT_EQ(reg.missing_ranks(), (std::vector<int>{3}));
  EXPECT_TRUE(reg.add(3, spec, {{8, 16}}, {}));
  const auto layout = reg.finish();
  EXPECT_EQ(layout.contributors, 2);
  EXPECT_EQ(layout.registrants, (std::vector<int>{2, 3, 9}));
  ASSERT_EQ(layout.ranks.size(), 10u);
  for (int r : {0, 1, 4, 5, 6, 7, 8}) {
    EXPECT_EQ(layout.ranks[r].rank, r);
    EXPECT_TRUE(layout.ranks[r].push.empty() && layout.ranks[r].want.empty()) << r;
  }
  EXPECT_EQ(layout.ranks[9].push[0].end, 16);
  EXPECT_THROW(PendingRegistration(spec, std::vector<int>{}), InvalidArgument);
  EXPECT_THROW(PendingRegistration(spec, std::vector<int>{-1, 2}), InvalidArgument);
}

TEST(Registration, PartialCoverageIsAllowedOnlyAtARelay) {
  // A domain of ZeRO-sharded ranks covers its own rows only; its relay forwards those.
  const auto spec = make_spec("w", {1, 4, 5});  // 20 elements
  PendingRegistration reg(spec, std::vector<int>{2, 3});
  reg.add(2, spec, {{10, 15}}, {{10, 15}});
  EXPECT_TRUE(reg.add(3, spec, {{15, 20}}, {{15, 20}}));
  expect_throw_with<InvalidArgument>([&] { reg.finish(); },
                                     {"elements [0, 10) have no contributor"});
  EXPECT_EQ(reg.finish(/*partial=*/true).contributors, 1);
  // Covered elements still need one count.
  reg.add(3, spec, {{12, 20}}, {});
  expect_throw_with<InvalidArgument>(
      [&] { reg.finish(true); },
      {"elements [10, 12) have 1 contributor", "elements [12, 15) have 2 contributors"});
  // A domain pushing nothing (it only wants the update) has no contributor at its relay; at an
  // owner that is refused.
  PendingRegistration none(spec, std::vector<int>{0});
  none.add(0, spec, {}, {{0, 20}});
  EXPECT_EQ(none.finish(true).contributors, 0);
  expect_throw_with<InvalidArgument>([&] { none.finish(); },
                                     {"elements [0, 20) have no contributor"});
}

// ---------------------------------------------------------------------------------------------
// PoolRoutes

namespace {

// Three domains: 0 = ranks {0, 1} with servers 0 and 1, 1 = ranks {2, 3} with server 2, 2 =
// ranks {4} and no server. "a" is owned by server 0; domain 1 relays through server 2; domain 2
// pushes straight to the owner. "b" is owned by server 2; domain 0 relays through server 1.
const char* kPlan = R"({
  "servers": [{"id": 0}, {"id": 1}, {"id": 2}],
  "domains": [{"id": 0, "servers": [0, 1], "compute_ranks": [0, 1]},
              {"id": 1, "servers": [2], "compute_ranks": [2, 3]},
              {"id": 2, "servers": [], "compute_ranks": [4]}],
  "ranks": [{"rank": 0}, {"rank": 1}, {"rank": 2}, {"rank": 3}, {"rank": 4}],
  "parameters": [{"name": "a", "owner": 0, "relays": [0, 2, null]},
                 {"name": "b", "owner": 2, "relays": [1, 2, null]}]})";

// kPlan with the first `from` replaced by `to`.
std::string plan_with(const std::string& from, const std::string& to) {
  const std::string plan = kPlan;
  const size_t at = plan.find(from);
  return plan.substr(0, at) + to + plan.substr(at + from.size());
}

}  // namespace

TEST(PoolRoutes, OwnerExpectsDirectRanksThenRelaysAndARelayItsDomain) {
  const PoolRoutes s0(kPlan, 0, "p"), s1(kPlan, 1, "p"), s2(kPlan, 2, "p");
  EXPECT_EQ(s0.world_size(), 5);
  EXPECT_EQ(s0.servers(), 3);
  // a at its owner: domains 0 and 2 directly, domain 1 as relay rank 5 + 2.
  const auto a0 = s0.route("a");
  ASSERT_TRUE(a0);
  EXPECT_FALSE(a0->relayed);
  EXPECT_EQ(a0->registrants, (std::vector<int>{0, 1, 4, 7}));
  // a at server 2: relays domain 1's ranks to owner 0.
  const auto a2 = s2.route("a");
  ASSERT_TRUE(a2);
  EXPECT_TRUE(a2->relayed);
  EXPECT_EQ(a2->owner, 0);
  EXPECT_EQ(a2->registrants, (std::vector<int>{2, 3}));
  // b: owner 2 gets its domain, rank 4, and relay server 1 (rank 6).
  EXPECT_EQ(s2.route("b")->registrants, (std::vector<int>{2, 3, 4, 6}));
  EXPECT_EQ(s1.route("b")->registrants, (std::vector<int>{0, 1}));
  EXPECT_EQ(s1.route("b")->owner, 2);
  EXPECT_EQ(s1.relayed(), 1);
  EXPECT_EQ(s2.relayed(), 1);
  EXPECT_EQ(s0.relayed(), 0);
  // Not routed through server 1: a clear refusal naming the owner; unknown names: no route.
  expect_throw_with<InvalidArgument>(
      [&] { s1.route("a"); }, {"does not route parameter 'a'", "server 1", "owner is server 0"});
  EXPECT_FALSE(s0.route("not.in.plan"));
}

TEST(PoolRoutes, MalformedPlansAreRefusedNamingTheField) {
  expect_throw_with<InvalidArgument>([] { PoolRoutes("{", 0, "p"); }, {"plan 'p' is not JSON"});
  expect_throw_with<InvalidArgument>([] { PoolRoutes(R"({"servers": []})", 0, "p"); },
                                     {"'domains' must be an array"});
  expect_throw_with<InvalidArgument>([] { PoolRoutes(kPlan, 3, "p"); }, {"there is no server 3"});
  expect_throw_with<InvalidArgument>(
      [] { PoolRoutes(plan_with("\"owner\": 0", "\"owner\": 9"), 0, "p"); },
      {"parameters[0].owner must be an integer in [0, 3)"});
  expect_throw_with<InvalidArgument>(
      [] { PoolRoutes(plan_with("[0, 2, null]", "[0, 2]"), 0, "p"); },
      {"relays has 2 entries for 3 domains"});
  // A relay must sit in the domain it relays for (one server relays one domain).
  expect_throw_with<InvalidArgument>(
      [] { PoolRoutes(plan_with("[0, 2, null]", "[0, 1, null]"), 0, "p"); },
      {"parameters[0].relays[1] = server 1 is not a server of domain 1"});
  expect_throw_with<InvalidArgument>(
      [] { PoolRoutes(plan_with("\"compute_ranks\": [4]", "\"compute_ranks\": [5]"), 0, "p"); },
      {"compute_ranks[]"});
  expect_throw_with<InvalidArgument>([] { PoolRoutes::from_file("/nonexistent/plan.json", 0); },
                                     {"cannot read plan '/nonexistent/plan.json'"});
}

TEST(PoolRoutes, ABuddyIsRoutedTheOwnersRegistrantsForATakeover) {
  // Server 1 keeps server 0's replicas, server 0 keeps server 2's.
  const std::string plan = plan_with(R"("servers": [{"id": 0}, {"id": 1}, {"id": 2}])",
                                     R"("servers": [{"id": 0, "buddy": 1}, {"id": 1},
                                                    {"id": 2, "buddy": 0}])");
  const PoolRoutes s0(plan, 0, "p"), s1(plan, 1, "p"), s2(plan, 2, "p");
  EXPECT_EQ(s0.buddy_of(0), 1);
  EXPECT_EQ(s0.buddy_of(1), -1);
  EXPECT_EQ(s0.buddy_of(2), 0);
  EXPECT_EQ(s0.owner_of("a"), 0);
  EXPECT_EQ(s0.owner_of("not.in.plan"), -1);
  // a at its buddy: owned there with the owner's registrants, only after a takeover.
  const auto a1 = s1.route("a");
  ASSERT_TRUE(a1);
  EXPECT_FALSE(a1->relayed);
  EXPECT_TRUE(a1->takeover);
  EXPECT_EQ(a1->owner, 0);
  EXPECT_EQ(a1->registrants, (std::vector<int>{0, 1, 4, 7}));
  // b at its buddy, server 0.
  EXPECT_TRUE(s0.route("b")->takeover);
  EXPECT_EQ(s0.route("b")->registrants, (std::vector<int>{2, 3, 4, 6}));
  EXPECT_FALSE(s0.route("a")->takeover);
  EXPECT_FALSE(s2.route("b")->takeover);
  // A buddy that relays one of its owner's parameters, or a server of its own, is refused.
  expect_throw_with<InvalidArgument>(
      [] {
        PoolRoutes(plan_with(R"({"id": 2})", R"({"id": 2, "buddy": 1})"), 0, "p");
      },
      {"server 1 relays it for domain 0 and is the buddy of its owner, server 2"});
  expect_throw_with<InvalidArgument>(
      [] { PoolRoutes(plan_with(R"({"id": 2})", R"({"id": 2, "buddy": 2})"), 0, "p"); },
      {"server 2 is its own buddy"});
  expect_throw_with<InvalidArgument>(
      [] { PoolRoutes(plan_with(R"({"id": 2})", R"({"id": 2, "buddy": 7})"), 0, "p"); },
      {"servers[2].buddy must be an integer in [0, 3)"});
}

// ReplicaStore

namespace {

transport::RegisterParam seal_of(const std::string& name, int64_t step, const std::string& outcome) {
  transport::RegisterParam m;
  m.name = name;
  m.shape = {2, 3};
  m.replica = true;
  m.replica_step = step;
  m.replica_outcome = outcome;
  return m;
}

}  // namespace

TEST(ReplicaStore, AStepIsKeptOnlyOnceSealedWhole) {
  using transport::ChunkKind;
  ReplicaStore store;
  const std::vector<float> m0{1, 2, 3, 4, 5, 6}, u0{6, 5, 4, 3, 2, 1};
  store.stage("w", 1, ChunkKind::replica_momentum, 4, 0, std::span(m0).first(4));
  store.stage("w", 1, ChunkKind::replica_momentum, 4, 4, std::span(m0).subspan(4));
  store.stage("w", 1, ChunkKind::replica_update, 4, 0, u0);
  EXPECT_EQ(store.find("w"), nullptr);  // staged, not sealed
  store.seal(seal_of("w", 4, "applied"), 1);
  ASSERT_NE(store.find("w"), nullptr);
  EXPECT_EQ(store.find("w")->step, 4);
  EXPECT_EQ(store.find("w")->momentum, m0);
  EXPECT_EQ(store.find("w")->update, u0);
  EXPECT_EQ(store.find("w")->source, 1);
  EXPECT_TRUE(store.find("w")->registrants.empty());  // an owner that sends none
  // Step 5 half streamed (the owner lost mid-stream): its seal is refused, step 4 stays whole.
  const std::vector<float> m1{9, 9, 9};
  store.stage("w", 1, ChunkKind::replica_momentum, 5, 0, m1);
  expect_throw_with<InvalidArgument>([&] { store.seal(seal_of("w", 5, "applied"), 1); },
                                     {"replica of 'w' step 5", "3 momentum values staged for 6"});
  EXPECT_EQ(store.find("w")->step, 4);
  EXPECT_EQ(store.find("w")->momentum, m0);
  // A seal of a step nothing was staged for; an applied step without its update.
  expect_throw_with<InvalidArgument>([&] { store.seal(seal_of("w", 6, "applied"), 1); },
                                     {"no chunk of that step staged"});
  store.stage("w", 1, ChunkKind::replica_momentum, 7, 0, m0);
  expect_throw_with<InvalidArgument>([&] { store.seal(seal_of("w", 7, "applied"), 1); },
                                     {"0 update values staged for outcome 'applied'"});
  // The registration state: momentum only, and the owner's registrants with their ranges.
  store.stage("v", 2, ChunkKind::replica_momentum, -1, 0, m0);
  auto registered = seal_of("v", -1, "registered");
  registered.replica_registrants = {{0, {{0, 6}}, {{0, 6}}, true}, {3, {{0, 6}}, {}, false}};
  store.seal(registered, 2);
  EXPECT_EQ(store.find("v")->step, -1);
  EXPECT_TRUE(store.find("v")->update.empty());
  ASSERT_EQ(store.find("v")->registrants.size(), 2u);
  EXPECT_EQ(store.find("v")->registrants[1].rank, 3);
  EXPECT_TRUE(store.find("v")->registrants[1].want.empty());
  // Taken over: out of the store.
  const auto taken = store.take("w");
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->step, 4);
  EXPECT_EQ(store.find("w"), nullptr);
  EXPECT_FALSE(store.take("w"));
  expect_throw_with<InvalidArgument>(
      [&] { store.stage("w", 1, ChunkKind::gradient, 1, 0, m0); }, {"replica of 'w'"});
}

TEST(Registration, OverlapWithinRankRefusedAndStateKept) {
  const auto spec = make_spec("w", {1, 4, 5});
  PendingRegistration reg(spec, 2);
  reg.add(0, spec, {{0, 10}}, {});
  // Replacing rank 0's registration with a bad one throws and keeps the old one.
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(0, spec, {{0, 10}, {5, 20}}, {});
      },
      {"'w'", "rank 0", "push ranges [0, 10) and [5, 20) overlap"});
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(1, spec, {{10, 20}}, {{3, 8}, {0, 4}});
      },
      {"rank 1", "want ranges [0, 4) and [3, 8) overlap"});
  EXPECT_EQ(reg.missing_ranks(), (std::vector<int>{1}));
  EXPECT_TRUE(reg.add(1, spec, {{10, 20}}, {}));
  EXPECT_EQ(reg.finish().ranks[0].push[0].end, 10);
  // A valid replacement takes effect.
  reg.add(1, spec, {{0, 20}}, {});
  EXPECT_THROW(reg.finish(), InvalidArgument);  // [0,10) now has 2, [10,20) has 1
}

TEST(Registration, OutOfRangeRefused) {
  const auto spec = make_spec("w", {1, 4, 5});
  PendingRegistration reg(spec, 2);
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(0, spec, {{15, 21}}, {});
      },
      {"'w'", "rank 0", "push range [15, 21)", "[0, 20)"});
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(0, spec, {{-1, 3}}, {});
      },
      {"push range [-1, 3)"});
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(0, spec, {{5, 3}}, {});
      },
      {"push range [5, 3)"});
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(0, spec, {}, {{0, 25}});
      },
      {"want range [0, 25)"});
  expect_throw_with<InvalidArgument>([&] { reg.add(2, spec, {}, {}); }, {"rank 2"});
  expect_throw_with<InvalidArgument>([&] { reg.add(-1, spec, {}, {}); }, {"rank -1"});
  EXPECT_EQ(reg.missing_ranks(), (std::vector<int>{0, 1}));
}

TEST(Registration, SpecMismatchBetweenRanksRefused) {
  const auto spec = make_spec("w", {1, 4, 5});
  PendingRegistration reg(spec, 2);
  reg.add(0, spec, {{0, 20}}, {});
  auto other = spec;
  other.shape.rows = 5;
  other.shape.cols = 4;
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(1, other, {{0, 20}}, {});
      },
      {"'w'", "rank 1", "shape"});
  other = spec;
  other.options.momentum.mu = 0.9f;
  expect_throw_with<InvalidArgument>(
      [&] {
        reg.add(1, other, {{0, 20}}, {});
      },
      {"'w'", "rank 1", "options"});
  other = spec;
  other.grad_dtype = DType::bf16;
  expect_throw_with<InvalidArgument>([&] { reg.add(1, other, {{0, 20}}, {}); }, {"grad_dtype"});
  EXPECT_EQ(reg.missing_ranks(), (std::vector<int>{1}));
}

TEST(Registration, MissingRanksAndIncompleteFinish) {
  const auto spec = make_spec("w", {1, 4, 5});
  PendingRegistration reg(spec, 4);
  EXPECT_FALSE(reg.add(2, spec, {{0, 20}}, {}));
  EXPECT_FALSE(reg.add(0, spec, {}, {}));
  EXPECT_EQ(reg.missing_ranks(), (std::vector<int>{1, 3}));
  expect_throw_with<InvalidArgument>([&] { reg.finish(); }, {"'w'", "missing ranks 1, 3"});
  EXPECT_FALSE(reg.add(2, spec, {{0, 20}}, {}));  // re-registration does not complete anything
  EXPECT_FALSE(reg.add(3, spec, {}, {}));
  EXPECT_TRUE(reg.add(1, spec, {}, {}));
  EXPECT_TRUE(reg.missing_ranks().empty());
  EXPECT_EQ(reg.finish().contributors, 1);
}

TEST(Registration, InvalidSpecRefused) {
  expect_throw_with<InvalidArgument>(
      [] {
        PendingRegistration(make_spec("w", {1, 0, 5}), 1);
      },
      {"'w'"});
  expect_throw_with<InvalidArgument>(
      [] {
        PendingRegistration(make_spec("w", {1, 4, 5}), 0);
      },
      {"'w'", "world size"});
  MuonOptions bad;
  bad.orthogonalize.schedule = "no_such_schedule";
  expect_throw_with<InvalidArgument>(
      [&] {
        PendingRegistration(make_spec("w", {1, 4, 5}, bad), 1);
      },
      {"'w'"});
  bad = {};
  bad.orthogonalize.row_splits = {1, 2};  // does not add up to 4 rows
  expect_throw_with<InvalidArgument>(
      [&] {
        PendingRegistration(make_spec("w", {1, 4, 5}, bad), 1);
      },
      {"'w'"});
  expect_throw_with<InvalidArgument>(
      [] {
        PendingRegistration(make_spec("w", {int64_t{1} << 30, 1 << 20, 1 << 20}), 1);
      },
      {"'w'"});
}

TEST(Registration, RowSplitsWrappingAroundInt64Refused) {
  // fuzz_registration input (UBSan: signed overflow in row_blocks): options from the wire whose
  // row splits sum to 2^64 + 2, i.e. wrap to the 2 rows of the matrix, used to be accepted.
  const auto options = transport::options_from_json(
      R"({"momentum":"sum","mu":0.95,"nesterov":true,"schedule":"keller","steps":0,)"
      R"("eps":1e-7,"eps_mode":"add","scale":"keller","extra_scale":1,)"
      R"("row_splits":[9223372036854775807,9223372036854775807,4],"algorithm":"plain",)"
      R"("precision":"default","nonfinite":"error"})");
  expect_throw_with<InvalidArgument>(
      [&] {
        PendingRegistration(make_spec("w", {1, 2, 4}, options), 1);
      },
      {"'w'", "row splits add up to more than 2^63", "2 rows"});
}

// ---------------------------------------------------------------------------------------------
// StepReducer

namespace {

ParameterLayout layout_of(const ParameterSpec& spec,
                          const std::vector<std::vector<Range>>& push_per_rank) {
  PendingRegistration reg(spec, static_cast<int>(push_per_rank.size()));
  for (size_t r = 0; r < push_per_rank.size(); ++r) {
    reg.add(static_cast<int>(r), spec, push_per_rank[r], {});
  }
  return reg.finish();
}

}  // namespace

TEST(StepReducer, SumIsInRankOrderNotArrivalOrder) {
  // Every rank pushes every element (data parallel). Float addition is not associative:
  // (1e8 + 1) - 1e8 == 0 but (1e8 - 1e8) + 1 == 1.
  const auto layout = layout_of(make_spec("w", {1, 1, 4}), {{{0, 4}}, {{0, 4}}, {{0, 4}}});
  const std::vector<std::vector<float>> v = {
      {1e8f, -1e8f, -1e8f, 3.0f}, {1.0f, 1e8f, 1.0f, 1e-8f}, {-1e8f, 1.0f, 1e8f, -3.0f}};
  StepReducer red(layout, 7);
  EXPECT_EQ(red.missing_ranks(), (std::vector<int>{0, 1, 2}));
  for (int r : {2, 0, 1}) {  // arrival order differs from rank order
    EXPECT_FALSE(red.complete());
    red.add(r, 0, v[r]);
    red.commit(r);
  }
  ASSERT_TRUE(red.complete());
  std::vector<float> grad(4, 123.0f);
  red.reduce(grad.data());
  for (size_t i = 0; i < 4; ++i) {
    volatile float s01 = v[0][i] + v[1][i];  // volatile: no reassociation by the compiler
    const float expected = s01 + v[2][i];
    volatile float s20 = v[2][i] + v[0][i];
    const float arrival = s20 + v[1][i];
    EXPECT_EQ(std::memcmp(&grad[i], &expected, sizeof(float)), 0) << i;
    EXPECT_NE(grad[i], arrival) << "test values do not depend on the order";
  }
  EXPECT_EQ(grad[0], 0.0f);  // (1e8 + 1) - 1e8; arrival order gives (-1e8 + 1e8) + 1 = 1
  EXPECT_EQ(grad[1], 1.0f);  // (-1e8 + 1e8) + 1; arrival order gives (1 - 1e8) + 1e8 = 0
  EXPECT_EQ(grad[2], 0.0f);  // (-1e8 + 1) + 1e8; arrival order gives (1e8 - 1e8) + 1 = 1
  EXPECT_EQ(grad[3], 0.0f);  // (3 + 1e-8) - 3
}

TEST(StepReducer, SingleContributorGivesExactValues) {
  const auto layout = layout_of(make_spec("w", {1, 2, 3}), {{{0, 6}}});
  StepReducer red(layout, 0);
  const std::vector<float> v = {-0.0f,
                                0.0f,
                                std::numeric_limits<float>::denorm_min(),
                                -1.5f,
                                std::numeric_limits<float>::max(),
                                1e-30f};
  red.add(0, 0, v);
  red.commit(0);
  std::vector<float> grad(6);
  red.reduce(grad.data());
  EXPECT_TRUE(bitwise_equal(grad, v));  // including the sign of zero
}

TEST(StepReducer, RepeatedPushesAccumulateInPushOrder) {
  const auto layout = layout_of(make_spec("w", {1, 1, 4}), {{{0, 4}}});
  StepReducer red(layout, 1);
  red.add(0, 0, std::vector<float>{1e8f, 1.0f, 2.0f, 3.0f});
  red.add(0, 0, std::vector<float>{1.0f, 1e8f, 2.0f, 3.0f});
  red.add(0, 0, std::vector<float>{-1e8f, -1e8f, 2.0f, 3.0f});
  red.commit(0);
  std::vector<float> grad(4);
  red.reduce(grad.data());
  EXPECT_EQ(grad, (std::vector<float>{0.0f, 0.0f, 6.0f, 9.0f}));
}

namespace {

// Reduces the same per-rank data (random, magnitudes 1e-8..1e8) cut into chunks of `chunk`
// elements, chunks arriving shuffled by `seed`, ranks committing in `rank_order`.
std::vector<float> reduce_chunked(const ParameterLayout& layout,
                                  const std::vector<std::vector<float>>& full, int64_t chunk,
                                  uint32_t seed, const std::vector<int>& rank_order) {
  struct Piece {
    int rank;
    int64_t offset, count;
  };
  std::vector<Piece> pieces;
  for (int r : rank_order) {
    for (const auto& g : layout.ranks[r].push) {
      for (int64_t o = g.begin; o < g.end; o += chunk) {
        pieces.push_back({r, o, std::min(chunk, g.end - o)});
      }
    }
  }
  std::mt19937 rng(seed);
  std::shuffle(pieces.begin(), pieces.end(), rng);
  StepReducer red(layout, 3);
  for (const auto& p : pieces) {
    red.add(p.rank, p.offset,
            std::span<const float>(full[p.rank].data() + p.offset, static_cast<size_t>(p.count)));
  }
  for (int r : rank_order) {
    if (!layout.ranks[r].push.empty()) red.commit(r);
  }
  std::vector<float> grad(static_cast<size_t>(layout.spec.shape.numel()));
  red.reduce(grad.data());
  return grad;
}

}  // namespace

TEST(StepReducer, BitwiseSameForAnyChunkingAndArrivalOrder) {
  // 4 ranks: two data-parallel replicas, each split in uneven flat shards, plus one rank that
  // pushes nothing. Every element has 2 contributors.
  const auto spec = make_spec("w", {2, 7, 9});  // 126 elements
  const auto layout =
      layout_of(spec, {{{0, 50}, {100, 126}}, {{0, 61}}, {}, {{61, 126}}, {{50, 100}}});
  ASSERT_EQ(layout.contributors, 2);
  std::vector<std::vector<float>> full(5);
  for (uint32_t r = 0; r < 5; ++r) full[r] = random_values(126, 100 + r, /*wide_magnitudes=*/true);

  const auto reference = reduce_chunked(layout, full, 1000, 0, {0, 1, 2, 3, 4});
  // The reference by hand: ascending rank order per element.
  for (int64_t i = 0; i < 126; ++i) {
    std::vector<float> contrib;
    for (int r = 0; r < 5; ++r) {
      for (const auto& g : layout.ranks[r].push) {
        if (i >= g.begin && i < g.end) contrib.push_back(full[r][i]);
      }
    }
    ASSERT_EQ(contrib.size(), 2u);
    const float expected = contrib[0] + contrib[1];
    EXPECT_EQ(std::memcmp(&reference[i], &expected, sizeof(float)), 0) << i;
  }
  const std::vector<std::vector<int>> orders = {{4, 3, 2, 1, 0}, {2, 0, 4, 1, 3}, {1, 3, 0, 4, 2}};
  for (int64_t chunk : {1, 3, 7, 16, 50}) {
    for (uint32_t seed : {1u, 2u, 3u}) {
      for (const auto& order : orders) {
        const auto got = reduce_chunked(layout, full, chunk, seed, order);
        EXPECT_TRUE(bitwise_equal(got, reference)) << "chunk " << chunk << " seed " << seed;
      }
    }
  }
}

TEST(StepReducer, APackedColumnBlockIsBitwiseItsRowsPushedOneByOne) {
  // A 6 x 8 matrix cut by columns over two ranks ([0, 3) and [3, 8)): one range per row each.
  const auto spec = make_spec("w", {1, 6, 8});
  std::vector<std::vector<Range>> cols(2);
  for (int64_t r = 0; r < 6; ++r) {
    cols[0].push_back({r * 8, r * 8 + 3});
    cols[1].push_back({r * 8 + 3, r * 8 + 8});
  }
  PendingRegistration reg(spec, 3);
  reg.add(0, spec, cols[0], {}, /*packed=*/true);
  reg.add(1, spec, cols[1], {}, /*packed=*/true);
  reg.add(2, spec, {{0, 48}}, {});  // a replicated contributor pushing by element
  const auto layout = reg.finish();
  ASSERT_EQ(layout.contributors, 2);
  std::vector<std::vector<float>> packed(2);
  for (int r = 0; r < 2; ++r) packed[r] = random_values(cols[r].size() * (r ? 5 : 3), 7 + r, true);
  const auto whole = random_values(48, 9, true);
  const auto run = [&](bool by_block, int64_t chunk) {
    StepReducer red(layout, 0);
    for (int r = 0; r < 2; ++r) {
      const int64_t n = static_cast<int64_t>(packed[r].size());
      for (int64_t at = 0; at < n; at += chunk) {
        const auto piece = std::span<const float>(packed[r]).subspan(
            static_cast<size_t>(at), static_cast<size_t>(std::min(chunk, n - at)));
        if (by_block) {
          red.add_packed(r, at, piece);
        } else {  // rows one by one, by element
          const int64_t w = r ? 5 : 3;
          for (int64_t k = 0; k < static_cast<int64_t>(piece.size()); ++k) {
            const int64_t pos = at + k;
            red.add(r, (pos / w) * 8 + (r ? 3 : 0) + pos % w, piece.subspan(k, 1));
          }
        }
      }
      red.commit(r);
    }
    red.add(2, 0, whole);
    red.commit(2);
    std::vector<float> grad(48);
    red.reduce(grad.data());
    return grad;
  };
  const auto rows = run(false, 1);
  for (int64_t chunk : {1, 4, 7, 30}) {
    EXPECT_TRUE(bitwise_equal(run(true, chunk), rows)) << "chunk " << chunk;
  }
  EXPECT_EQ(rows[8 * 2 + 4], packed[1][2 * 5 + 1] + whole[8 * 2 + 4]);
  // A packed span outside the rank's elements is refused, naming it, and changes nothing.
  StepReducer red(layout, 3);
  expect_throw_with<InvalidArgument>(
      [&] { red.add_packed(0, 16, std::vector<float>(3, 1.0f)); },
      {"'w'", "step 3", "rank 0", "packed elements [16, 19)", "18 pushed elements"});
  red.add_packed(0, 0, std::vector<float>(18, 1.0f));
  red.commit(0);
}

TEST(StepReducer, Bf16ContributionsAreWidenedExactlyAndAccumulate) {
  // One rank pushes bf16 twice over overlapping elements; another pushes fp32. The bf16 values
  // enter as their exact fp32 widening: the result equals the same pushes made in fp32.
  const auto layout = layout_of(make_spec("w", {1, 2, 5}), {{{0, 10}}, {{0, 10}}});
  const auto a = random_values(10, 11, true), b = random_values(6, 12, true);
  const auto c = random_values(10, 13, true);
  std::vector<uint16_t> a16(10), b16(6);
  std::vector<float> a_wide(10), b_wide(6);
  for (size_t i = 0; i < 10; ++i) {
    a16[i] = transport::f32_to_bf16(a[i]);
    a_wide[i] = transport::bf16_to_f32(a16[i]);
  }
  for (size_t i = 0; i < 6; ++i) {
    b16[i] = transport::f32_to_bf16(b[i]);
    b_wide[i] = transport::bf16_to_f32(b16[i]);
  }
  StepReducer bf(layout, 0), wide(layout, 0);
  bf.add(1, 0, c);
  bf.add(0, 0, Contribution{a16.data(), TileDType::bf16, false, 10});
  bf.add(0, 3, Contribution{b16.data(), TileDType::bf16, false, 6});
  wide.add(1, 0, c);
  wide.add(0, 0, a_wide);
  wide.add(0, 3, b_wide);
  for (auto* red : {&bf, &wide}) {
    red->commit(0);
    red->commit(1);
  }
  std::vector<float> got(10), expected(10);
  bf.reduce(got.data());
  wide.reduce(expected.data());
  EXPECT_TRUE(bitwise_equal(got, expected));
  const float e3 = (a_wide[3] + b_wide[0]) + c[3];  // accumulated in push order, then rank 1
  EXPECT_EQ(std::memcmp(&got[3], &e3, sizeof(float)), 0);
}

TEST(StepReducer, HostStoreRefusesDeviceContributions) {
  const auto layout = layout_of(make_spec("w", {1, 1, 4}), {{{0, 4}}});
  StepReducer red(layout, 0);
  const std::vector<float> v(4, 1.0f);
  expect_throw_with<InvalidArgument>(
      [&] {
        red.add(0, 0, Contribution{v.data(), TileDType::f32, true, 4});
      },
      {"cannot read device memory"});
}

TEST(StepReducer, ErrorsNameParameterStepAndRank) {
  const auto layout = layout_of(make_spec("w", {1, 4, 5}), {{{0, 10}, {12, 20}}, {}, {{10, 12}}});
  StepReducer red(layout, 42);
  const std::vector<float> four(4, 1.0f);
  expect_throw_with<InvalidArgument>([&] { red.add(1, 0, four); },
                                     {"'w'", "step 42", "rank 1", "pushes nothing"});
  expect_throw_with<InvalidArgument>([&] { red.add(0, 8, four); },
                                     {"'w'", "step 42", "rank 0", "[8, 12)"});  // crosses a gap
  expect_throw_with<InvalidArgument>([&] { red.add(0, 18, four); }, {"rank 0", "[18, 22)"});
  expect_throw_with<InvalidArgument>([&] { red.add(0, -2, four); }, {"rank 0", "[-2, 2)"});
  expect_throw_with<InvalidArgument>([&] { red.add(2, 10, four); }, {"rank 2", "[10, 14)"});
  expect_throw_with<InvalidArgument>([&] { red.add(5, 0, four); }, {"rank 5"});
  red.add(0, 0, four);
  red.add(0, 6, four);  // [6, 10)
  red.add(0, 12, four);
  expect_throw_with<InvalidArgument>(
      [&] { red.commit(0); }, {"'w'", "step 42", "rank 0", "elements [4, 6) were never pushed"});
  red.add(0, 4, std::vector<float>(2, 1.0f));
  expect_throw_with<InvalidArgument>([&] { red.commit(0); }, {"elements [16, 20)"});
  red.add(0, 16, four);
  red.commit(0);
  expect_throw_with<InvalidArgument>([&] { red.commit(0); }, {"rank 0", "already committed"});
  expect_throw_with<InvalidArgument>([&] { red.add(0, 0, four); }, {"rank 0", "already committed"});
  expect_throw_with<InvalidArgument>([&] { red.commit(1); }, {"rank 1", "pushes nothing"});
  EXPECT_FALSE(red.complete());
  EXPECT_EQ(red.missing_ranks(), (std::vector<int>{2}));
  std::vector<float> grad(20);
  expect_throw_with<Error>([&] { red.reduce(grad.data()); }, {"'w'", "step 42", "missing ranks 2"});
  expect_throw_with<InvalidArgument>([&] { red.commit(2); }, {"rank 2", "[10, 12)"});
  red.add(2, 10, std::vector<float>(2, 5.0f));
  red.commit(2);
  EXPECT_TRUE(red.complete());
  red.reduce(grad.data());
  EXPECT_EQ(grad[11], 5.0f);
  EXPECT_EQ(grad[19], 1.0f);
}

// ---------------------------------------------------------------------------------------------
// Snapshots

namespace {

class SnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("muon_snapshot_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes a safetensors-shaped file by hand: u64 LE header length, header, data.
  static void write_raw(const std::string& p, const std::string& header, size_t data_bytes) {
    std::ofstream f(p, std::ios::binary);
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(uint64_t{header.size()} >> (8 * i)));
    f << header;
    f << std::string(data_bytes, '\0');
  }
  static nlohmann::json valid_header() {
    return {{"w", {{"dtype", "F32"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}},
            {"__metadata__",
             {{"format", "muon-offload-momentum"},
              {"version", "1"},
              {"step:w", "5"},
              {"options:w", transport::options_to_json({})}}}};
  }

  std::filesystem::path dir_;
};

std::vector<SnapshotEntry> sample_entries() {
  SnapshotEntry a;
  a.name = "layers.1.mlp";
  a.shape = {3, 4};
  a.last_step = 17;
  a.options.momentum.convention = MomentumConvention::ema;
  a.options.momentum.mu = 0.9f;
  a.options.orthogonalize.row_splits = {1, 2};
  a.options.orthogonalize.eps = 3.3e-7f;
  a.momentum = random_values(12, 5, true);
  a.momentum[0] = -0.0f;
  a.momentum[1] = std::numeric_limits<float>::denorm_min();
  a.momentum[2] = std::numeric_limits<float>::quiet_NaN();
  SnapshotEntry b;
  b.name = "experts";
  b.shape = {2, 3, 5};
  b.last_step = -1;
  b.options.orthogonalize.schedule = "polar_express";
  b.options.orthogonalize.extra_scale = 0.1;
  b.momentum = random_values(30, 6);
  SnapshotEntry c;
  c.name = "attn.qkv";
  c.shape = {6, 2};
  c.last_step = int64_t{1} << 40;
  c.momentum = random_values(12, 7);
  return {a, b, c};  // not sorted by name
}

}  // namespace

TEST_F(SnapshotTest, RoundTripIsBitwise) {
  const auto entries = sample_entries();
  const auto p = path("state.safetensors");
  write_snapshot(p, entries);
  const auto back = read_snapshot(p);
  ASSERT_EQ(back.size(), 3u);
  // Returned sorted by name.
  EXPECT_EQ(back[0].name, "attn.qkv");
  EXPECT_EQ(back[1].name, "experts");
  EXPECT_EQ(back[2].name, "layers.1.mlp");
  for (const auto& e : entries) {
    auto it =
        std::find_if(back.begin(), back.end(), [&](const auto& b) { return b.name == e.name; });
    ASSERT_NE(it, back.end());
    EXPECT_EQ(it->shape, e.shape);
    EXPECT_EQ(it->last_step, e.last_step);
    EXPECT_TRUE(same_options(it->options, e.options)) << e.name;
    EXPECT_TRUE(bitwise_equal(it->momentum, e.momentum)) << e.name;
  }
  // Only the final file remains (the temporary one was renamed).
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir_),
                          std::filesystem::directory_iterator()),
            1);
  // Overwriting replaces the file.
  write_snapshot(p, {entries[1]});
  EXPECT_EQ(read_snapshot(p).size(), 1u);
  // Empty snapshot.
  write_snapshot(p, {});
  EXPECT_TRUE(read_snapshot(p).empty());
}

TEST_F(SnapshotTest, OneStepForEveryEntryIsNamedInTheMetadata) {
  auto entries = sample_entries();
  for (auto& e : entries) e.last_step = 41;
  const auto p = path("one.safetensors");
  write_snapshot(p, entries);
  std::ifstream f(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  EXPECT_EQ(nlohmann::json::parse(bytes.substr(8, n)).at("__metadata__").at("step"), "41");
  EXPECT_EQ(common_step(entries), 41);
  // Mixed steps: no "step", and the mix described most common first.
  entries[1].last_step = 40;
  write_snapshot(p, entries);
  std::ifstream g(p, std::ios::binary);
  std::string mixed((std::istreambuf_iterator<char>(g)), std::istreambuf_iterator<char>());
  n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(mixed[i])} << (8 * i);
  EXPECT_FALSE(nlohmann::json::parse(mixed.substr(8, n)).at("__metadata__").contains("step"));
  EXPECT_EQ(common_step(entries), -2);
  EXPECT_EQ(common_step({}), -2);
  EXPECT_EQ(describe_steps(entries),
            "2 parameter(s) at step 41 ('layers.1.mlp', 'attn.qkv'), 1 at step 40 ('experts')");
}

TEST_F(SnapshotTest, WriterWritesInOrderOffTheCallersThreadAndSaysSo) {
  std::vector<std::function<void()>> posted;  // the "io thread": run by the test
  std::mutex mu;
  std::vector<std::string> outcomes;
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> off_thread{true};
  {
    SnapshotWriter w([&](std::function<void()> fn) {
      if (std::this_thread::get_id() == caller) off_thread = false;
      std::lock_guard lk(mu);
      posted.push_back(std::move(fn));
    });
    auto a = sample_entries(), b = sample_entries();
    for (auto& e : a) e.last_step = 3;
    for (auto& e : b) e.last_step = 5;
    const auto p = path("w.safetensors");
    auto note = [&](const std::string& error) { outcomes.push_back(error.empty() ? "ok" : error); };
    w.write(p, a, note);
    w.write(p, b, note);
    w.write(path("no-such-dir/x.safetensors"), a, note);
    EXPECT_GE(w.outstanding(), 2u);  // the writes count from write() on (at most one done yet)
    w.drain();
    EXPECT_EQ(w.outstanding(), 0u);
    EXPECT_EQ(w.step_on_disk(p), 5);  // the later write won
    EXPECT_EQ(w.step_on_disk(path("no-such-dir/x.safetensors")), -2);
    EXPECT_EQ(read_snapshot(p).front().last_step, 5);
  }
  EXPECT_TRUE(off_thread);
  for (auto& fn : posted) fn();
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[0], "ok");
  EXPECT_EQ(outcomes[1], "ok");
  EXPECT_NE(outcomes[2].find("no-such-dir"), std::string::npos) << outcomes[2];
}

TEST_F(SnapshotTest, AutoChoicesTravelWithTheSnapshotAndAreAdoptedOnRestore) {
  // What auto ran is stored with the momentum; a restored server adopts it (and writes it to
  // the machine's table where that has none), so it runs the same algorithm as before.
  const std::vector<NsChoiceTable::Entry> choices = {
      {"cpu test-machine threads=2", "fp32 768x3072 steps=5 restart=2",
       {NsAlgorithm::gram, "fastest within 3 %: plain 80 ms, syrk 65 ms, gram 50 ms", false, ""}},
      {"cpu test-machine threads=2", "fp32 768x768 steps=5 restart=2",
       {NsAlgorithm::syrk, "fastest within 3 %", false, ""}}};
  const auto p = path("state.safetensors");
  write_snapshot(p, sample_entries(), choices);
  std::vector<NsChoiceTable::Entry> back;
  EXPECT_EQ(read_snapshot(p, &back).size(), 3u);
  ASSERT_EQ(back.size(), 2u);
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].machine, choices[i].machine);
    EXPECT_EQ(back[i].key, choices[i].key);
    EXPECT_EQ(back[i].choice.algorithm, choices[i].choice.algorithm);
    EXPECT_EQ(back[i].choice.reason, choices[i].choice.reason);
  }
  // A file without choices (older servers) reads as none.
  write_snapshot(p, sample_entries());
  EXPECT_EQ(read_snapshot(p, &back).size(), 3u);
  EXPECT_TRUE(back.empty());

  // Adopting: the table's file gains the choices it lacks; one it holds stays, but this process
  // runs the adopted one.
  const auto table_path = path("ns-choices.json");
  {
    NsChoiceTable other(table_path);
    other.choose(choices[1].machine, choices[1].key, [] {
      return std::vector<NsMeasurement>{{NsAlgorithm::plain, 1.0}, {NsAlgorithm::syrk, 2.0}};
    });
  }
  NsChoiceTable table(table_path);
  table.adopt(choices);
  bool measured = false;
  const auto no_measure = [&] {
    measured = true;
    return std::vector<NsMeasurement>{{NsAlgorithm::plain, 1.0}};
  };
  EXPECT_EQ(table.choose(choices[0].machine, choices[0].key, no_measure).algorithm,
            NsAlgorithm::gram);
  EXPECT_EQ(table.choose(choices[1].machine, choices[1].key, no_measure).algorithm,
            NsAlgorithm::syrk);
  EXPECT_FALSE(measured);
  const auto file = read_ns_choice_file(table_path);
  ASSERT_EQ(file.size(), 2u);
  for (const auto& e : file) {
    EXPECT_EQ(e.choice.algorithm,
              e.key == choices[0].key ? NsAlgorithm::gram : NsAlgorithm::plain)
        << e.key;
  }
}

TEST_F(SnapshotTest, FileHasTheSafetensorsLayout) {
  const auto entries = sample_entries();
  const auto p = path("state.safetensors");
  write_snapshot(p, entries);
  std::ifstream f(p, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  const std::string data = bytes.substr(8 + n);
  EXPECT_EQ(data.size(), (12 + 30 + 12) * sizeof(float));
  const auto& meta = header.at("__metadata__");
  EXPECT_EQ(meta.at("format"), "muon-offload-momentum");
  EXPECT_EQ(meta.at("version"), "1");
  EXPECT_EQ(meta.at("step:layers.1.mlp"), "17");
  EXPECT_EQ(meta.at("step:experts"), "-1");
  EXPECT_TRUE(same_options(transport::options_from_json(meta.at("options:layers.1.mlp")),
                           entries[0].options));
  // Data in name order, offsets relative to the end of the header.
  uint64_t expect = 0;
  for (const char* name : {"attn.qkv", "experts", "layers.1.mlp"}) {
    const auto& t = header.at(name);
    EXPECT_EQ(t.at("dtype"), "F32");
    const auto begin = t.at("data_offsets")[0].get<uint64_t>();
    const auto end = t.at("data_offsets")[1].get<uint64_t>();
    EXPECT_EQ(begin, expect) << name;
    const auto& e = *std::find_if(entries.begin(), entries.end(),
                                  [&](const auto& x) { return x.name == name; });
    EXPECT_EQ(t.at("shape").get<std::vector<int64_t>>(), e.shape);
    ASSERT_EQ(end - begin, e.momentum.size() * sizeof(float));
    EXPECT_EQ(std::memcmp(data.data() + begin, e.momentum.data(), end - begin), 0) << name;
    expect = end;
  }
}

TEST_F(SnapshotTest, WriteErrorsNameThePath) {
  const auto p = path("missing_dir/state.safetensors");
  expect_throw_with<Error>([&] { write_snapshot(p, sample_entries()); },
                           {p + ".tmp.", "No such file or directory"});
  auto bad = sample_entries();
  bad[0].momentum.pop_back();
  expect_throw_with<InvalidArgument>([&] { write_snapshot(path("s"), bad); },
                                     {"layers.1.mlp", "needs 12 values"});
  bad = sample_entries();
  bad[1].name = bad[0].name;
  expect_throw_with<InvalidArgument>([&] { write_snapshot(path("s"), bad); }, {"duplicate"});
  EXPECT_FALSE(std::filesystem::exists(path("s")));
}

TEST_F(SnapshotTest, MissingFile) {
  const auto p = path("nope.safetensors");
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); },
                                     {p, "cannot open", "No such file or directory"});
}

TEST_F(SnapshotTest, TruncatedFile) {
  const auto p = path("state.safetensors");
  write_snapshot(p, sample_entries());
  const auto size = std::filesystem::file_size(p);
  std::filesystem::resize_file(p, size - 4);  // cut into the data
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "truncated", "past the end"});
  std::filesystem::resize_file(p, 100);  // cut into the header
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "truncated", "header of"});
  std::filesystem::resize_file(p, 5);  // cut into the length
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); },
                                     {p, "truncated", "8-byte header length"});
}

TEST_F(SnapshotTest, HeaderNotJson) {
  const auto p = path("s");
  write_raw(p, "{\"w\": {\"dtype\": ", 0);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "header is not valid JSON"});
}

TEST_F(SnapshotTest, DtypeOtherThanF32) {
  const auto p = path("s");
  auto h = valid_header();
  h["w"]["dtype"] = "F16";
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); },
                                     {p, "tensor 'w'", "dtype 'F16'", "only F32"});
}

TEST_F(SnapshotTest, OffsetsNotMatchingShape) {
  const auto p = path("s");
  auto h = valid_header();
  h["w"]["data_offsets"] = {0, 20};
  write_raw(p, h.dump(), 20);
  expect_throw_with<InvalidArgument>(
      [&] { read_snapshot(p); },
      {p, "tensor 'w'", "data_offsets [0, 20)", "do not match shape [2, 3]"});
  h["w"]["data_offsets"] = {24, 0};
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "do not match shape"});
}

TEST_F(SnapshotTest, OffsetsPastTheEnd) {
  const auto p = path("s");
  auto h = valid_header();
  h["w"]["data_offsets"] = {24, 48};  // consistent with the shape, but only 24 bytes of data
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); },
                                     {p, "tensor 'w'", "[24, 48)", "past the end"});
}

TEST_F(SnapshotTest, HolesOrTrailingBytesRefused) {
  const auto p = path("s");
  write_raw(p, valid_header().dump(), 28);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "4 bytes after"});
  auto h = valid_header();
  h["w"]["data_offsets"] = {4, 28};
  write_raw(p, h.dump(), 28);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "non-contiguous"});
}

TEST_F(SnapshotTest, MissingFormatTag) {
  const auto p = path("s");
  auto h = valid_header();
  h["__metadata__"].erase("format");
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "format tag"});
  h["__metadata__"]["format"] = "pt";
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "format tag"});
  h.erase("__metadata__");
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "format tag"});
}

TEST_F(SnapshotTest, MissingStep) {
  const auto p = path("s");
  auto h = valid_header();
  h["__metadata__"].erase("step:w");
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "tensor 'w'", "missing step"});
  h["__metadata__"]["step:w"] = "five";
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "not an integer"});
  h = valid_header();
  h["__metadata__"].erase("options:w");
  write_raw(p, h.dump(), 24);
  expect_throw_with<InvalidArgument>([&] { read_snapshot(p); }, {p, "missing options"});
  write_raw(p, valid_header().dump(), 24);
  EXPECT_EQ(read_snapshot(p).at(0).last_step, 5);
}

// ---------------------------------------------------------------------------------------------
// Scheduler

namespace {

// A backend that records the batch count of each Newton-Schulz call and runs a trivial
// per-slice map (x -> 2x); lets tests see how jobs were batched into backend calls.
class RecordingBackend final : public Backend {
 public:
  std::string_view name() const override { return "recording"; }
  Precision default_precision() const override { return Precision::fp32; }
  std::string machine_key() const override { return "recording"; }
  std::vector<int64_t> counts;  // worker thread only; read after stop()

 protected:
  void newton_schulz_batch(float* x, int64_t count, int64_t rows, int64_t cols,
                           const std::vector<NsCoefficients>&,
                           const OrthogonalizeOptions&) override {
    counts.push_back(count);
    for (int64_t i = 0; i < count * rows * cols; ++i) x[i] *= 2.0f;
  }
};

NsJob make_job(const std::string& name, MatrixShape shape, const MuonOptions& options,
               std::vector<float>& momentum, uint32_t seed) {
  NsJob j;
  j.name = name;
  j.step = 1;
  j.shape = shape;
  j.options = options;
  j.grad = random_values(static_cast<size_t>(shape.numel()), seed);
  j.momentum = momentum.data();
  return j;
}

// Collects the batches handed to on_done.
struct Collector {
  std::mutex mu;
  std::vector<std::vector<NsJob>> batches;
  void operator()(std::vector<NsJob> b) {
    std::lock_guard lock(mu);
    batches.push_back(std::move(b));
  }
};

}  // namespace

namespace {

// A scheduler over a RecordingBackend whose worker blocks in on_done of its first group until
// release(), so that what the test queues meanwhile is taken together. `names` holds each
// finished group's job names, in order.
struct HeldScheduler {
  explicit HeldScheduler(int64_t max_batch_elements = kMaxBatchElements) {
    auto backend = std::make_unique<RecordingBackend>();
    rec = backend.get();
    sched = std::make_unique<Scheduler>(
        std::move(backend),
        [this](std::vector<NsJob> batch) {
          std::vector<std::string> n;
          for (const auto& j : batch) n.push_back(j.name);
          names.push_back(n);
          if (first) {  // block the worker until the test has queued the rest
            first = false;
            entered.set_value();
            released.wait();
          }
        },
        nullptr, max_batch_elements);
  }
  void wait_entered() { entered.get_future().wait(); }
  void release() { release_promise.set_value(); }

  RecordingBackend* rec = nullptr;
  std::promise<void> entered, release_promise;
  std::shared_future<void> released = release_promise.get_future().share();
  std::vector<std::vector<std::string>> names;
  bool first = true;
  std::unique_ptr<Scheduler> sched;  // last: stopped before the rest goes
};

}  // namespace

TEST(Scheduler, QueuedJobsOfOneShapeAndOptionsRunAsOneBatch) {
  HeldScheduler held;
  Scheduler& sched = *held.sched;
  MuonOptions o;
  MuonOptions o2 = o;
  o2.momentum.mu = 0.5f;
  std::vector<std::vector<float>> mom(7, std::vector<float>(64, 0.0f));
  sched.submit(make_job("a", {1, 4, 8}, o, mom[0], 1));
  held.wait_entered();
  sched.submit(make_job("b", {1, 4, 8}, o, mom[1], 2));
  sched.submit(make_job("e", {1, 8, 4}, o, mom[2], 3));   // other shape
  sched.submit(make_job("c", {2, 4, 8}, o, mom[3], 4));   // same rows/cols, batch 2
  sched.submit(make_job("f", {1, 4, 8}, o2, mom[4], 5));  // other options
  sched.submit(make_job("d", {1, 4, 8}, o, mom[5], 6));
  EXPECT_EQ(sched.queued(), 5u);
  held.release();
  sched.stop();
  EXPECT_EQ(sched.queued(), 0u);
  const std::vector<std::vector<std::string>> expected = {{"a"}, {"b", "c", "d"}, {"e"}, {"f"}};
  EXPECT_EQ(held.names, expected);
  // One backend call for b, c, d: 1 + 2 + 1 matrices.
  EXPECT_EQ(held.rec->counts, (std::vector<int64_t>{1, 4, 1, 1}));
  sched.stop();  // idempotent
  EXPECT_THROW(sched.submit(make_job("late", {1, 4, 8}, o, mom[6], 7)), Error);
}

// A group past the batch cap (kernels/step_batch.hpp; here 96 elements, where a server's is
// 2^26) runs as several runner calls in submission order, each within the cap, and a job larger
// than the cap runs alone; on_done still gets the group once.
TEST(Scheduler, AGroupPastTheBatchCapRunsAsSeveralBatchesInOrder) {
  HeldScheduler held(96);
  Scheduler& sched = *held.sched;
  MuonOptions o;
  std::vector<std::vector<float>> mom(6, std::vector<float>(128, 0.0f));
  sched.submit(make_job("a", {1, 4, 8}, o, mom[0], 1));
  held.wait_entered();
  sched.submit(make_job("b", {1, 4, 8}, o, mom[1], 2));  // 32
  sched.submit(make_job("c", {2, 4, 8}, o, mom[2], 3));  // 64: b + c = 96, the cap
  sched.submit(make_job("d", {1, 4, 8}, o, mom[3], 4));  // would make 128: a new batch
  sched.submit(make_job("e", {4, 4, 8}, o, mom[4], 5));  // 128 > the cap: alone
  sched.submit(make_job("f", {1, 4, 8}, o, mom[5], 6));
  held.release();
  sched.stop();
  const std::vector<std::vector<std::string>> expected = {{"a"}, {"b", "c", "d", "e", "f"}};
  EXPECT_EQ(held.names, expected);
  // Calls: a; b + c (1 + 2 matrices, 96 elements); d; e alone (4 matrices); f.
  EXPECT_EQ(held.rec->counts, (std::vector<int64_t>{1, 3, 1, 4, 1}));
}

namespace {

// Runs `jobs` through a scheduler, all queued while the worker is blocked so that jobs of equal
// shape and options are batched. Returns the jobs back, in submission order.
std::vector<NsJob> run_batched(std::vector<NsJob> jobs) {
  std::promise<void> entered, release;
  auto released = release.get_future().share();
  Collector out;
  bool first = true;
  Scheduler sched(make_backend("cpu"), [&](std::vector<NsJob> batch) {
    if (first) {
      first = false;
      entered.set_value();
      released.wait();
      return;  // the blocker job
    }
    out(std::move(batch));
  });
  // A blocker of a shape no test job has.
  std::vector<float> blocker_momentum(6, 0.0f);
  sched.submit(make_job("blocker", {1, 2, 3}, MuonOptions{}, blocker_momentum, 0));
  entered.get_future().wait();
  const size_t n = jobs.size();
  for (auto& j : jobs) sched.submit(std::move(j));
  release.set_value();
  sched.stop();
  std::vector<NsJob> flat;
  for (auto& b : out.batches) {
    for (auto& j : b) flat.push_back(std::move(j));
  }
  EXPECT_EQ(flat.size(), n);
  std::stable_sort(flat.begin(), flat.end(),
                   [](const NsJob& a, const NsJob& b) { return a.step < b.step; });
  return flat;
}

}  // namespace

TEST(Scheduler, BatchedIsBitwiseEqualToUnbatched) {
  MuonOptions sum;  // sum + Nesterov, keller
  MuonOptions ema;
  ema.momentum.convention = MomentumConvention::ema;
  ema.orthogonalize.row_splits = {4, 8, 4};  // fused QKV: 16 rows
  ema.orthogonalize.algorithm = NsAlgorithm::syrk;
  MuonOptions none;
  none.momentum.convention = MomentumConvention::none;
  struct Case {
    MatrixShape shape;
    MuonOptions options;
  };
  const std::vector<Case> cases = {{{1, 16, 24}, sum}, {{2, 16, 24}, sum},  {{1, 16, 24}, ema},
                                   {{3, 16, 24}, ema}, {{1, 16, 24}, sum},  {{1, 40, 12}, sum},
                                   {{2, 40, 12}, sum}, {{1, 16, 24}, none}, {{2, 16, 24}, none}};
  auto reference = make_backend("cpu");
  std::vector<std::vector<float>> mom_batched, mom_alone;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto n = static_cast<size_t>(cases[i].shape.numel());
    mom_batched.push_back(random_values(n, 1000 + i));
    mom_alone.push_back(mom_batched.back());
  }
  for (int step = 0; step < 2; ++step) {
    std::vector<NsJob> jobs;
    for (size_t i = 0; i < cases.size(); ++i) {
      auto j = make_job("p" + std::to_string(i), cases[i].shape, cases[i].options, mom_batched[i],
                        static_cast<uint32_t>(10 * step + i));
      j.step = static_cast<int64_t>(i);  // run_batched restores submission order by step
      if (cases[i].options.momentum.convention == MomentumConvention::none) j.momentum = nullptr;
      jobs.push_back(std::move(j));
    }
    std::vector<std::vector<float>> grads;
    for (const auto& j : jobs) grads.push_back(j.grad);
    const auto done = run_batched(std::move(jobs));
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE("case " + std::to_string(i) + " step " + std::to_string(step));
      ASSERT_TRUE(done[i].error.empty()) << done[i].error;
      EXPECT_TRUE(done[i].applied);
      std::vector<float> update(grads[i].size());
      const bool none_conv = cases[i].options.momentum.convention == MomentumConvention::none;
      ASSERT_TRUE(reference->muon_update("alone", cases[i].shape, grads[i].data(),
                                         none_conv ? nullptr : mom_alone[i].data(), update.data(),
                                         cases[i].options));
      EXPECT_TRUE(bitwise_equal(done[i].update, update));
      EXPECT_TRUE(bitwise_equal(mom_batched[i], mom_alone[i]));
    }
  }
}

TEST(Scheduler, SideBySideBatchesAreBitwiseTheInProcessReferenceOneAtATime) {
  // A block shape that auto runs side by side (one BLAS thread per matrix, 2 at once): the
  // server's batch of 3 gives each parameter the bits the in-process reference computes for it
  // alone (Backend::muon_update per parameter, as the client's in-process path calls it), at the
  // same 2 OpenBLAS threads, where one-matrix-on-two-threads would give other bits.
  ScopedBlasThreads two(2);
  auto reference = make_backend("cpu");
  MuonOptions o;  // auto
  o.orthogonalize.steps = 3;  // a key no other test of this file uses
  NsChoiceTable::process().adopt({{reference->machine_key(),
                                   ns_choice_key(Precision::fp32, 96, 256, 3, kDefaultGramRestart),
                                   {NsAlgorithm::gram, "test", true, "test: side by side"}}});
  const MatrixShape shape{1, 96, 256};
  std::vector<std::vector<float>> mom, mom_alone;
  for (int i = 0; i < 3; ++i) {
    mom.push_back(random_values(static_cast<size_t>(shape.numel()), 300 + i));
    mom_alone.push_back(mom.back());
  }
  std::vector<NsJob> jobs;
  for (int i = 0; i < 3; ++i) {
    jobs.push_back(make_job("s" + std::to_string(i), shape, o, mom[i], 310 + i));
    jobs.back().step = i;
  }
  std::vector<std::vector<float>> grads;
  for (const auto& j : jobs) grads.push_back(j.grad);
  const auto done = run_batched(std::move(jobs));
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(done[i].error.empty()) << done[i].error;
    std::vector<float> update(grads[i].size());
    ASSERT_TRUE(reference->muon_update("alone", shape, grads[i].data(), mom_alone[i].data(),
                                       update.data(), o));
    EXPECT_TRUE(bitwise_equal(done[i].update, update)) << i;
    EXPECT_TRUE(bitwise_equal(mom[i], mom_alone[i])) << i;
  }
}

TEST(Scheduler, OneNonFiniteJobInABatchFailsAlone) {
  auto reference = make_backend("cpu");
  for (const auto policy : {NonFinitePolicy::error, NonFinitePolicy::skip}) {
    SCOPED_TRACE(policy == NonFinitePolicy::error ? "error" : "skip");
    MuonOptions o;
    o.orthogonalize.nonfinite = policy;
    const MatrixShape shape{1, 8, 12};
    std::vector<std::vector<float>> mom(3), mom_before(3);
    std::vector<NsJob> jobs;
    for (int i = 0; i < 3; ++i) {
      mom[i] = random_values(96, 50 + i);
      mom_before[i] = mom[i];
      jobs.push_back(make_job("p" + std::to_string(i), shape, o, mom[i], 60 + i));
      jobs.back().step = i;
    }
    jobs[1].grad[17] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::vector<float>> grads;
    for (const auto& j : jobs) grads.push_back(j.grad);
    const auto done = run_batched(std::move(jobs));
    // The bad job: refused (error) or a zero update (skip); its momentum untouched either way.
    EXPECT_TRUE(bitwise_equal(mom[1], mom_before[1]));
    EXPECT_FALSE(done[1].applied);
    if (policy == NonFinitePolicy::error) {
      EXPECT_EQ(done[1].error_code, ErrorCode::non_finite);
      EXPECT_CONTAINS(done[1].error, "'p1'");
      EXPECT_TRUE(done[1].update.empty());
    } else {
      EXPECT_TRUE(done[1].error.empty());
      EXPECT_EQ(done[1].update, std::vector<float>(96, 0.0f));
    }
    // The others: applied, bitwise what they give alone.
    for (int i : {0, 2}) {
      EXPECT_TRUE(done[i].error.empty()) << done[i].error;
      EXPECT_TRUE(done[i].applied);
      std::vector<float> update(96);
      reference->muon_update("alone", shape, grads[i].data(), mom_before[i].data(), update.data(),
                             o);
      EXPECT_TRUE(bitwise_equal(done[i].update, update));
      EXPECT_TRUE(bitwise_equal(mom[i], mom_before[i]));  // mom_before stepped by the reference
    }
  }
}

TEST(Scheduler, BackendRefusalLeavesMomentumUntouched) {
  // bf16 products are CUDA-only: the CPU backend throws after the momentum step, inside
  // Newton-Schulz. The batched call fails, each job is retried alone and refused.
  MuonOptions bf16;
  bf16.orthogonalize.precision = Precision::bf16;
  const MatrixShape shape{1, 4, 6};
  std::vector<std::vector<float>> mom(2, random_values(24, 9)), before = mom;
  std::vector<NsJob> jobs;
  for (int i = 0; i < 2; ++i) {
    jobs.push_back(make_job("q" + std::to_string(i), shape, bf16, mom[i], 70 + i));
    jobs.back().step = i;
  }
  // A wrong gradient size and a missing momentum, refused without a backend call.
  std::vector<float> m3(24, 0.0f), m4(24, 0.0f);
  jobs.push_back(make_job("short", shape, MuonOptions{}, m3, 80));
  jobs.back().grad.resize(23);
  jobs.back().step = 2;
  jobs.push_back(make_job("nomom", shape, MuonOptions{}, m4, 81));
  jobs.back().momentum = nullptr;
  jobs.back().step = 3;
  const auto done = run_batched(std::move(jobs));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(done[i].error_code, ErrorCode::bad_request) << done[i].error;
    EXPECT_CONTAINS(done[i].error, "bf16");
    EXPECT_FALSE(done[i].applied);
    EXPECT_TRUE(bitwise_equal(mom[i], before[i]));
  }
  EXPECT_EQ(done[2].error_code, ErrorCode::bad_request);
  EXPECT_CONTAINS(done[2].error, "'short'");
  EXPECT_EQ(m3, std::vector<float>(24, 0.0f));
  EXPECT_EQ(done[3].error_code, ErrorCode::bad_request);
  EXPECT_CONTAINS(done[3].error, "'nomom'");
}

TEST(Scheduler, StopDrainsTheQueue) {
  std::atomic<int> finished{0};
  std::vector<std::vector<float>> mom(20, std::vector<float>(32, 0.0f));
  {
    Scheduler sched(make_backend("cpu"), [&](std::vector<NsJob> batch) {
      for (const auto& j : batch) {
        EXPECT_TRUE(j.error.empty()) << j.error;
        finished += 1;
      }
    });
    for (int i = 0; i < 20; ++i) {
      sched.submit(make_job("p" + std::to_string(i), {1, 4, 8}, MuonOptions{}, mom[i], i));
    }
  }  // the destructor stops after the submitted jobs
  EXPECT_EQ(finished.load(), 20);
}
