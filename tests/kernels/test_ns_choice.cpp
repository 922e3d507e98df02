// NsAlgorithm::automatic's choice logic: fixed times in, a fixed choice out (ties, exactness
// exclusions, bad input), and the table shared through its file (one measurement, every reader
// the same choice).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "kernels/ns_choice.hpp"

using namespace muon;

namespace {

std::vector<NsMeasurement> times(double plain, double syrk, double gram) {
  return {{NsAlgorithm::plain, plain}, {NsAlgorithm::syrk, syrk}, {NsAlgorithm::gram, gram}};
}

// A fresh file path under the test's temporary directory, removed with its lock at the end.
struct TempTable {
  std::string path = (std::filesystem::temp_directory_path() /
                      ("ns-choices-test-" + std::to_string(::getpid()) + "-" +
                       ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".json"))
                         .string();
  ~TempTable() {
    std::filesystem::remove(path);
    std::filesystem::remove(path + ".lock");
  }
};

}  // namespace

TEST(NsChoice, TheFastestCandidateIsChosen) {
  EXPECT_EQ(choose_ns_algorithm(times(0.010, 0.008, 0.006)).algorithm, NsAlgorithm::gram);
  EXPECT_EQ(choose_ns_algorithm(times(0.010, 0.008, 0.009)).algorithm, NsAlgorithm::syrk);
  EXPECT_EQ(choose_ns_algorithm(times(0.007, 0.008, 0.009)).algorithm, NsAlgorithm::plain);
  const auto c = choose_ns_algorithm(times(0.010, 0.008, 0.006));
  EXPECT_NE(c.reason.find("plain 10 ms, syrk 8 ms, gram 6 ms"), std::string::npos) << c.reason;
  // A second and more in seconds.
  const auto slow = choose_ns_algorithm(times(2.61, 2.49, 0.5));
  EXPECT_NE(slow.reason.find("plain 2.61 s, syrk 2.49 s, gram 500 ms"), std::string::npos)
      << slow.reason;
}

TEST(NsChoice, TiesWithinThreePercentGoToTheEarliestCandidate) {
  // Exactly equal: plain.
  EXPECT_EQ(choose_ns_algorithm(times(0.010, 0.010, 0.010)).algorithm, NsAlgorithm::plain);
  // gram fastest (9.8), syrk within 3 % of it (10.0 <= 10.094), plain not (10.5): syrk.
  EXPECT_EQ(choose_ns_algorithm(times(0.0105, 0.0100, 0.0098)).algorithm, NsAlgorithm::syrk);
  // 3 % is the line: 10.29 vs 10.0 ties, 10.31 does not.
  EXPECT_EQ(choose_ns_algorithm(times(0.01029, 0.0100, 0.02)).algorithm, NsAlgorithm::plain);
  EXPECT_EQ(choose_ns_algorithm(times(0.01031, 0.0100, 0.02)).algorithm, NsAlgorithm::syrk);
}

TEST(NsChoice, OnlyTheCandidatesMeetingTheExactnessContractAreMeasured) {
  using V = std::vector<NsAlgorithm>;
  const auto plain = NsAlgorithm::plain, syrk = NsAlgorithm::syrk, gram = NsAlgorithm::gram;
  EXPECT_EQ(ns_auto_candidates("cpu", Precision::fp32, 2), (V{plain, syrk, gram}));
  EXPECT_EQ(ns_auto_candidates("cpu", Precision::fp32, 1), (V{plain, syrk, gram}));
  // gram without a restart, or with runs of 3+ steps, is outside the 2x bound: excluded.
  EXPECT_EQ(ns_auto_candidates("cpu", Precision::fp32, 0), (V{plain, syrk}));
  EXPECT_EQ(ns_auto_candidates("cpu", Precision::fp32, 3), (V{plain, syrk}));
  // torch_bf16 rounds torch's three products: plain only.
  EXPECT_EQ(ns_auto_candidates("cpu", Precision::torch_bf16, 2), (V{plain}));
  // CUDA: syrk is the plain GEMMs there, gram not measured on a GPU yet.
  EXPECT_EQ(ns_auto_candidates("cuda", Precision::bf16, 2), (V{plain}));
  EXPECT_EQ(ns_auto_candidates("cuda", Precision::fp32, 2), (V{plain}));
  // One candidate: chosen without measuring, and the reason says so.
  const std::vector<NsMeasurement> one{{NsAlgorithm::plain, 1.0}};
  const auto c = choose_ns_algorithm(one);
  EXPECT_EQ(c.algorithm, NsAlgorithm::plain);
  EXPECT_NE(c.reason.find("only candidate"), std::string::npos) << c.reason;
}

TEST(NsChoice, BadTimesAreAClearError) {
  EXPECT_THROW(choose_ns_algorithm({}), InvalidArgument);
  EXPECT_THROW(choose_ns_algorithm(times(0.01, -1.0, 0.01)), InvalidArgument);
  EXPECT_THROW(choose_ns_algorithm(times(0.01, 0.01, NAN)), InvalidArgument);
}

TEST(NsChoice, PairedTimesFollowTheRatiosOfRunsBackToBack) {
  // True times plain 100, syrk 80, gram 70 ms; each round's load multiplies all three (x1 to x3).
  // By least times per candidate, a quiet round for gram and loaded ones for syrk can invert
  // them; the paired estimate keeps each round's ratios.
  const std::vector<std::vector<double>> steady = {
      {0.100, 0.080, 0.070}, {0.200, 0.160, 0.140}, {0.150, 0.120, 0.105}, {0.300, 0.240, 0.210},
      {0.120, 0.096, 0.084}};
  const auto t = ns_paired_times(steady);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_NEAR(t[0], 0.100, 1e-12);
  EXPECT_NEAR(t[1], 0.080, 1e-12);
  EXPECT_NEAR(t[2], 0.070, 1e-12);
  // Load changing inside rounds: syrk caught once in a quiet moment (round 2: 0.060), gram once
  // in a loaded one (round 4: 0.200). Least times would say syrk 60 < gram 70 ms; the median
  // ratio says syrk 80, gram 70 ms: gram.
  const std::vector<std::vector<double>> noisy = {
      {0.100, 0.080, 0.070}, {0.200, 0.160, 0.140}, {0.150, 0.060, 0.105}, {0.300, 0.240, 0.210},
      {0.120, 0.096, 0.200}};
  const auto u = ns_paired_times(noisy);
  EXPECT_NEAR(u[1], 0.080, 1e-12);
  EXPECT_NEAR(u[2], 0.070, 1e-12);
  const std::vector<NsMeasurement> chosen = {
      {NsAlgorithm::plain, u[0]}, {NsAlgorithm::syrk, u[1]}, {NsAlgorithm::gram, u[2]}};
  EXPECT_EQ(choose_ns_algorithm(chosen).algorithm, NsAlgorithm::gram);
  // An even count of rounds: the mean of the two middle ratios.
  EXPECT_NEAR(ns_paired_times({{0.1, 0.08}, {0.1, 0.06}})[1], 0.07, 1e-12);
  EXPECT_THROW(ns_paired_times({}), InvalidArgument);
  EXPECT_THROW(ns_paired_times({{0.1, 0.2}, {0.1}}), InvalidArgument);
  EXPECT_THROW(ns_paired_times({{0.1, 0.0}}), InvalidArgument);
  EXPECT_THROW(ns_paired_times({{0.1, NAN}}), InvalidArgument);
}

TEST(NsChoiceTable, MeasuresOncePerKeyInMemory) {
  NsChoiceTable table("");
  int calls = 0;
  auto measure = [&] {
    ++calls;
    return times(0.010, 0.008, 0.009);
  };
  const std::string key = ns_choice_key(Precision::fp32, 768, 3072, 5, 2);
  EXPECT_EQ(key, "fp32 768x3072 steps=5 restart=2");
  EXPECT_EQ(table.choose("m", key, measure).algorithm, NsAlgorithm::syrk);
  EXPECT_EQ(table.choose("m", key, measure).algorithm, NsAlgorithm::syrk);
  EXPECT_EQ(calls, 1);
  // Another machine key is another measurement.
  EXPECT_EQ(table.choose("other", key, measure).algorithm, NsAlgorithm::syrk);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(table.entries().size(), 2u);
}

TEST(NsChoiceTable, TheFileSharesTheFirstMeasurementWithEveryLaterReader) {
  TempTable tmp;
  const std::string key = ns_choice_key(Precision::fp32, 768, 2304, 5, 2);
  {
    NsChoiceTable first(tmp.path);
    EXPECT_EQ(first.choose("m", key, [] { return times(0.010, 0.009, 0.006); }).algorithm,
              NsAlgorithm::gram);
  }
  // A second table on the file (another process, a restarted server) reads the choice and
  // does not measure, even where its own measurement would have chosen otherwise.
  NsChoiceTable second(tmp.path);
  bool measured = false;
  const auto c = second.choose("m", key, [&] {
    measured = true;
    return times(0.001, 0.009, 0.006);
  });
  EXPECT_FALSE(measured);
  EXPECT_EQ(c.algorithm, NsAlgorithm::gram);
  EXPECT_NE(c.reason.find("gram 6 ms"), std::string::npos) << c.reason;
  const auto listed = read_ns_choice_file(tmp.path);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].machine, "m");
  EXPECT_EQ(listed[0].key, key);
  EXPECT_EQ(listed[0].choice.algorithm, NsAlgorithm::gram);
  EXPECT_TRUE(read_ns_choice_file(tmp.path + ".absent").empty());
}

TEST(NsChoiceTable, AMalformedFileIsAnErrorNamingIt) {
  TempTable tmp;
  std::ofstream(tmp.path) << "not json";
  NsChoiceTable table(tmp.path);
  try {
    table.choose("m", "k", [] { return times(0.01, 0.01, 0.01); });
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(tmp.path), std::string::npos) << e.what();
  }
  std::ofstream(tmp.path, std::ios::trunc) << R"({"machines": {"m": {"k": {"algorithm": "auto"}}}})";
  EXPECT_THROW(read_ns_choice_file(tmp.path), InvalidArgument);
}

TEST(NsChoiceTable, ChoicesRoundTripAsJsonAndBadTextIsRefused) {
  const std::vector<NsChoiceTable::Entry> choices = {
      {"m1", "fp32 8x16 steps=5 restart=2", {NsAlgorithm::syrk, "why", true, "batch why"}},
      {"m2", "fp32 4x4 steps=5 restart=2", {NsAlgorithm::gram, "", false, ""}}};
  const auto back = ns_choices_from_json(ns_choices_to_json(choices));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].machine, "m1");
  EXPECT_EQ(back[0].choice.algorithm, NsAlgorithm::syrk);
  EXPECT_EQ(back[0].choice.reason, "why");
  EXPECT_TRUE(back[0].choice.side_by_side);
  EXPECT_EQ(back[0].choice.batch_reason, "batch why");
  EXPECT_EQ(back[1].key, "fp32 4x4 steps=5 restart=2");
  EXPECT_EQ(back[1].choice.algorithm, NsAlgorithm::gram);
  EXPECT_FALSE(back[1].choice.side_by_side);
  // A snapshot from before batching: one at a time.
  const auto old = ns_choices_from_json(R"([{"machine": "m", "key": "k", "algorithm": "syrk"}])");
  ASSERT_EQ(old.size(), 1u);
  EXPECT_FALSE(old[0].choice.side_by_side);
  EXPECT_THROW(
      ns_choices_from_json(R"([{"machine": "m", "key": "k", "algorithm": "syrk", "side_by_side": 1}])"),
      InvalidArgument);
  EXPECT_THROW(ns_choices_from_json("{"), InvalidArgument);
  EXPECT_THROW(ns_choices_from_json(R"([{"machine": "m"}])"), InvalidArgument);
  EXPECT_THROW(ns_choices_from_json(R"([{"machine": "m", "key": "k", "algorithm": "fast"}])"),
               InvalidArgument);
}

TEST(NsChoiceTable, AMissingFolderIsMadeAndAnUnwritableOneIsAClearError) {
  // A fresh machine has no ~/.cache/muon-offload yet: the table makes its folder.
  TempTable tmp;
  const auto dir = std::filesystem::path(tmp.path).replace_extension("") / "nested";
  const std::string path = (dir / "ns-choices.json").string();
  {
    NsChoiceTable table(path);
    EXPECT_EQ(table.choose("m", "k", [] { return times(0.01, 0.02, 0.03); }).algorithm,
              NsAlgorithm::plain);
  }
  EXPECT_EQ(read_ns_choice_file(path).size(), 1u);
  std::filesystem::remove_all(dir.parent_path());
  // A folder that cannot be made (under a regular file): the message names the file and says
  // what to do instead.
  std::ofstream(tmp.path) << "x";
  NsChoiceTable bad(tmp.path + "/sub/ns-choices.json");
  try {
    bad.choose("m", "k", [] { return times(0.01, 0.02, 0.03); });
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("MUON_OFFLOAD_NS_TABLE"), std::string::npos) << e.what();
  }
}

TEST(NsChoice, SideBySideOnlyWhenItWinsByMoreThanThreePercent) {
  NsChoice c;
  choose_ns_batching({2, 0.010, 0.0096, 0.005, 0.005}, c);  // 4 % faster: side by side
  EXPECT_TRUE(c.side_by_side);
  EXPECT_NE(c.batch_reason.find("side by side: 2 matrices side by side (one BLAS thread each) "
                                "9.6 ms, one at a time on 2 threads 10 ms; a lone one on 1 "
                                "thread 5 ms, on 2 5 ms"),
            std::string::npos)
      << c.batch_reason;
  choose_ns_batching({2, 0.010, 0.0098, 0.005, 0.005}, c);  // 2 %: a tie keeps one at a time
  EXPECT_FALSE(c.side_by_side);
  choose_ns_batching({2, 0.010, 0.012, 0.005, 0.005}, c);
  EXPECT_FALSE(c.side_by_side);
  // Batches gain, but a lone matrix would run 4 % slower on one thread: one at a time.
  choose_ns_batching({2, 0.010, 0.008, 0.005, 0.0052}, c);
  EXPECT_FALSE(c.side_by_side);
  choose_ns_batching({2, 0.010, 0.008, 0.005, 0.00514}, c);  // 2.8 %: within
  EXPECT_TRUE(c.side_by_side);
  EXPECT_THROW(choose_ns_batching({1, 0.01, 0.01, 0.01, 0.01}, c), InvalidArgument);
  EXPECT_THROW(choose_ns_batching({2, 0.01, 0.0, 0.01, 0.01}, c), InvalidArgument);
  EXPECT_THROW(choose_ns_batching({2, NAN, 0.01, 0.01, 0.01}, c), InvalidArgument);
  EXPECT_THROW(choose_ns_batching({2, 0.01, 0.01, 0.01, 0.0}, c), InvalidArgument);
}

TEST(NsChoice, ABusyCalibrationKeepsOneAtATime) {
  // The times of a side-by-side win, but its threads ran on 1.2 of 2 cores: a loaded machine,
  // where a lone matrix gains nothing from threads it cannot run. Kept in the table, side by
  // side would halve a lone matrix's threads once the cores are free.
  NsChoice c;
  choose_ns_batching({2, 0.010, 0.008, 0.005, 0.005, 1.2}, c);
  EXPECT_FALSE(c.side_by_side);
  EXPECT_NE(c.batch_reason.find("got 1.20 of 2 cores"), std::string::npos) << c.batch_reason;
  choose_ns_batching({2, 0.010, 0.008, 0.005, 0.005, 1.69}, c);  // below 0.85 x 2
  EXPECT_FALSE(c.side_by_side);
  choose_ns_batching({2, 0.010, 0.008, 0.005, 0.005, 1.71}, c);  // free enough: judged
  EXPECT_TRUE(c.side_by_side);
  choose_ns_batching({2, 0.010, 0.008, 0.005, 0.005, 0.0}, c);  // not measured: judged
  EXPECT_TRUE(c.side_by_side);
  EXPECT_THROW(choose_ns_batching({2, 0.01, 0.008, 0.005, 0.005, NAN}, c), InvalidArgument);
  EXPECT_THROW(choose_ns_batching({2, 0.01, 0.008, 0.005, 0.005, -1.0}, c), InvalidArgument);
}

TEST(NsChoiceTable, BatchingIsMeasuredOnceForTheChosenAlgorithmAndKeptInTheFile) {
  TempTable tmp;
  const std::string key = ns_choice_key(Precision::fp32, 64, 256, 5, 2);
  std::vector<NsAlgorithm> asked;
  auto batch = [&](NsAlgorithm a, std::string&) -> std::optional<NsBatchMeasurement> {
    asked.push_back(a);
    return NsBatchMeasurement{2, 0.010, 0.008, 0.005, 0.005};
  };
  {
    NsChoiceTable first(tmp.path);
    const auto c = first.choose("m", key, [] { return times(0.010, 0.008, 0.009); }, batch);
    EXPECT_EQ(c.algorithm, NsAlgorithm::syrk);
    EXPECT_TRUE(c.side_by_side);
    first.choose("m", key, [] { return times(0.010, 0.008, 0.009); }, batch);
  }
  EXPECT_EQ(asked, std::vector<NsAlgorithm>{NsAlgorithm::syrk});  // once, for the choice
  NsChoiceTable second(tmp.path);
  const auto c = second.choose("m", key, [] { return times(0.001, 0.008, 0.009); }, batch);
  EXPECT_EQ(asked.size(), 1u);
  EXPECT_TRUE(c.side_by_side);
  EXPECT_NE(c.batch_reason.find("8 ms"), std::string::npos) << c.batch_reason;
  // Nothing to batch: one at a time, and the reason says why.
  auto none = [](NsAlgorithm, std::string& why) -> std::optional<NsBatchMeasurement> {
    why = "one BLAS thread here";
    return std::nullopt;
  };
  const auto d = second.choose("m", "other", [] { return times(0.01, 0.02, 0.03); }, none);
  EXPECT_FALSE(d.side_by_side);
  EXPECT_EQ(d.batch_reason, "one at a time: one BLAS thread here");
  // An entry from before batching reads as one at a time.
  std::ofstream(tmp.path, std::ios::trunc)
      << R"({"version": 1, "machines": {"m": {"k": {"algorithm": "gram", "reason": "r"}}}})";
  const auto listed = read_ns_choice_file(tmp.path);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].choice.side_by_side);
}

TEST(NsChoice, HeavyBlocksFollowTheFlopModel) {
  // Per run of L gram steps: 3 m^2 n + (7 L - 6) m^3; runs of 2 over 5 steps are 2, 2, 1.
  const double m3 = 64.0 * 64 * 64;
  EXPECT_DOUBLE_EQ(ns_model_flops(NsAlgorithm::plain, 64, 256, 5, 2), 5 * (16 + 2) * m3);
  EXPECT_DOUBLE_EQ(ns_model_flops(NsAlgorithm::syrk, 64, 256, 5, 2), 5 * (12 + 1) * m3);
  EXPECT_DOUBLE_EQ(ns_model_flops(NsAlgorithm::gram, 64, 256, 5, 2), (36 + 8 + 8 + 1) * m3);
  EXPECT_DOUBLE_EQ(ns_model_flops(NsAlgorithm::gram, 64, 256, 5, 0), (12 + 29) * m3);
  auto modeled = [](int64_t m, int64_t n) {
    std::vector<NsMeasurement> v;
    for (auto a : {NsAlgorithm::plain, NsAlgorithm::syrk, NsAlgorithm::gram}) {
      v.push_back({a, ns_model_flops(a, m, n, 5, 2), true});
    }
    return choose_ns_algorithm(v);
  };
  // What the timings chose on these shapes (bench/README.md): syrk square, gram wide.
  EXPECT_EQ(modeled(4096, 4096).algorithm, NsAlgorithm::syrk);
  const auto wide = modeled(4096, 14336);
  EXPECT_EQ(wide.algorithm, NsAlgorithm::gram);
  EXPECT_NE(wide.reason.find("flop model"), std::string::npos) << wide.reason;
  EXPECT_NE(wide.reason.find("GFLOP"), std::string::npos) << wide.reason;
  // Which blocks are heavy: 4096 x 4096 is, GPT-2 small's and 1024 x 4096 are not.
  auto nominal = [](double m, double n) { return 5 * (4 * m * m * n + 2 * m * m * m); };
  EXPECT_GT(nominal(4096, 4096), kNsTimedFlops);
  EXPECT_LT(nominal(1024, 4096), kNsTimedFlops);
  EXPECT_LT(nominal(768, 3072), kNsTimedFlops);
}
