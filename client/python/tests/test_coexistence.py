"""torch from PyPI and libmuon_offload_client.so in one process.

PyPI's torch loads its own CUDA runtime, cuBLAS and NCCL (the nvidia-* wheels under
site-packages/nvidia), while libmuon_offload_client.so (until the client library is made lean)
links cuBLAS, NCCL and the CUDA runtime from /usr/local/cuda. A trainer imports torch first and
our library second; both must keep working: torch's ops, and a round trip through a real server.
The check runs in a fresh interpreter, so that the import order is exactly the trainer's.
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

    # torch still works after our library (and its CUDA libraries) came in.
    after = (x @ x.T).sum().item()
    assert after == before, (before, after)
    loss = F.cross_entropy(torch.randn(4, 5, requires_grad=True), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    libs = sorted({line.split()[-1] for line in open("/proc/self/maps")
                   if any(k in line for k in ("libcudart", "libcublas.", "libnccl"))})
    print("torch", torch.__version__, "cuda", torch.version.cuda, "client has_cuda", has_cuda())
    print("\\n".join(libs))
    print("COEXIST OK")
""")


def test_torch_first_then_client_library(server):
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    r = subprocess.run([sys.executable, "-c", TRAINER, server.socket], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "COEXIST OK" in r.stdout, r.stdout
