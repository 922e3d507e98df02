// NsAlgorithm::automatic's choice logic: fixed times in, a fixed choice out (ties, exactness
// exclusions, bad input), and the table shared through its file (one measurement, every reader
// the same choice).
#include <gtest/gtest.h>
#include <unistd.h>

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
      {"m1", "fp32 8x16 steps=5 restart=2", {NsAlgorithm::syrk, "why"}},
      {"m2", "fp32 4x4 steps=5 restart=2", {NsAlgorithm::gram, ""}}};
  const auto back = ns_choices_from_json(ns_choices_to_json(choices));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0].machine, "m1");
  EXPECT_EQ(back[0].choice.algorithm, NsAlgorithm::syrk);
  EXPECT_EQ(back[0].choice.reason, "why");
  EXPECT_EQ(back[1].key, "fp32 4x4 steps=5 restart=2");
  EXPECT_EQ(back[1].choice.algorithm, NsAlgorithm::gram);
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
