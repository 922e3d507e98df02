"""torch from PyPI and libmuon_offload_client.so in one process.

PyPI's torch loads its own CUDA runtime, cuBLAS and NCCL (the nvidia-* wheels under
site-packages/nvidia). libmuon_offload_client.so links none of them: it takes the CUDA runtime
(and NCCL) already in the process at its first device use, and the in-process reference
(libmuon_offload_reference.so, next to it) brings only OpenBLAS. A trainer imports torch first
and our library second; both must keep working (torch's ops, a round trip through a real server,
the reference bitwise equal to it), and the process must hold one CUDA runtime, torch's, with
nothing of the toolkit's copies beside it. The check runs in a fresh interpreter, so that the
import order is exactly the trainer's.
"""
import os
import subprocess
import sys
import textwrap

from conftest import HERE

TRAINER = textwrap.dedent("""
    import os, sys
    import torch                       # first, as in any trainer
    import torch.nn.functional as F
    x = torch.randn(64, 48, generator=torch.Generator().manual_seed(0))
    before = (x @ x.T).sum().item()

    from muon_offload import Client, local_update, has_cuda   # loads libmuon_offload_client.so
    shape = (8, 12)
    g = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    opts = {"momentum": "ema", "mu": 0.95, "nesterov": True}
    with Client([sys.argv[1]]) as c:
        c.register("coexist.w", shape, opts)
        c.push("coexist.w", 0, 0, g.view(-1))
        c.commit("coexist.w", 0)
        out = torch.empty(shape)
        assert c.wait_update("coexist.w", 0, out.view(-1))
    ref = torch.empty(shape)
    local_update("coexist.w", shape, opts, g, torch.zeros(shape), ref, threads=1)
    assert torch.equal(out, ref), "server update differs from the in-process one"
    assert out.norm().item() > 0

    # torch still works after our libraries came in.
    after = (x @ x.T).sum().item()
    assert after == before, (before, after)
    loss = F.cross_entropy(torch.randn(4, 5, requires_grad=True), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    from muon_offload import _native
    origin = _native.cuda_runtime() if has_cuda() and torch.version.cuda else "(not used)"
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps")
                   if any(k in line for k in ("libcudart", "libcublas", "libnccl"))})
    print("torch", torch.__version__, "cuda", torch.version.cuda, "client has_cuda", has_cuda(),
          "client's CUDA runtime", origin)
    print("\\n".join(libs))
    if has_cuda() and torch.version.cuda:
        assert origin.endswith("(already loaded)"), origin   # torch's, shared
    runtimes = [p for p in libs if "libcudart" in p]
    assert len(runtimes) <= 1, runtimes
    theirs = os.path.dirname(torch.__file__).rsplit("/torch", 1)[0]   # site-packages
    strays = [p for p in libs if not p.startswith(theirs)]
    assert not strays, f"CUDA libraries from outside torch's wheels: {strays}"
    print("COEXIST OK")
""")


def test_torch_first_then_client_library(server):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    r = subprocess.run([sys.executable, "-c", TRAINER, server.socket], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "COEXIST OK" in r.stdout, r.stdout
