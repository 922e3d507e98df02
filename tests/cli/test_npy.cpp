// .npy reading and writing (cli/npy.hpp): round trips, both header versions, the header
// variants NumPy and other writers produce, and every refusal with its message.
#include "cli/npy.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "core/error.hpp"

namespace fs = std::filesystem;
using muon::cli::NpyArray;
using muon::cli::read_npy;
using muon::cli::write_npy;

namespace {

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("muon_test_npy_" + std::to_string(::getpid()) + "_" + info->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path path(const std::string& name) const { return dir_ / name; }

  static void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string read_bytes(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  // An npy file of version major.0 with `dict` as the header (padded to 64 bytes, '\n'-ended)
  // followed by `data`.
  static std::string npy_bytes(int major, std::string dict, const std::string& data) {
    const size_t preamble = major == 1 ? 10 : 12;
    while ((preamble + dict.size() + 1) % 64 != 0) dict += ' ';
    dict += '\n';
    std::string b("\x93NUMPY", 6);
    b += static_cast<char>(major);
    b += '\0';
    for (size_t i = 0; i < preamble - 8; ++i)
      b += static_cast<char>((dict.size() >> (8 * i)) & 0xFF);
    return b + dict + data;
  }
  static std::string float_bytes(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }

  // Expects read_npy(p) to throw InvalidArgument whose message names the file and contains
  // `needle`.
  static void expect_refused(const fs::path& p, const std::string& needle) {
    try {
      read_npy(p);
      ADD_FAILURE() << "read_npy accepted " << p << "; expected a refusal with '" << needle << "'";
    } catch (const muon::InvalidArgument& e) {
      EXPECT_NE(e.message().find(needle), std::string::npos)
          << "message: " << e.message() << "\nexpected to contain: " << needle;
      EXPECT_NE(e.message().find(p.filename().string()), std::string::npos)
          << "message does not name the file: " << e.message();
    }
  }

  fs::path dir_;
};

std::vector<float> sample(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i) * 0.37f - 1.5f;
  if (n >= 4) {
    v[0] = -0.0f;
    v[1] = std::numeric_limits<float>::denorm_min();
    v[2] = std::numeric_limits<float>::max();
    v[3] = 1e-30f;
  }
  return v;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST_F(NpyTest, RoundTrip2D) {
  const std::vector<int64_t> shape = {3, 5};
  const auto data = sample(15);
  write_npy(path("a.npy"), shape, data);
  const NpyArray a = read_npy(path("a.npy"));
  EXPECT_EQ(a.shape, shape);
  expect_same_bits(a.data, data);
}

TEST_F(NpyTest, RoundTrip3D) {
  const std::vector<int64_t> shape = {4, 3, 7};
  const auto data = sample(84);
  write_npy(path("a.npy"), shape, data);
  const NpyArray a = read_npy(path("a.npy"));
  EXPECT_EQ(a.shape, shape);
  expect_same_bits(a.data, data);
}

TEST_F(NpyTest, RoundTripZeroExtent) {
  const std::vector<int64_t> shape = {0, 5};
  write_npy(path("a.npy"), shape, std::vector<float>{});
  const NpyArray a = read_npy(path("a.npy"));
  EXPECT_EQ(a.shape, shape);
  EXPECT_TRUE(a.data.empty());
}

TEST_F(NpyTest, WritesV1HeaderLikeNumPy) {
  write_npy(path("a.npy"), std::vector<int64_t>{2, 3}, sample(6));
  const std::string b = read_bytes(path("a.npy"));
  ASSERT_GE(b.size(), 10u);
  EXPECT_EQ(b.substr(0, 6), std::string("\x93NUMPY", 6));
  EXPECT_EQ(b[6], 1);
  EXPECT_EQ(b[7], 0);
  const size_t header_len = static_cast<unsigned char>(b[8]) | static_cast<unsigned char>(b[9])
                                                                   << 8;
  EXPECT_EQ((10 + header_len) % 64, 0u);
  EXPECT_EQ(b.size(), 10 + header_len + 6 * sizeof(float));
  const std::string header = b.substr(10, header_len);
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(header.find("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"), 0u)
      << header;
}

TEST_F(NpyTest, WritesV2WhenTheHeaderExceedsV1) {
  // 30000 dimensions of 1 make a shape tuple longer than v1.0's 65535-byte header limit.
  const std::vector<int64_t> shape(30000, 1);
  write_npy(path("a.npy"), shape, std::vector<float>{2.5f});
  const std::string b = read_bytes(path("a.npy"));
  ASSERT_GE(b.size(), 12u);
  EXPECT_EQ(b[6], 2);
  const size_t header_len = static_cast<unsigned char>(b[8]) |
                            static_cast<size_t>(static_cast<unsigned char>(b[9])) << 8 |
                            static_cast<size_t>(static_cast<unsigned char>(b[10])) << 16;
  EXPECT_GT(header_len, 65535u);
  EXPECT_EQ((12 + header_len) % 64, 0u);
  EXPECT_EQ(b.size(), 12 + header_len + sizeof(float));
}

TEST_F(NpyTest, ReadsV1Header) {
  const auto data = sample(6);
  write_bytes(path("v1.npy"),
              npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }",
                        float_bytes(data)));
  const NpyArray a = read_npy(path("v1.npy"));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  expect_same_bits(a.data, data);
}

TEST_F(NpyTest, ReadsV2Header) {
  const auto data = sample(24);
  write_bytes(path("v2.npy"),
              npy_bytes(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3, 4), }",
                        float_bytes(data)));
  const NpyArray a = read_npy(path("v2.npy"));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3, 4}));
  expect_same_bits(a.data, data);
}

TEST_F(NpyTest, ReadsHeaderVariants) {
  // Other key order, double quotes, no trailing commas, Python 2 long suffixes.
  const auto data = sample(6);
  write_bytes(path("a.npy"),
              npy_bytes(1, "{\"shape\":(3L,2L),\"fortran_order\":False,\"descr\":\"<f4\"}",
                        float_bytes(data)));
  const NpyArray a = read_npy(path("a.npy"));
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 2}));
  expect_same_bits(a.data, data);
}

TEST_F(NpyTest, RefusesMissingFile) {
  expect_refused(path("missing.npy"), "no such file");
}

TEST_F(NpyTest, RefusesBadMagic) {
  std::string b = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }",
                            float_bytes({1.0f}));
  b[1] = 'X';
  write_bytes(path("magic.npy"), b);
  expect_refused(path("magic.npy"), "bad magic");
}

TEST_F(NpyTest, RefusesTooShortForPreamble) {
  write_bytes(path("short.npy"), "\x93NUM");
  expect_refused(path("short.npy"), "too short");
}

TEST_F(NpyTest, RefusesUnknownVersion) {
  write_bytes(path("v3.npy"),
              npy_bytes(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }",
                        float_bytes({1.0f})));
  expect_refused(path("v3.npy"), "version 3.0");
}

TEST_F(NpyTest, RefusesFloat64) {
  write_bytes(path("f8.npy"),
              npy_bytes(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2), }",
                        std::string(16, '\0')));
  expect_refused(path("f8.npy"), "dtype '<f8' is not supported");
}

TEST_F(NpyTest, RefusesBigEndianFloat32) {
  write_bytes(path("be.npy"),
              npy_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1, 2), }",
                        std::string(8, '\0')));
  expect_refused(path("be.npy"), "dtype '>f4' is not supported");
}

TEST_F(NpyTest, RefusesStructuredDtype) {
  write_bytes(path("rec.npy"),
              npy_bytes(1, "{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (1, 1), }",
                        std::string(4, '\0')));
  expect_refused(path("rec.npy"), "structured dtypes are not supported");
}

TEST_F(NpyTest, RefusesFortranOrder) {
  write_bytes(path("fortran.npy"),
              npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }",
                        float_bytes(sample(4))));
  expect_refused(path("fortran.npy"), "fortran_order is True");
}

TEST_F(NpyTest, Refuses1D) {
  write_bytes(path("vec.npy"),
              npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
                        float_bytes(sample(4))));
  expect_refused(path("vec.npy"), "array is 1-D");
}

TEST_F(NpyTest, Refuses4D) {
  write_bytes(path("t4.npy"),
              npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 2, 2), }",
                        float_bytes(sample(4))));
  expect_refused(path("t4.npy"), "array is 4-D");
}

TEST_F(NpyTest, RefusesTruncatedData) {
  write_bytes(path("trunc.npy"),
              npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
                        float_bytes(sample(11))));
  expect_refused(path("trunc.npy"),
                 "truncated: shape (3, 4) needs 48 data bytes but the file holds 44");
}

TEST_F(NpyTest, RefusesTrailingBytes) {
  write_bytes(path("long.npy"),
              npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2), }",
                        float_bytes(sample(3))));
  expect_refused(path("long.npy"), "4 unexpected bytes after the data");
}

TEST_F(NpyTest, RefusesHeaderLengthPastFileEnd) {
  std::string b = npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), }",
                            float_bytes({1.0f}));
  b[8] = static_cast<char>(0xFF);
  b[9] = static_cast<char>(0x7F);
  write_bytes(path("hlen.npy"), b);
  expect_refused(path("hlen.npy"), "header length 32767 runs past the end of the file");
}

TEST_F(NpyTest, RefusesMalformedHeaders) {
  const std::pair<const char*, const char*> cases[] = {
      {"{'descr': '<f4', 'fortran_order': False}", "key 'shape' is missing"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (1, 1)}", "expected True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, -1)}", "non-negative integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1), 'extra': 1}",
       "unexpected key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1, 1)}",
       "'descr' appears twice"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1)", "expected '}'"},
  };
  int i = 0;
  for (const auto& [dict, needle] : cases) {
    const auto p = path("bad" + std::to_string(i++) + ".npy");
    write_bytes(p, npy_bytes(1, dict, float_bytes({1.0f})));
    SCOPED_TRACE(dict);
    expect_refused(p, needle);
  }
}

TEST_F(NpyTest, WriteRefusesSizeMismatch) {
  try {
    write_npy(path("a.npy"), std::vector<int64_t>{2, 3}, sample(5));
    ADD_FAILURE() << "write_npy accepted 5 elements for shape (2, 3)";
  } catch (const muon::InvalidArgument& e) {
    EXPECT_NE(e.message().find("shape (2, 3) has 6 elements but 5 were given"), std::string::npos)
        << e.message();
  }
}

TEST_F(NpyTest, WriteRefusesMissingDirectory) {
  try {
    write_npy(path("no/such/dir/a.npy"), std::vector<int64_t>{1, 1}, sample(1));
    ADD_FAILURE() << "write_npy wrote into a missing directory";
  } catch (const muon::InvalidArgument& e) {
    EXPECT_NE(e.message().find("cannot open for writing"), std::string::npos) << e.message();
  }
}

}  // namespace
