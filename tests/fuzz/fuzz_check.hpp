// FUZZ_CHECK: the harnesses' assertion. A violated invariant prints the condition and aborts, which
// libFuzzer reports as a crash and saves the input as a reproducer (scripts/fuzz.sh).
#pragma once

#include <cstdio>
#include <cstdlib>

#define MUON_FUZZ_STR2(x) #x
#define MUON_FUZZ_STR(x) MUON_FUZZ_STR2(x)
#define FUZZ_CHECK(cond)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "invariant violated: %s [%s:%s]\n", #cond, __FILE__, \
                   MUON_FUZZ_STR(__LINE__));                                    \
      std::abort();                                                             \
    }                                                                           \
  } while (0)
