// Test helpers for nvidia-smi topo text: a fixture's text, and "this text is refused with an
// error that mentions ...".
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/error.hpp"
#include "read_text.hpp"
#include "topology/nvidia_smi_topo.hpp"

namespace muon::testing {

/// The text of tests/topology/fixtures/<name>.
inline std::string topology_fixture(const std::string& name) {
  return read_text(std::string(MUON_TOPOLOGY_FIXTURES) + "/" + name);
}

/// parse_nvidia_smi_topo(text) throws InvalidArgument whose what() contains `needle`.
inline void expect_topo_error_mentions(const std::string& text, const std::string& needle) {
  try {
    topology::parse_nvidia_smi_topo(text);
    ADD_FAILURE() << "expected an error mentioning " << needle;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace muon::testing
