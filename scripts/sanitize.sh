#!/usr/bin/env bash
# Builds and runs the unit and integration tests under the sanitizers, with the presets of
# CMakePresets.json (GCC, CUDA off, benchmarks off):
#
#   scripts/sanitize.sh [asan|tsan|all]      (default all)
#
#   asan  AddressSanitizer + UndefinedBehaviorSanitizer (build-asan): halt on the first error,
#         leaks checked at every process exit, UB aborts (-fno-sanitize-recover=undefined).
#   tsan  ThreadSanitizer (build-tsan).
#
# The sanitizer options live in the test presets. Every report, from any process (the tests
# spawn servers and clients whose stderr a passing test never shows), is written to
# build-<preset>/sanitizer-logs/; the run fails when a report exists and prints it.
# The python tests (label python) are left out of the test presets: the interpreter is not instrumented. Under asan
# it runs after the other tests with libasan (and libstdc++) preloaded and leak checking off
# (CPython and torch keep their allocations until exit; the servers it starts inherit that, and
# leaks of our code are checked by the C++ tests). Under tsan
# it does not run: TSan cannot see the synchronization inside CPython, torch and libgomp, so it
# would report their threads, not ours (the client's reader thread is covered by
# test_client_api and test_server_integration).
# JOBS=... sets the build and test parallelism (default: nproc). Prints build and test times.
set -euo pipefail
cd "$(dirname "$0")/.."

WHICH=${1:-all}
JOBS=${JOBS:-$(nproc)}
case "$WHICH" in
  all) PRESETS=(asan tsan) ;;
  asan | tsan) PRESETS=("$WHICH") ;;
  *) echo "sanitize.sh: unknown preset '$WHICH' (asan, tsan, all)" >&2; exit 2 ;;
esac

scripts/install_deps.sh

# Prints every sanitizer report under $1 and returns 1 when there is one.
check_logs() {
  local logs
  logs=$(find "$1" -type f 2>/dev/null | sort)
  [ -z "$logs" ] && return 0
  for f in $logs; do
    echo "---- $f"
    cat "$f"
  done
  echo "sanitize.sh: sanitizer reports above ($(echo "$logs" | wc -l) file(s) in $1)" >&2
  return 1
}

status=0
summary=()
for preset in "${PRESETS[@]}"; do
  dir="build-$preset"
  logs="$dir/sanitizer-logs"
  t0=$(date +%s)
  cmake --preset "$preset"
  cmake --build --preset "$preset" -j"$JOBS"
  t1=$(date +%s)
  rm -rf "$logs"
  mkdir -p "$logs"
  result=passed
  ctest --preset "$preset" -j"$JOBS" || result=failed
  if [ "$preset" = asan ]; then
    # libasan must come first; libstdc++ with it, or ASan cannot find the real __cxa_throw
    # (CPython loads libstdc++ only later, with the extension that needs it).
    LD_PRELOAD="$(g++ -print-file-name=libasan.so):$(g++ -print-file-name=libstdc++.so)" \
      ASAN_OPTIONS="halt_on_error=1:detect_leaks=0:log_path=$PWD/$logs/asan-python" \
      UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$PWD/$logs/ubsan-python" \
      ctest --test-dir "$dir" --output-on-failure -L '^python$' || result=failed
  fi
  check_logs "$logs" || result=failed
  t2=$(date +%s)
  [ "$result" = passed ] || status=1
  summary+=("$preset: $result; build $((t1 - t0)) s, tests $((t2 - t1)) s (JOBS=$JOBS)")
done
printf 'sanitize.sh: %s\n' "${summary[@]}"
exit $status
