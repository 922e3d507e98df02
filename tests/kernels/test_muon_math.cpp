// muon_math, the BLAS-free and CUDA-free definitions everything else shares: the options' field
// table (wire codec, user overrides, command-line text, schema), element ranges, bf16 spans and
// the error codes. This test links muon_math alone: it also proves the target needs no BLAS.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "core/error.hpp"
#include "core/error_code.hpp"
#include "kernels/bf16.hpp"
#include "kernels/muon_option_fields.hpp"
#include "kernels/range_set.hpp"

using namespace muon;
using json = nlohmann::json;

namespace {

// Options with every field away from its default.
MuonOptions unusual() {
  MuonOptions o;
  o.momentum.convention = MomentumConvention::ema;
  o.momentum.mu = 0.9f;
  o.momentum.nesterov = false;
  o.orthogonalize.schedule = "polar_express";
  o.orthogonalize.steps = 8;
  o.orthogonalize.coefficients = {3.0, -4.5, 2.0};
  o.orthogonalize.eps = 1e-6f;
  o.orthogonalize.eps_mode = EpsMode::clamp;
  o.orthogonalize.scale_rule = ScaleRule::match_adamw;
  o.orthogonalize.extra_scale = 0.5;
  o.orthogonalize.row_splits = {4, 2, 2};
  o.orthogonalize.algorithm = NsAlgorithm::gram;
  o.orthogonalize.gram_restart = 1;
  o.orthogonalize.precision = Precision::bf16;
  o.orthogonalize.nonfinite = NonFinitePolicy::skip;
  return o;
}

template <class F>
std::string invalid_message(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.message();
  }
  ADD_FAILURE() << "expected InvalidArgument";
  return "";
}

}  // namespace

TEST(OptionFields, EveryFieldRoundTripsAndDiffersFromItsDefault) {
  const auto fields = muon_option_fields();
  ASSERT_EQ(fields.size(), 15u);
  const json def = options_to_json_object(MuonOptions{});
  const json odd = options_to_json_object(unusual());
  std::set<std::string> names;
  for (const auto& f : fields) {
    names.insert(std::string(f.name));
    EXPECT_NE(def.at(std::string(f.name)), odd.at(std::string(f.name))) << f.name;
    EXPECT_EQ(find_option_field(f.name), &f);
  }
  EXPECT_EQ(names.size(), fields.size());
  EXPECT_EQ(def.size(), fields.size());
  // Every field read back gives the same object, bit for bit of the floats.
  const auto back = options_from_json_object(odd, OptionKeys::all_required);
  EXPECT_EQ(options_to_json_object(back), odd);
  EXPECT_EQ(back.momentum.mu, 0.9f);
  EXPECT_EQ(back.orthogonalize.eps, 1e-6f);
  EXPECT_EQ(back.orthogonalize.row_splits, (std::vector<int64_t>{4, 2, 2}));
  EXPECT_EQ(back.orthogonalize.precision, Precision::bf16);
}

TEST(OptionFields, TheWireRequiresEveryFieldAndIgnoresUnknownKeys) {
  json j = options_to_json_object(unusual());
  j["added_by_a_newer_peer"] = 1;
  EXPECT_EQ(options_from_json_object(j, OptionKeys::all_required).orthogonalize.steps, 8);
  // gram_restart came later: a peer without it restarts every kDefaultGramRestart steps.
  j.erase("gram_restart");
  EXPECT_EQ(options_from_json_object(j, OptionKeys::all_required).orthogonalize.gram_restart,
            kDefaultGramRestart);
  // coefficients came later: a peer without it runs the schedule.
  j.erase("coefficients");
  EXPECT_TRUE(
      options_from_json_object(j, OptionKeys::all_required).orthogonalize.coefficients.empty());
  j.erase("eps_mode");
  EXPECT_EQ(invalid_message([&] { options_from_json_object(j, OptionKeys::all_required); }),
            "missing field 'eps_mode'");
}

TEST(OptionFields, OverridesKeepDefaultsAndRefuseUnknownKeys) {
  const auto o = options_from_json_object(json{{"mu", 0.5}, {"schedule", "you"}},
                                          OptionKeys::overrides);
  EXPECT_EQ(o.momentum.mu, 0.5f);
  EXPECT_EQ(o.orthogonalize.schedule, "you");
  EXPECT_EQ(o.orthogonalize.steps, MuonOptions{}.orthogonalize.steps);
  const auto msg =
      invalid_message([] { options_from_json_object(json{{"lr", 1}}, OptionKeys::overrides); });
  EXPECT_NE(msg.find("unknown option 'lr'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("momentum, mu, nesterov, schedule"), std::string::npos) << msg;
  EXPECT_EQ(invalid_message([] { options_from_json_object(json::array(), OptionKeys::overrides); }),
            "options must be a JSON object");
}

TEST(OptionFields, BadValuesNameTheFieldAndWhatIsAccepted) {
  auto with = [](const char* key, json v) {
    return [key, v] { options_from_json_object(json{{key, v}}, OptionKeys::overrides); };
  };
  EXPECT_EQ(invalid_message(with("mu", "high")), "field 'mu' must be a number");
  EXPECT_EQ(invalid_message(with("mu", 1e39)), "field 'mu' = 1e+39 is outside the range of a float");
  EXPECT_EQ(invalid_message(with("steps", 101)), "field 'steps' = 101 is outside [0, 100]");
  EXPECT_EQ(invalid_message(with("steps", 2.5)), "field 'steps' must be an integer");
  EXPECT_EQ(invalid_message(with("nesterov", 1)), "field 'nesterov' must be true or false");
  EXPECT_EQ(invalid_message(with("row_splits", json{1, "a"})), "field 'row_splits' must hold integers");
  const auto scale = invalid_message(with("scale", "spectral"));
  EXPECT_EQ(scale.rfind("field 'scale': unknown scale rule 'spectral'", 0), 0u) << scale;
  EXPECT_EQ(invalid_message(with("eps_mode", "mul")),
            "field 'eps_mode': unknown eps mode 'mul' (known: scale_invariant, add, clamp)");
  EXPECT_EQ(invalid_message(with("schedule", std::string(65, 'x'))),
            "field 'schedule' is longer than 64");
  // "client" is the alias of client-held momentum; the canonical name goes back out.
  EXPECT_EQ(options_to_json_object(
                options_from_json_object(json{{"momentum", "client"}}, OptionKeys::overrides))
                .at("momentum"),
            "none");
}

TEST(OptionFields, CommandLineTextIsParsedInFull) {
  MuonOptions o;
  set_option_from_text(o, *find_option_field("steps"), "7");
  set_option_from_text(o, *find_option_field("eps"), "1e-9");
  set_option_from_text(o, *find_option_field("row_splits"), "1024,256,256");
  set_option_from_text(o, *find_option_field("nesterov"), "false");
  set_option_from_text(o, *find_option_field("precision"), "fp32");
  set_option_from_text(o, *find_option_field("coefficients"), "3.4445,-4.775,2.0315");
  EXPECT_EQ(o.orthogonalize.coefficients, (std::vector<double>{3.4445, -4.775, 2.0315}));
  EXPECT_EQ(invalid_message(
                [&] { set_option_from_text(o, *find_option_field("coefficients"), "3,x,2"); }),
            "field 'coefficients' must be a number, got 'x'");
  EXPECT_EQ(o.orthogonalize.steps, 7);
  EXPECT_EQ(o.orthogonalize.eps, 1e-9f);
  EXPECT_EQ(o.orthogonalize.row_splits, (std::vector<int64_t>{1024, 256, 256}));
  EXPECT_FALSE(o.momentum.nesterov);
  EXPECT_EQ(o.orthogonalize.precision, Precision::fp32);
  EXPECT_EQ(invalid_message([&] { set_option_from_text(o, *find_option_field("steps"), "abc"); }),
            "field 'steps' must be an integer, got 'abc'");
  EXPECT_EQ(invalid_message([&] { set_option_from_text(o, *find_option_field("steps"), "3x"); }),
            "field 'steps' must be an integer, got '3x'");
  EXPECT_EQ(invalid_message([&] { set_option_from_text(o, *find_option_field("eps"), "1e-9q"); }),
            "field 'eps' must be a number, got '1e-9q'");
  for (const auto& f : muon_option_fields()) {  // the defaults' text reads back as the defaults
    MuonOptions d;
    if (f.type != OptionType::integer_list && f.type != OptionType::number_list)
      set_option_from_text(d, f, option_default_text(f));
    EXPECT_EQ(f.get(d), f.get(MuonOptions{})) << f.name;
  }
}

TEST(OptionFields, SchemaListsEveryFieldWithDefaultChoicesAndFlag) {
  const json schema = json::parse(options_schema_json());
  ASSERT_TRUE(schema.is_array());
  ASSERT_EQ(schema.size(), muon_option_fields().size());
  const MuonOptions def;
  for (size_t i = 0; i < schema.size(); ++i) {
    const auto& f = muon_option_fields()[i];
    const auto& s = schema[i];
    EXPECT_EQ(s.at("name"), f.name);
    EXPECT_EQ(s.at("type"), option_type_name(f.type));
    EXPECT_EQ(s.at("default"), f.get(def));
    EXPECT_FALSE(s.at("doc").get<std::string>().empty()) << f.name;
  }
  EXPECT_EQ(schema[0].at("name"), "momentum");
  EXPECT_EQ(schema[0].at("choices"), (json{"sum", "ema", "none"}));
  EXPECT_EQ(schema[0].at("cli_flag"), nullptr);
  EXPECT_EQ(schema[1].at("default").get<float>(), 0.95f);
  const auto& scale = schema[8];
  EXPECT_EQ(scale.at("name"), "scale");
  EXPECT_EQ(scale.at("choices"), (json{"keller", "match_adamw", "sqrt_max", "unit_rms", "none"}));
  EXPECT_EQ(scale.at("cli_flag"), "--scale");
  EXPECT_EQ(schema[10].at("cli_flag"), "--split");
  EXPECT_EQ(schema[10].at("type"), "integer_list");
  EXPECT_EQ(schema[5].at("name"), "coefficients");
  EXPECT_EQ(schema[5].at("type"), "number_list");
  EXPECT_EQ(schema[5].at("default"), json::array());
  const auto schedules = schema[3].at("choices");
  EXPECT_NE(std::find(schedules.begin(), schedules.end(), "polar_express"), schedules.end());
}

// gram's runs: restart-sized, the last one what is left.
TEST(GramRuns, RestartSizedRunsTheLastOneWhatIsLeft) {
  using V = std::vector<size_t>;
  EXPECT_EQ(gram_run_lengths(5, 2), (V{2, 2, 1}));
  EXPECT_EQ(gram_run_lengths(10, 2), (V{2, 2, 2, 2, 2}));
  EXPECT_EQ(gram_run_lengths(7, 3), (V{3, 3, 1}));
  EXPECT_EQ(gram_run_lengths(5, 1), (V{1, 1, 1, 1, 1}));
  EXPECT_EQ(gram_run_lengths(5, 0), (V{5}));  // no restart
  EXPECT_EQ(gram_run_lengths(1, 2), (V{1}));
  EXPECT_TRUE(gram_run_lengths(0, 2).empty());
}

TEST(RangeSet, DisjointSortsDropsEmptyAndRefusesOverlapOrOutside) {
  const auto s = RangeSet::disjoint({{8, 12}, {0, 4}, {5, 5}}, 16, "push");
  EXPECT_EQ(s.ranges(), (std::vector<Range>{{0, 4}, {8, 12}}));
  EXPECT_EQ(s.elements(), 8);
  EXPECT_EQ(invalid_message([] { RangeSet::disjoint({{0, 4}, {3, 6}}, 16, "rank 1: push"); }),
            "rank 1: push ranges [0, 4) and [3, 6) overlap");
  EXPECT_EQ(invalid_message([] { RangeSet::disjoint({{10, 17}}, 16, "want"); }),
            "want range [10, 17) is not inside [0, 16)");
  EXPECT_EQ(invalid_message([] { RangeSet::disjoint({{-1, 2}}, 16, "want"); }),
            "want range [-1, 2) is not inside [0, 16)");
}

TEST(RangeSet, PackedOffsetsFollowTheRangesLaidEndToEnd) {
  const auto s = RangeSet::disjoint({{10, 20}, {0, 4}, {30, 31}}, 40, "want");
  EXPECT_EQ(s.packed_offset(0, 4), 0);
  EXPECT_EQ(s.packed_offset(2, 2), 2);
  EXPECT_EQ(s.packed_offset(10, 10), 4);
  EXPECT_EQ(s.packed_offset(15, 3), 9);
  EXPECT_EQ(s.packed_offset(30, 1), 14);
  EXPECT_EQ(s.packed_offset(20, 0), 14);  // an empty chunk at a range's end
  EXPECT_FALSE(s.packed_offset(3, 2));    // crosses out of [0, 4)
  EXPECT_FALSE(s.packed_offset(5, 1));    // in a gap
  EXPECT_FALSE(s.packed_offset(-1, 1));
  EXPECT_FALSE(s.packed_offset(0, -1));
  EXPECT_TRUE(s.covers(12, 8));
  EXPECT_FALSE(s.covers(12, 9));
  EXPECT_EQ(s.elements(), 15);
}

// A received chunk: an element offset lands by packed_offset; a packed position (a packed
// registration's chunk, which may span ranges) lands where it says, inside the packed elements.
TEST(RangeSet, ChunkPositionsOfElementOffsetsAndOfPackedPositions) {
  const auto s = RangeSet::disjoint({{10, 20}, {0, 4}, {30, 31}}, 40, "want");
  EXPECT_EQ(s.chunk_position(15, 3, /*packed=*/false), 9);
  EXPECT_FALSE(s.chunk_position(3, 2, false));  // crosses out of [0, 4)
  EXPECT_EQ(s.chunk_position(3, 2, /*packed=*/true), 3);  // packed: spans [0, 4) and [10, 20)
  EXPECT_EQ(s.chunk_position(0, 15, true), 0);
  EXPECT_EQ(s.chunk_position(15, 0, true), 15);  // empty, at the end
  EXPECT_FALSE(s.chunk_position(1, 15, true));   // one past the packed elements
  EXPECT_FALSE(s.chunk_position(-1, 1, true));
  EXPECT_FALSE(s.chunk_position(0, -1, true));
}

TEST(RangeSet, BlocksDescribeAColumnShardInOneEntryAndExpandBack) {
  // Rows [2, 7) x columns [3, 5) of a 7 x 10 matrix: five ranges, one block.
  std::vector<Range> col;
  for (int64_t r = 2; r < 7; ++r) col.push_back({r * 10 + 3, r * 10 + 5});
  const auto blocks = blocks_of(col);
  ASSERT_EQ(blocks.size(), 1u);
  EXPECT_EQ(blocks[0], (RangeBlock{{23, 25}, 5, 10}));
  EXPECT_EQ(ranges_of(blocks, 100, 70, "push"), col);
  // Mixed: a run, a lone range of another size, a run at another pitch; order kept.
  const std::vector<Range> mixed = {{0, 2}, {4, 6}, {8, 10}, {11, 14}, {20, 21}, {30, 31}};
  const auto mb = blocks_of(mixed);
  EXPECT_EQ(mb, (std::vector<RangeBlock>{{{0, 2}, 3, 4}, {{11, 14}, 1, 0}, {{20, 21}, 2, 10}}));
  EXPECT_EQ(ranges_of(mb, 100, 60, "push"), mixed);
  EXPECT_TRUE(blocks_of(std::vector<Range>{}).empty());
  // Descending ranges never make a block of overlapping rows.
  const std::vector<Range> down = {{10, 12}, {0, 2}};
  EXPECT_EQ(blocks_of(down).size(), 2u);
  EXPECT_EQ(ranges_of(blocks_of(down), 100, 60, "push"), down);
}

TEST(RangeSet, MalformedBlocksAreRefusedBeforeExpanding) {
  const auto refused = [](RangeBlock b, size_t max_ranges = 1000) {
    return invalid_message([&] {
      const std::vector<RangeBlock> one{b};
      ranges_of(one, max_ranges, 100, "field 'push'");
    });
  };
  EXPECT_EQ(refused({{0, 4}, 0, 10}), "field 'push': block [0, 4) x 0 rows, pitch 10 has fewer "
                                      "than one row");
  EXPECT_NE(refused({{0, 4}, 3, 2}).find("overlapping rows"), std::string::npos);
  EXPECT_NE(refused({{0, 0}, 3, 2}).find("repeats an empty range"), std::string::npos);
  EXPECT_NE(refused({{90, 95}, 3, 10}).find("ends outside [0, 100)"), std::string::npos);
  EXPECT_NE(refused({{0, 1}, int64_t{1} << 62, int64_t{1} << 62}).find("ends outside"),
            std::string::npos);  // no overflow
  EXPECT_NE(refused({{0, 1}, 50, 2}, 10).find("more than 10 ranges"), std::string::npos);
  EXPECT_NE(refused({{-1, 1}, 1, 0}).find("starts outside"), std::string::npos);
}

TEST(RangeSet, PackedSpansAreCutAtRangeBoundaries) {
  const auto s = RangeSet::disjoint({{10, 13}, {20, 23}, {30, 33}}, 40, "push");
  std::vector<std::array<int64_t, 4>> pieces;
  const auto collect = [&](size_t i, int64_t e, int64_t pos, int64_t n) {
    pieces.push_back({static_cast<int64_t>(i), e, pos, n});
  };
  ASSERT_TRUE(s.for_each_piece(0, 9, collect));
  EXPECT_EQ(pieces, (std::vector<std::array<int64_t, 4>>{
                        {0, 10, 0, 3}, {1, 20, 3, 3}, {2, 30, 6, 3}}));
  pieces.clear();
  ASSERT_TRUE(s.for_each_piece(2, 5, collect));  // from inside the first row into the third
  EXPECT_EQ(pieces, (std::vector<std::array<int64_t, 4>>{
                        {0, 12, 2, 1}, {1, 20, 3, 3}, {2, 30, 6, 1}}));
  pieces.clear();
  ASSERT_TRUE(s.for_each_piece(3, 3, collect));  // starts exactly at a range's packed start
  EXPECT_EQ(pieces, (std::vector<std::array<int64_t, 4>>{{1, 20, 3, 3}}));
  pieces.clear();
  EXPECT_TRUE(s.for_each_piece(9, 0, collect));
  EXPECT_FALSE(s.for_each_piece(7, 3, collect));  // past the 9 packed elements
  EXPECT_FALSE(s.for_each_piece(-1, 2, collect));
  EXPECT_FALSE(s.for_each_piece(0, -1, collect));
  EXPECT_TRUE(pieces.empty());
  EXPECT_EQ(packed_starts(s.ranges()), (std::vector<int64_t>{0, 3, 6}));
}

TEST(RangeSet, UnionAndAddMergeOverlappingAndTouchingRanges) {
  EXPECT_EQ(RangeSet::union_of({{5, 8}, {0, 2}, {2, 3}, {6, 10}, {12, 12}}).ranges(),
            (std::vector<Range>{{0, 3}, {5, 10}}));
  RangeSet s;
  s.add({0, 4});
  s.add({8, 12});
  s.add({20, 24});
  EXPECT_EQ(s.elements(), 12);
  s.add({4, 8});  // bridges the first two
  EXPECT_EQ(s.ranges(), (std::vector<Range>{{0, 12}, {20, 24}}));
  EXPECT_EQ(s.packed_offset(21, 1), 13);  // packed positions follow the merge
  s.add({18, 30});
  s.add({2, 3});
  EXPECT_EQ(s.ranges(), (std::vector<Range>{{0, 12}, {18, 30}}));
  EXPECT_EQ(s.elements(), 24);
  EXPECT_EQ(range_text({3, 7}), "[3, 7)");
}

TEST(RangeSet, ScatterAndGatherMoveEachRangesElements) {
  const auto s = RangeSet::disjoint({{6, 8}, {1, 3}}, 8, "want");
  const std::vector<float> packed = {1, 2, 3, 4};
  std::vector<float> full(8, 0.0f);
  s.scatter(packed.data(), full.data(), sizeof(float));
  EXPECT_EQ(full, (std::vector<float>{0, 1, 2, 0, 0, 0, 3, 4}));
  std::vector<float> back(4, -1.0f);
  s.gather(full.data(), back.data(), sizeof(float));
  EXPECT_EQ(back, packed);
}

TEST(Bf16Spans, WidenAndNarrowMatchTheScalarConversionsAtAnyAlignment) {
  const std::vector<float> values = {1.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, -0.0f,
                                     std::numeric_limits<float>::infinity(), 3.14159f, -2.5e-3f};
  std::vector<std::byte> bytes(1 + 2 * values.size());
  narrow_from_f32(DType::bf16, values, bytes.data() + 1);  // odd address: no aligned loads
  std::vector<float> wide(values.size());
  widen_to_f32(DType::bf16, bytes.data() + 1, wide);
  for (size_t i = 0; i < values.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 1 + 2 * i, 2);
    EXPECT_EQ(h, f32_to_bf16(values[i])) << i;
    const float expect = bf16_to_f32(f32_to_bf16(values[i]));
    EXPECT_EQ(std::memcmp(&wide[i], &expect, 4), 0) << i;
  }
  std::vector<float> copy(values.size());
  std::vector<std::byte> raw(4 * values.size());
  narrow_from_f32(DType::f32, values, raw.data());
  widen_to_f32(DType::f32, raw.data(), copy);
  EXPECT_EQ(std::memcmp(copy.data(), values.data(), 4 * values.size()), 0);
  EXPECT_EQ(dtype_bytes(DType::bf16), 2u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::bf16);
  EXPECT_EQ(invalid_message([] { parse_dtype("f16"); }), "unknown dtype 'f16' (known: f32, bf16)");
}

TEST(ErrorCodes, IntegersAndNamesAreStable) {
  // The integers are a contract with every peer and every Python release: never renumbered.
  const std::vector<std::pair<ErrorCode, int>> fixed = {
      {ErrorCode::none, 0},          {ErrorCode::bad_request, 1},
      {ErrorCode::protocol, 2},      {ErrorCode::unsupported, 3},
      {ErrorCode::unauthorized, 4},  {ErrorCode::peer_lost, 5},
      {ErrorCode::timeout, 6},       {ErrorCode::non_finite, 7},
      {ErrorCode::backend, 8},       {ErrorCode::data_plane, 9},
      {ErrorCode::nccl, 10},         {ErrorCode::snapshot, 11},
      {ErrorCode::shutdown, 12},     {ErrorCode::server, 13},
      {ErrorCode::step_mismatch, 14}, {ErrorCode::bad_reply, 15},
      {ErrorCode::connection_lost, 16}, {ErrorCode::invalid_argument, 17},
      {ErrorCode::device, 18},       {ErrorCode::unavailable, 19},
      {ErrorCode::internal, 20}};
  ASSERT_EQ(static_cast<int>(fixed.size()), kErrorCodeCount);
  std::set<std::string_view> names;
  for (const auto& [code, value] : fixed) {
    EXPECT_EQ(static_cast<int>(code), value);
    EXPECT_EQ(error_code_from_int(value), code);
    EXPECT_EQ(error_code_from_name(error_code_name(code)), code);
    names.insert(error_code_name(code));
  }
  EXPECT_EQ(static_cast<int>(names.size()), kErrorCodeCount);
  EXPECT_EQ(error_code_name(ErrorCode::peer_lost), "peer_lost");
  EXPECT_EQ(error_code_from_name("no_such_code"), std::nullopt);
  EXPECT_EQ(error_code_from_int(kErrorCodeCount), std::nullopt);
  EXPECT_EQ(error_code_from_int(-1), std::nullopt);
}
