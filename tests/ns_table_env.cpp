// Every test process uses the build's own table of auto's Newton-Schulz choices
// (MUON_TEST_NS_TABLE, set by tests/CMakeLists.txt), not the user's ~/.cache one: tests neither
// write into the user's cache nor depend on what it holds. A MUON_OFFLOAD_NS_TABLE already set
// (by the caller, or a test for its child processes) wins. The servers and clients the tests
// start inherit it, so a server and the test's in-process reference read the same choices.
#include <cstdlib>

namespace {

const bool kNsTableSet = [] {
  ::setenv("MUON_OFFLOAD_NS_TABLE", MUON_TEST_NS_TABLE, /*overwrite=*/0);
  return true;
}();

}  // namespace
