#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz, clang-16, ASan + UBSan, CUDA off) in build-fuzz and
# runs each for SECONDS (default 60) from the checked-in seed corpus.
#
#   scripts/fuzz.sh [SECONDS] [HARNESS]     HARNESS: frame | registration | all (default)
#
# New inputs go to build-fuzz/fuzz-corpus/<harness> (the seed corpus in the tree is only read);
# crashes go to $CRASH_DIR/<harness>/ (default build-fuzz/fuzz-crashes). Exits non-zero when a
# harness crashes, printing the reproducer; replay one with
#   build-fuzz/tests/fuzz/fuzz_<harness> <reproducer>
# and turn it into a unit test (tests/transport/test_protocol.cpp, tests/daemon/...). The seed
# corpus alone replays as CTest tests of this build: ctest --test-dir build-fuzz
# clang-16, libclang-rt-16-dev and llvm-16 are installed on demand (scripts/install_deps.sh --fuzz).
# BUILD_DIR=..., JOBS=..., CRASH_DIR=... override the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_EACH=${1:-60}
WHICH=${2:-all}
BUILD_DIR=${BUILD_DIR:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
CRASH_DIR=${CRASH_DIR:-$BUILD_DIR/fuzz-crashes}

case "$WHICH" in
  all) HARNESSES=(frame registration) ;;
  frame | registration) HARNESSES=("$WHICH") ;;
  *) echo "fuzz.sh: unknown harness '$WHICH' (frame, registration, all)" >&2; exit 2 ;;
esac

scripts/install_deps.sh --fuzz
# Stack traces of crashes: LLVM 16's symbolizer reads clang-16's debug info (Debian's default
# llvm-symbolizer is LLVM 14's).
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-16/bin/llvm-symbolizer

# Absolute compiler paths: CMake wipes the cache (and the options given with it) when a name
# resolves to another path than at the first configure.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$(command -v clang-16)" -DCMAKE_CXX_COMPILER="$(command -v clang++-16)" \
  -DMUON_OFFLOAD_FUZZ=ON -DMUON_OFFLOAD_CUDA=OFF -DMUON_OFFLOAD_TESTS=OFF -DMUON_OFFLOAD_BENCH=OFF
targets=()
for h in "${HARNESSES[@]}"; do targets+=("fuzz_$h"); done
cmake --build "$BUILD_DIR" -j"$JOBS" --target "${targets[@]}"

status=0
for h in "${HARNESSES[@]}"; do
  work="$BUILD_DIR/fuzz-corpus/$h"
  crashes="$CRASH_DIR/$h"
  mkdir -p "$work" "$crashes"
  stamp=$(mktemp)
  echo "== fuzz_$h: ${SECONDS_EACH}s, corpus $work + tests/fuzz/corpus/$h, crashes in $crashes"
  # The first corpus directory receives new inputs; the seed corpus after it is only read.
  if ! "$BUILD_DIR/tests/fuzz/fuzz_$h" -max_total_time="$SECONDS_EACH" -timeout=10 \
      -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$crashes/" \
      -dict=tests/fuzz/json.dict \
      "$work" "tests/fuzz/corpus/$h"; then
    status=1
    echo "fuzz.sh: fuzz_$h crashed; reproducer(s):" >&2
    find "$crashes" -type f -newer "$stamp" -print >&2
  fi
  rm -f "$stamp"
done
exit $status
