#include "cli/npy.hpp"

#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "core/error.hpp"

namespace muon::cli {
namespace {

static_assert(std::endian::native == std::endian::little,
              "npy I/O copies '<f4' bytes as they are; a big-endian host needs a byte swap");

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr int64_t kMaxDim = int64_t{1} << 48;

std::string who(const std::filesystem::path& path) {
  return "npy file '" + path.string() + "'";
}

std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

// prod(shape), or nullopt when it does not fit int64 or a dimension is negative.
std::optional<int64_t> element_count(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / 4 / d) return std::nullopt;
    n *= d;
  }
  return n;
}

// The three fields of an npy header.
struct Header {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<int64_t>> shape;
};

// Parses the header dict, a Python literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// accepting what ast.literal_eval accepts for these three keys: either quote style, any key
// order, whitespace anywhere, trailing commas, Python 2 'L' suffixes on the dimensions.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string where) : s_(text), who_(std::move(where)) {}

  Header parse() {
    Header h;
    expect('{');
    while (!eat('}')) {
      const std::string key = parse_string("a quoted key");
      expect(':');
      if (key == "descr") {
        if (h.descr) fail("key 'descr' appears twice");
        h.descr = parse_string(
            "a quoted dtype string for 'descr' (structured dtypes are "
            "not supported)");
      } else if (key == "fortran_order") {
        if (h.fortran_order) fail("key 'fortran_order' appears twice");
        h.fortran_order = parse_bool();
      } else if (key == "shape") {
        if (h.shape) fail("key 'shape' appears twice");
        h.shape = parse_tuple();
      } else {
        fail("unexpected key '" + key + "' (an npy header has descr, fortran_order, shape)");
      }
      if (!eat(',')) {
        expect('}');
        break;
      }
    }
    skip_ws();
    if (pos_ != s_.size()) fail("text after the closing '}'");
    if (!h.descr) fail("key 'descr' is missing");
    if (!h.fortran_order) fail("key 'fortran_order' is missing");
    if (!h.shape) fail("key 'shape' is missing");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InvalidArgument(who_ + ": malformed header: " + what +
                          " (header: " + std::string(s_.substr(0, 200)) + ")");
  }

  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' ||
                                s_[pos_] == '\r' || s_[pos_] == '\0'))
      ++pos_;
  }

  bool eat(char c) {
    skip_ws();
    if (pos_ < s_.size() && s_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!eat(c)) fail(std::string("expected '") + c + "'");
  }

  std::string parse_string(const char* what) {
    skip_ws();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) {
      fail(std::string("expected ") + what);
    }
    const char quote = s_[pos_++];
    std::string out;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) ++pos_;
      out += s_[pos_++];
    }
    if (pos_ >= s_.size()) fail("unterminated string");
    ++pos_;
    return out;
  }

  bool parse_bool() {
    skip_ws();
    const std::string_view rest = s_.substr(pos_);
    if (rest.starts_with("True")) {
      pos_ += 4;
      return true;
    }
    if (rest.starts_with("False")) {
      pos_ += 5;
      return false;
    }
    fail("expected True or False for 'fortran_order'");
  }

  std::vector<int64_t> parse_tuple() {
    expect('(');
    std::vector<int64_t> dims;
    while (!eat(')')) {
      skip_ws();
      if (pos_ >= s_.size() || s_[pos_] < '0' || s_[pos_] > '9') {
        fail("expected a non-negative integer in 'shape'");
      }
      int64_t d = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        d = d * 10 + (s_[pos_++] - '0');
        if (d > kMaxDim) fail("a dimension in 'shape' is implausibly large");
      }
      if (pos_ < s_.size() && (s_[pos_] == 'L' || s_[pos_] == 'l')) ++pos_;
      dims.push_back(d);
      if (!eat(',')) {
        expect(')');
        break;
      }
    }
    return dims;
  }

  std::string_view s_;
  std::string who_;
  size_t pos_ = 0;
};

uint32_t little_endian(const unsigned char* p, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

NpyArray read_npy(const std::filesystem::path& path) {
  const std::string w = who(path);
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw InvalidArgument(w + ": no such file");
  if (std::filesystem::is_directory(status)) throw InvalidArgument(w + ": is a directory");

  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(w + ": cannot open: " + std::strerror(errno));
  in.seekg(0, std::ios::end);
  const int64_t file_size = static_cast<int64_t>(in.tellg());
  in.seekg(0, std::ios::beg);
  if (file_size < 0) throw InvalidArgument(w + ": cannot determine the file size");

  unsigned char pre[12] = {};
  if (file_size < 10 || !in.read(reinterpret_cast<char*>(pre), 8)) {
    throw InvalidArgument(w + ": not an npy file (only " + std::to_string(file_size) +
                          " bytes; too short for the npy preamble)");
  }
  if (std::memcmp(pre, kMagic, kMagicLen) != 0) {
    throw InvalidArgument(w + ": not an npy file (bad magic; expected \\x93NUMPY)");
  }
  const int major = pre[6], minor = pre[7];
  int len_bytes = 0;
  if (major == 1 && minor == 0) {
    len_bytes = 2;
  } else if (major == 2 && minor == 0) {
    len_bytes = 4;
  } else {
    throw InvalidArgument(w + ": unsupported npy format version " + std::to_string(major) + "." +
                          std::to_string(minor) + " (supported: 1.0, 2.0)");
  }
  if (!in.read(reinterpret_cast<char*>(pre + 8), len_bytes)) {
    throw InvalidArgument(w + ": truncated in the npy preamble");
  }
  const int64_t header_len = little_endian(pre + 8, len_bytes);
  const int64_t data_offset = 8 + len_bytes + header_len;
  if (data_offset > file_size) {
    throw InvalidArgument(w + ": header length " + std::to_string(header_len) +
                          " runs past the end of the file (" + std::to_string(file_size) +
                          " bytes; truncated?)");
  }
  std::string text(static_cast<size_t>(header_len), '\0');
  if (!in.read(text.data(), header_len)) throw InvalidArgument(w + ": cannot read the header");

  const Header h = HeaderParser(text, w).parse();
  if (*h.descr != "<f4") {
    throw InvalidArgument(w + ": dtype '" + *h.descr +
                          "' is not supported; need little-endian float32 '<f4' (in NumPy: "
                          "np.save(path, a.astype('<f4')))");
  }
  if (*h.fortran_order) {
    throw InvalidArgument(w +
                          ": fortran_order is True; need C order (in NumPy: "
                          "np.save(path, np.ascontiguousarray(a)))");
  }
  if (h.shape->size() != 2 && h.shape->size() != 3) {
    throw InvalidArgument(w + ": array is " + std::to_string(h.shape->size()) + "-D with shape " +
                          shape_str(*h.shape) +
                          "; need 2-D [rows, cols] or 3-D [batch, rows, cols]");
  }
  const auto numel = element_count(*h.shape);
  if (!numel) throw InvalidArgument(w + ": shape " + shape_str(*h.shape) + " is too large");
  const int64_t need = *numel * 4, have = file_size - data_offset;
  if (have < need) {
    throw InvalidArgument(w + ": truncated: shape " + shape_str(*h.shape) + " needs " +
                          std::to_string(need) + " data bytes but the file holds " +
                          std::to_string(have));
  }
  if (have > need) {
    throw InvalidArgument(w + ": " + std::to_string(have - need) +
                          " unexpected bytes after the data of shape " + shape_str(*h.shape) +
                          " (several arrays in one file are not supported)");
  }

  NpyArray out;
  out.shape = *h.shape;
  out.data.resize(static_cast<size_t>(*numel));
  if (need > 0 && !in.read(reinterpret_cast<char*>(out.data.data()), need)) {
    throw InvalidArgument(w + ": cannot read the data (" + std::to_string(need) + " bytes)");
  }
  return out;
}

void write_npy(const std::filesystem::path& path, std::span<const int64_t> shape,
               std::span<const float> data) {
  const std::string w = who(path);
  const auto numel = element_count(shape);
  if (!numel) {
    throw InvalidArgument(w + ": cannot write shape " + shape_str(shape) +
                          " (negative or too large)");
  }
  if (static_cast<uint64_t>(*numel) != data.size()) {
    throw InvalidArgument(w + ": shape " + shape_str(shape) + " has " + std::to_string(*numel) +
                          " elements but " + std::to_string(data.size()) + " were given");
  }

  std::string dict =
      "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_str(shape) + ", }";
  // Pad with spaces and end with '\n' so that preamble + header is a multiple of 64 bytes.
  auto padded = [&dict](size_t preamble) {
    const size_t unpadded = preamble + dict.size() + 1;
    return dict.size() + (64 - unpadded % 64) % 64 + 1;
  };
  const bool v1 = padded(10) <= 0xFFFF;
  const size_t preamble = v1 ? 10 : 12;
  const size_t header_len = padded(preamble);
  dict.resize(header_len - 1, ' ');
  dict += '\n';

  std::string head(kMagic, kMagicLen);
  head += static_cast<char>(v1 ? 1 : 2);
  head += '\0';
  for (size_t i = 0; i < preamble - 8; ++i)
    head += static_cast<char>((header_len >> (8 * i)) & 0xFF);
  head += dict;

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InvalidArgument(w + ": cannot open for writing: " + std::strerror(errno));
  out.write(head.data(), static_cast<std::streamsize>(head.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  out.flush();
  if (!out) throw Error(w + ": writing failed: " + std::strerror(errno));
}

}  // namespace muon::cli
