#!/usr/bin/env bash
# Soak test of muon-offloadd: N rank processes x M steps against one real server, SIGKILL and
# restart of random ranks every K steps. Reports the server's RSS over time (first/peak/last and
# slope after warm-up), the shared-memory segments it leaves, hangs, and checks every update each
# rank received bitwise against the in-process kernels. Exit 0 when every bound held.
#
#   scripts/soak.sh [--clients N] [--steps M] [--kill-every K] [--duration S] [muon_soak options]
#   scripts/soak.sh --help          # every option (parameter set, bounds, work folder, JSON)
#
# Short form (what CTest runs as soak_short): scripts/soak.sh   (3 clients x 30 steps, 2 kills)
# Long form (by hand):  scripts/soak.sh --clients 4 --steps 2000 --kill-every 50
#                       scripts/soak.sh --server-arg=--defer-host-copies ...  (the GPU path's
#                       continuations on the CPU: daemon/README)
#                       scripts/soak.sh --clients 4 --shapes gpt2 --steps 0 --duration 300
# BUILD_DIR (default build/) and JOBS (default 2) choose where and how wide to build; the script
# builds muon_soak (with muon-offloadd and muon_soak_rank) when it is missing, or with --build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
JOBS="${JOBS:-2}"

args=()
build=0
for a in "$@"; do
  case "$a" in
    --build) build=1 ;;
    *) args+=("$a") ;;
  esac
done

if [ "$build" = 1 ] || [ ! -x "$BUILD_DIR/tests/soak/muon_soak" ]; then
  [ -f "$BUILD_DIR/CMakeCache.txt" ] || cmake -S "$ROOT" -B "$BUILD_DIR"
  cmake --build "$BUILD_DIR" -j "$JOBS" --target muon_soak
fi

export OPENBLAS_NUM_THREADS=1  # the server runs --threads 1; the reference uses 1 thread too
exec "$BUILD_DIR/tests/soak/muon_soak" --server "$BUILD_DIR/daemon/muon-offloadd" \
  --rank-bin "$BUILD_DIR/tests/soak/muon_soak_rank" "${args[@]+"${args[@]}"}"
