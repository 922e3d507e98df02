// Plain-text tables for the CLI: columns padded to their widest cell, two spaces apart.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace muon::cli {

/// Writes `rows` (the first is the header) with every line prefixed by `indent`. Rows may be
/// shorter than the header (missing cells are empty); trailing spaces are not written.
void print_table(std::ostream& out, const std::vector<std::vector<std::string>>& rows,
                 const std::string& indent = "");

}  // namespace muon::cli
