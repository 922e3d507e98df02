"""Fixtures: real muon-offloadd servers on temporary sockets.

Binaries: $MUON_OFFLOAD_BIN_DIR (a build directory, or a folder holding the binaries; CTest sets
it), else <repo>/build. The client library: $MUON_OFFLOAD_LIB (CTest sets it), else
<repo>/build/client. Servers run with --threads 1 so that their updates are bitwise those of the
in-process kernels at 1 thread.
"""
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

# One BLAS thread, before torch loads OpenBLAS (shared with the Muon kernels, see the example).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# auto's Newton-Schulz choices in a table of the tests' own, not the user's ~/.cache one (the
# servers the fixtures start inherit it: server and in-process reference read the same choices).
os.environ.setdefault(
    "MUON_OFFLOAD_NS_TABLE",
    os.path.join(tempfile.gettempdir(), f"muon-offload-tests-{os.getuid()}", "ns-choices.json"),
)

import pytest  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402

torch.set_num_threads(1)


def find_binary(name: str, subdir: str) -> str:
    roots = [os.environ.get("MUON_OFFLOAD_BIN_DIR", ""), str(REPO / "build")]
    for root in roots:
        if not root:
            continue
        for cand in (pathlib.Path(root) / name, pathlib.Path(root) / subdir / name):
            if cand.is_file() and os.access(cand, os.X_OK):
                return str(cand)
    raise RuntimeError(f"{name} not found under $MUON_OFFLOAD_BIN_DIR or {REPO / 'build'}: build "
                       f"it (cmake --build build --target muon-offloadd muon-offload "
                       f"muon_offload_client) or set MUON_OFFLOAD_BIN_DIR")


if "MUON_OFFLOAD_LIB" not in os.environ and os.environ.get("MUON_OFFLOAD_BIN_DIR"):
    lib = pathlib.Path(os.environ["MUON_OFFLOAD_BIN_DIR"]) / "client" / "libmuon_offload_client.so"
    if lib.is_file():
        os.environ["MUON_OFFLOAD_LIB"] = str(lib)


class Server:
    """One muon-offloadd process on `socket`."""

    def __init__(self, socket: str, extra=(), log=None):
        self.socket = socket
        self.extra = list(extra)
        self.log = log or socket + ".log"
        self.proc = None
        self.start()

    def start(self):
        daemon = find_binary("muon-offloadd", "daemon")
        cli = find_binary("muon-offload", "cli")
        # Flags of every server of the run (python_deferred_copies: --defer-host-copies).
        args = [daemon, "--socket", self.socket, "--threads", "1", "--slot-kib", "256",
                "--log-level", "warn"] + self.extra + os.environ.get(
                    "MUON_TEST_SERVER_ARGS", "").split()
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log)
        r = subprocess.run([cli, "health", "--socket", self.socket, "--timeout-ms", "20000"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            self.kill()
            raise RuntimeError(f"muon-offloadd did not become healthy on {self.socket}: "
                               f"{r.stderr}\n{pathlib.Path(self.log).read_text()[-2000:]}")

    def stop(self, timeout=20) -> int:
        """SIGTERM: the server finishes the work in flight, writes its --snapshot, exits."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc

    def kill(self):
        """SIGKILL: no snapshot, no goodbye (a crash)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self, extra=None):
        if extra is not None:
            self.extra = list(extra)
        self.start()


@pytest.fixture
def tmpdir_private():
    with tempfile.TemporaryDirectory(prefix="muon-py-") as d:
        os.chmod(d, 0o700)
        yield pathlib.Path(d)


@pytest.fixture
def server_factory(tmpdir_private):
    servers = []

    def make(name="s", extra=()):
        s = Server(str(tmpdir_private / f"{name}.sock"), extra)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def server(server_factory):
    return server_factory()
