#!/usr/bin/env bash
# Proves, here, that the GPU bundle (.gpu-bundle/, made by scripts/gpu_bundle.py) is all the GPU
# machine needs: in a minimal Debian root that has none of this host's -dev packages (made once
# with debootstrap into build-gpu-root/, kept for reruns), with only what the GPU machine's image
# has bound or installed in it (g++ and the C library's headers, the CUDA toolkit of /usr/local/cuda
# bound in with its NCCL hidden, a Python venv at /opt/torch/.venv with torch, CMake and ninja from
# PyPI, as on that image), on a copy of what travels there (the tracked and untracked-not-ignored
# files plus .gpu-bundle), it runs:
#   1. scripts/gpu_check.sh --prepare: the prebuilt binaries unpacked at their build path, each
#      loaded with every symbol bound (LD_BIND_NOW) against the bundle's libraries, the venv's
#      torch wheels (cuBLAS, NCCL) and nothing else;
#   2. the prebuilt build's CPU tests (ctest -LE gpu; the GPU tests skip without a GPU anyway), the
#      Python client's suite among them, with the venv's torch against the prebuilt library;
#   3. the fallback: scripts/gpu_check.sh --build-only with the prebuilt binaries taken away, i.e.
#      a Release sm_90 build from the bundle's headers and libraries alone, then its CPU tests;
#   4. scripts/gpu_check.sh itself (no GPU here: it stops at nvidia-smi with exit 2 and a report).
# Prints one line per step and "GPU BUNDLE PROOF PASSED" or "... FAILED"; logs in
# build-gpu-root/logs/. Exit 0 when every step passed.
#
# Usage (as root, from the repo; run scripts/gpu_bundle.py first):
#   scripts/gpu_isolated_build.sh            # all steps
#   STEPS="prepare fallback" scripts/gpu_isolated_build.sh
# Takes (2 cores): the root and venv once ~10 min (debootstrap ~5, torch ~5 of download); then
# prepare+CPU tests ~6 min, the fallback build ~25 min. Needs ~6 GB of disk in build-gpu-root/.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
GROOT=${GPU_ROOT:-$REPO/build-gpu-root}
SYSROOT=$GROOT/root
LOGS=$GROOT/logs
SUITE=${DEBIAN_SUITE:-bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_VERSION=${TORCH_VERSION:-2.11.0}
STEPS=${STEPS:-prepare cpu_tests fallback check}
CUDA_HOME=$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")
# Where the copy of the tree lives inside the root: not the host's path, so that nothing can
# reach the host's checkout by its name.
INNER=/root/muon-offload
mkdir -p "$LOGS"

say() { echo "gpu_isolated_build: $*"; }
die() { say "FATAL: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "run as root (debootstrap, mounts and chroot need it)"
[[ -x $CUDA_HOME/bin/nvcc ]] || die "no CUDA toolkit at $CUDA_HOME (set CUDA_HOME)"

# ---- the root: Debian minbase + g++ + python3-venv, nothing else ------------------------------
make_root() {
  [[ -f $SYSROOT/.muon-root-ready ]] && return
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
  say "debootstrap $SUITE into $SYSROOT (a few minutes)"
  rm -rf "$SYSROOT"
  mkdir -p "$SYSROOT"
  debootstrap --variant=minbase --include=g++,python3,python3-venv,ca-certificates \
    "$SUITE" "$SYSROOT" "$MIRROR" >"$LOGS/debootstrap.log" 2>&1 ||
    die "debootstrap failed (see $LOGS/debootstrap.log)"
  touch "$SYSROOT/.muon-root-ready"
}

# in_root CMD [cuda]: runs CMD (a bash string) in the root, in a private mount namespace that sees
# /proc, /dev, /dev/shm and, with "cuda", the CUDA toolkit (its NCCL hidden), nothing else of
# this host. Without "cuda" the root is a machine with a driver's runtime and torch's wheels only.
in_root() {
  unshare --mount --fork -- bash -euo pipefail -c '
    R=$1 CUDA=$2 CMD=$3 WITH=$4
    mount --make-rprivate /
    mount -t proc proc "$R/proc"
    mount --rbind /dev "$R/dev"
    mkdir -p "$R/dev/shm" && mount -t tmpfs -o size=4g tmpfs "$R/dev/shm"
    mkdir -p "$R$CUDA"
    rm -f "$R/usr/local/cuda"
    if [[ $WITH = cuda ]]; then
      mount --bind -o ro "$CUDA" "$R$CUDA"
      ln -sfn "$CUDA" "$R/usr/local/cuda"
      # The GPU machine takes NCCL from the torch wheel (nvidia/nccl), not from the toolkit.
      empty=$(mktemp -d)
      while IFS= read -r f; do
        if [[ -d $f ]]; then mount --bind "$empty" "$R$f"; else mount --bind /dev/null "$R$f"; fi
      done < <(find "$CUDA/include" "$CUDA/lib" -maxdepth 1 -name "*nccl*")
    fi
    cp -L /etc/resolv.conf "$R/etc/resolv.conf"
    # Every machine (the image of the GPU machine too) has /etc/hosts: without it localhost does not
    # resolve and the rendezvous store of torchrun cannot be reached.
    cp -L /etc/hosts "$R/etc/hosts"
    cp -L /etc/ssl/certs/ca-certificates.crt "$R/etc/ssl/certs/host-ca.crt"
    exec chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
      PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:/usr/bin:/bin:/usr/sbin:/sbin \
      PIP_CERT=/etc/ssl/certs/host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 \
      MUON_OFFLOAD_PYTHON=/opt/torch/.venv/bin/python3 \
      bash -euo pipefail -c "$CMD"
  ' in_root "$SYSROOT" "$CUDA_HOME" "$1" "${2:-}"
}

# ---- the venv: torch (with its CUDA wheels), CMake, ninja, pytest, as on the GPU machine -------
make_venv() {
  [[ -f $SYSROOT/.muon-venv-ready ]] && return
  say "venv /opt/torch/.venv in the root: torch==$TORCH_VERSION, cmake, ninja, pytest (~3 GB)"
  in_root "python3 -m venv /opt/torch/.venv && \
    /opt/torch/.venv/bin/pip install -q torch==$TORCH_VERSION cmake ninja pytest numpy" cuda \
    >"$LOGS/venv.log" 2>&1 || die "venv install failed (see $LOGS/venv.log)"
  touch "$SYSROOT/.muon-venv-ready"
}

case "${1:-}" in
  --root-only) make_root; make_venv; say "root ready: $SYSROOT"; exit 0 ;;
esac
make_root
make_venv

[[ -f .gpu-bundle/MANIFEST.json ]] || die "no .gpu-bundle/ here: run scripts/gpu_bundle.py pack first"

# ---- the copy of what travels: tracked and untracked-not-ignored files, and the bundle --------
say "copying the tree (as the GPU machine gets it) and .gpu-bundle into the root at $INNER"
rm -rf "$SYSROOT$INNER" "$SYSROOT/tmp/muon-offload-gpu"
mkdir -p "$SYSROOT$INNER/.gpu-bundle"
git ls-files -co --exclude-standard -z | tar --null -T - -cf - | tar -xf - -C "$SYSROOT$INNER"
cp .gpu-bundle/MANIFEST.json .gpu-bundle/*.tar.xz "$SYSROOT$INNER/.gpu-bundle/"
say "what travels: $(du -sb "$SYSROOT$INNER" | cut -f1 | awk '{ printf "%.1f MiB", $1 / 1048576 }') of 64 MiB"

FAILED=()
# step NAME [cuda] CMD: one step in the root, its output in logs/NAME.log.
step() {
  local name=$1 with=$2 cmd=$3 t=$SECONDS
  [[ " $STEPS " == *" $name "* ]] || return 0
  if in_root "cd $INNER && $cmd" "$with" >"$LOGS/$name.log" 2>&1; then
    say "$name: passed ($((SECONDS - t)) s)"
  else
    say "$name: FAILED ($((SECONDS - t)) s; tail of $LOGS/$name.log:)"
    tail -25 "$LOGS/$name.log" | sed 's/^/    /'
    FAILED+=("$name")
  fi
}
# The environment gpu_check.sh --prepare leaves (library path, build, client library).
ENV="source /root/out/gpu_env.sh"
# ctest's CPU tests of a build: those whose program the build has (it builds muon_gpu_check
# only); the Python suite (label python) runs with the venv's torch (MUON_OFFLOAD_PYTHON).
cpu_ctest() {
  echo "names=\$(ctest --test-dir $1 --show-only=json-v1 | python3 -c 'import json, os, sys
print(\"|\".join(\"^\" + t[\"name\"] + \"\$\" for t in json.load(sys.stdin)[\"tests\"]
                if not os.access((t.get(\"command\") or [\"/none\"])[0], os.X_OK)))') &&" \
       "ctest --test-dir $1 -LE gpu \${names:+-E \"\$names\"} -j2 --output-on-failure --timeout 600"
}

step prepare "" "OUT=/root/out scripts/gpu_check.sh --prepare && cat /root/out/gpu_report.txt"
step cpu_tests "" "$ENV && $(cpu_ctest /tmp/muon-offload-gpu/build-gpu-prebuilt)"
# gpu_check.sh's limits are sized for the GPU machine's 16 cores: stretched here by 16/cores + 1.
SLOW_HERE=$((16 / $(nproc) + 1))
step fallback cuda "OUT=/root/out-fallback JOBS=$(nproc) SLOW=$SLOW_HERE BUDGET_S=$((470 * SLOW_HERE)) \
  scripts/gpu_check.sh --build-only && \
  source /root/out-fallback/gpu_env.sh && $(cpu_ctest build-gpu)"
step check cuda "OUT=/root/out-check scripts/gpu_check.sh --dry-run; rc=\$?; cat /root/out-check/gpu_report.txt; exit \$rc"

if [[ ${#FAILED[@]} -eq 0 ]]; then say "GPU BUNDLE PROOF PASSED ($STEPS)"; else say "GPU BUNDLE PROOF FAILED: ${FAILED[*]}"; exit 1; fi
