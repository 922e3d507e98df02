"""Where muon_offload finds its two libraries: the client (libmuon_offload_client.so, every
trainer) and the in-process reference (libmuon_offload_reference.so, only local_update and
InProcessMuon). Each case runs in a fresh interpreter on copies of the package and the libraries
in a temporary folder, so that nothing of this checkout's build is found by accident.
"""
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

from conftest import HERE
from muon_offload import _native

PACKAGE = HERE.parent / "muon_offload"

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from muon_offload import _native, local_update, has_cuda
    has_cuda()                                    # the client library is loaded ...
    def mapped(name):
        return any(name in line for line in open("/proc/self/maps"))
    assert not mapped("libmuon_offload_reference"), "reference loaded with the client"
    g = np.random.default_rng(0).standard_normal((6, 10)).astype(np.float32)
    m, u = np.zeros_like(g), np.zeros_like(g)
    try:
        assert local_update("w", g.shape, {"mu": 0.9}, g, m, u, threads=1)
    except _native.MuonOffloadError as e:
        print("ERROR", e)
        sys.exit(3)
    assert mapped("libmuon_offload_reference"), "reference not loaded by local_update"
    assert np.abs(u).max() > 0 and np.array_equal(m, g)   # momentum "sum" from zero: M = G
    print("REFERENCE", _native.reference_library_path())
""")


def layout(tmp_path: pathlib.Path, with_reference: bool) -> pathlib.Path:
    """<tmp>/repo/client/python/muon_offload (a checkout without a build folder) and
    <tmp>/lib/ holding the client library, and the reference beside it when asked."""
    pkg = tmp_path / "repo" / "client" / "python"
    shutil.copytree(PACKAGE, pkg / "muon_offload", ignore=shutil.ignore_patterns("__pycache__"))
    lib = tmp_path / "lib"
    lib.mkdir()
    client = pathlib.Path(_native.library_path())
    shutil.copy(client, lib / client.name)
    if with_reference:
        shutil.copy(client.parent / "libmuon_offload_reference.so", lib)
    return pkg


def run(pkg: pathlib.Path, env_extra: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "MUON_OFFLOAD_REFERENCE_LIB"}
    env.update(PYTHONPATH=str(pkg), **env_extra)
    return subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True,
                          timeout=120)


def test_reference_is_found_next_to_the_client_library(tmp_path):
    pkg = layout(tmp_path, with_reference=True)
    r = run(pkg, {"MUON_OFFLOAD_LIB": str(tmp_path / "lib" / "libmuon_offload_client.so")})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"REFERENCE {tmp_path / 'lib' / 'libmuon_offload_reference.so'}" in r.stdout, r.stdout


def test_reference_from_the_environment_wins(tmp_path):
    pkg = layout(tmp_path, with_reference=False)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ref = pathlib.Path(_native.reference_library_path())
    shutil.copy(ref, elsewhere)
    r = run(pkg, {"MUON_OFFLOAD_LIB": str(tmp_path / "lib" / "libmuon_offload_client.so"),
                  "MUON_OFFLOAD_REFERENCE_LIB": str(elsewhere / ref.name)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"REFERENCE {elsewhere / ref.name}" in r.stdout, r.stdout


def test_missing_reference_names_where_it_looked_and_how_to_fix_it(tmp_path):
    pkg = layout(tmp_path, with_reference=False)
    r = run(pkg, {"MUON_OFFLOAD_LIB": str(tmp_path / "lib" / "libmuon_offload_client.so")})
    assert r.returncode == 3, r.stdout + r.stderr
    assert "libmuon_offload_reference.so" in r.stdout
    assert str(tmp_path / "lib") in r.stdout and str(tmp_path / "repo" / "build") in r.stdout
    assert "MUON_OFFLOAD_REFERENCE_LIB" in r.stdout
    r = run(pkg, {"MUON_OFFLOAD_LIB": str(tmp_path / "lib" / "libmuon_offload_client.so"),
                  "MUON_OFFLOAD_REFERENCE_LIB": str(tmp_path / "nowhere.so")})
    assert r.returncode == 3 and f"MUON_OFFLOAD_REFERENCE_LIB={tmp_path / 'nowhere.so'} does not " \
        "exist" in r.stdout, r.stdout + r.stderr
