#!/usr/bin/env bash
# Installs what muon-offload needs to build and test. Idempotent and cheap when nothing changed.
#  1. The Debian 12 packages (only those missing; needs root or sudo).
#  2. The Python packages pinned in requirements.txt (torch, numpy, pytest and their
#     dependencies), into one virtual environment outside the checkout, keyed by the hash of
#     requirements.txt: made once (PyPI's torch brings a few GB of CUDA wheels; measured 4.6 min on
#     this project's 2-core machines), reused while the pins stay the same (a hash and a file
#     test). scripts/venv-python prints its python. MUON_OFFLOAD_PYTHON=/path/to/python skips
#     this step and uses that python instead (it must have the packages already).
# The CUDA toolkit (/usr/local/cuda) is not a Debian package here; the CPU build never needs it.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

PACKAGES=(
  cmake g++ make pkg-config
  libopenblas-dev   # sgemm/ssyrk of the CPU backend
  libeigen3-dev     # SVD oracle in the tests
  libboost-dev      # Asio, Interprocess, Beast (header-only)
  libspdlog-dev libcli11-dev nlohmann-json3-dev
  prometheus-cpp-dev   # the server's metrics model and text exposition
  libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev     # XXH3 hashes of updates in the soak test (tests/soak)
  python3 python3-venv   # the base of the Python environment below; the launcher's plan reader
  fortunes          # the demo's corpus: /usr/share/games/fortunes
  numactl           # the launcher's NUMA binding of servers (a plan's numactl arguments)
  ccache            # compiler cache: a fresh clone's build reuses this machine's (CMakeLists.txt)
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
  echo "install_deps: all ${#PACKAGES[@]} Debian packages present"
else
  echo "install_deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# --- the Python environment -------------------------------------------------------------------
if [ -n "${MUON_OFFLOAD_PYTHON:-}" ]; then
  echo "install_deps: Python: MUON_OFFLOAD_PYTHON=$MUON_OFFLOAD_PYTHON (no venv made)"
  exit 0
fi
venv=$("$here/venv-python" --venv-dir)
if [ -f "$venv/.complete" ]; then
  echo "install_deps: Python environment $venv up to date"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
# One maker at a time (several checkouts or CI on one machine share the venv); the others wait.
exec 9>"$(dirname "$venv")/.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  t0=$(date +%s)
  echo "install_deps: making the Python environment $venv from requirements.txt (first time: a" \
       "few GB of downloads)"
  rm -rf "$venv"   # a half-made one (interrupted): start again
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    -r "$here/../requirements.txt"
  "$venv/bin/python" -c "import torch, numpy, pytest"
  touch "$venv/.complete"
  echo "install_deps: Python environment ready in $(( $(date +%s) - t0 )) s:" \
       "$("$venv/bin/python" -c 'import torch; print("torch", torch.__version__)')"
else
  echo "install_deps: Python environment $venv made meanwhile by another run"
fi
