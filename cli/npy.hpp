// NumPy .npy files of float32 matrices, so the CLI can exchange tensors with any NumPy/PyTorch
// stack. Format: "NPY format" of NumPy (numpy.lib.format, NEP 1):
//   magic "\x93NUMPY", version byte major, minor
//   v1.0: header length as little-endian uint16; v2.0: as little-endian uint32
//   header: a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (r, c), }
//           padded with spaces and ended by '\n' so the data starts at a multiple of 64 bytes
//   data:   prod(shape) elements, C order.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <vector>

namespace muon::cli {

/// A float32 array read from a .npy file: `data` holds prod(shape) elements in C (row-major)
/// order.
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

/// Reads a .npy file (format v1.0 or v2.0) holding a 2-D [r, c] or 3-D [b, r, c] array of
/// little-endian float32 ('<f4') in C order (fortran_order False). Dimensions may be zero.
/// Throws muon::InvalidArgument naming the file and what is wrong: the file cannot be opened or
/// read, bad magic, unsupported version, header length past the file's end, a malformed or
/// incomplete header dict, a dtype other than '<f4' (e.g. '<f8', '>f4'), fortran_order True, a
/// shape that is not 2-D or 3-D, data shorter (truncated) or longer than the shape says.
NpyArray read_npy(const std::filesystem::path& path);

/// Writes `data` (prod(shape) float32 elements, C order) as a little-endian '<f4' C-order .npy
/// file at `path`, replacing it: format v1.0, or v2.0 when the header does not fit v1.0's 64 KiB.
/// Any number of dimensions (0-D is a scalar). The result loads with numpy.load.
/// Throws muon::InvalidArgument when a dimension is negative, `data.size()` is not prod(shape),
/// or the file cannot be opened for writing; muon::Error when writing fails part way
/// (e.g. disk full).
void write_npy(const std::filesystem::path& path, std::span<const int64_t> shape,
               std::span<const float> data);

}  // namespace muon::cli
