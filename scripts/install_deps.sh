#!/usr/bin/env bash
# Installs the Debian 12 packages muon-offload needs to build and test. Idempotent: installs only
# what is missing, so it costs a few dpkg queries on a machine that has everything.
# The CUDA toolkit (/usr/local/cuda) is not a Debian package here; the CPU build never needs it.
set -euo pipefail

PACKAGES=(
  cmake g++ make pkg-config
  libopenblas-dev   # sgemm/ssyrk of the CPU backend
  libeigen3-dev     # SVD oracle in the tests
  libboost-dev      # Asio, Interprocess, Beast (header-only)
  libspdlog-dev libcli11-dev nlohmann-json3-dev
  prometheus-cpp-dev   # the server's metrics model and text exposition
  libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev     # XXH3 hashes of updates in the soak test (tests/soak)
  python3 python3-numpy python3-pytest   # Debian's /usr/bin/python3 runs the Python tests
  python3-torch     # the PyTorch integration (client/python), its tests and the demo
  fortunes          # the demo's corpus: /usr/share/games/fortunes
)
# --fuzz (scripts/fuzz.sh): clang-16 (clang-14 lacks std::source_location), libFuzzer, symbolizer
if [ "${1:-}" = "--fuzz" ]; then PACKAGES+=(clang-16 libclang-rt-16-dev llvm-16); fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
