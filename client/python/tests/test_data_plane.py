"""The data plane choice (``data_plane=`` / ``MUON_OFFLOAD_DATA_PLANE``) and CUDA tensors.

CPU-only here: the argument and environment checks, a CPU server refusing cuda_ipc with its
reason, and the host path unchanged. The GPU tests (CUDA tensors over shm and cuda_ipc, bitwise
against host buffers) skip where torch sees no GPU.
"""
import numpy as np
import pytest
import torch

from helpers import TinyNet, same_params, train
from muon_offload import (Client, InvalidArgument, MuonOffloadError, ServerError, has_cuda,
                          local_update)
from muon_offload.torch import InProcessMuon, OffloadMuon

OPTS = {"mu": 0.9, "nesterov": True}
KW = dict(lr=0.02, momentum=0.9, weight_decay=0.01, adamw_lr=1e-2)
NO_SOCKET = "/nonexistent/muon-offload.sock"


def test_unknown_data_plane_is_refused_before_connecting():
    with pytest.raises(InvalidArgument, match=r"data_plane='nvlink'.*shm, cuda_ipc"):
        Client([NO_SOCKET], data_plane="nvlink", connect_timeout_ms=100)


def test_data_plane_from_the_environment_is_checked(monkeypatch):
    monkeypatch.setenv("MUON_OFFLOAD_DATA_PLANE", "gpu")
    with pytest.raises(InvalidArgument, match="MUON_OFFLOAD_DATA_PLANE='gpu'"):
        Client([NO_SOCKET], connect_timeout_ms=100)
    # An explicit argument wins over the environment.
    with pytest.raises(MuonOffloadError, match="data plane shm") as e:
        Client([NO_SOCKET], data_plane="shm", connect_timeout_ms=100)
    assert not isinstance(e.value, InvalidArgument)


def test_cpu_server_refuses_cuda_ipc_with_its_reason(server_factory, monkeypatch):
    s = server_factory(extra=["--backend", "cpu"])
    with pytest.raises(ServerError, match="cuda_ipc") as e:
        Client([s.socket], data_plane="cuda_ipc")
    assert "cpu" in str(e.value)
    assert e.value.server_code == "unsupported"
    monkeypatch.setenv("MUON_OFFLOAD_DATA_PLANE", "cuda_ipc")
    with pytest.raises(ServerError, match="cuda_ipc"):
        OffloadMuon(TinyNet().named_parameters(), servers=[s.socket], **KW)
    # The refused hellos left nothing behind: rank 0 connects over shm and trains.
    monkeypatch.setenv("MUON_OFFLOAD_DATA_PLANE", "shm")
    m, ref = TinyNet(), TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[s.socket], **KW)
    assert opt._client.data_plane == "shm"
    train(m, opt, 2)
    train(ref, InProcessMuon(ref.named_parameters(), data_plane="cuda_ipc", **KW), 2)
    assert same_params(m, ref)
    opt.close()


def test_host_path_unchanged_with_explicit_shm(server):
    shape, n = (6, 10), 60
    g = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    with Client([server.socket], data_plane="shm") as c:
        assert c.data_plane == "shm"
        c.register("w", shape, OPTS)
        c.push("w", 0, 0, g)
        c.commit("w", 0)
        out = torch.empty(n)
        assert c.wait_update("w", 0, out)
    ref = np.empty(shape, np.float32)
    local_update("w", shape, OPTS, g, np.zeros(shape, np.float32), ref, threads=1)
    assert np.array_equal(out.numpy().reshape(shape), ref)
    assert isinstance(has_cuda(), bool)


# ---- GPU (skipped without one) ------------------------------------------------------------------

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")


def _round_trip(socket, plane, g, steps=2):
    """Pushes g (CUDA, in two pieces) per step and waits into a CUDA tensor; returns the updates
    on the host."""
    shape, n = tuple(g.shape), g.numel()
    outs = []
    with Client([socket], data_plane=plane) as c:
        c.register("w", shape, OPTS)
        flat = g.contiguous().view(-1)
        for step in range(steps):
            c.push("w", step, 0, flat[:n // 3])
            c.push("w", step, n // 3, flat[n // 3:])
            c.commit("w", step)
            out = torch.empty(n, device=g.device)
            assert c.wait_update("w", step, out)
            outs.append(out.cpu())
    return outs


@gpu
def test_cuda_tensors_over_shm_and_cuda_ipc_match_host(server_factory):
    if not has_cuda():
        pytest.skip("the client library was built without CUDA")
    s = server_factory(extra=["--backend", "cuda"])
    g = torch.randn(96, 128, generator=torch.Generator().manual_seed(2))
    host = []
    with Client([s.socket], data_plane="shm", rank=0) as c:
        c.register("w", tuple(g.shape), OPTS)
        for step in range(2):
            c.push("w", step, 0, g.contiguous().view(-1))
            c.commit("w", step)
            out = torch.empty(g.numel())
            assert c.wait_update("w", step, out)
            host.append(out)
    for plane in ("shm", "cuda_ipc"):
        s2 = server_factory(name=f"s-{plane}", extra=["--backend", "cuda"])
        got = _round_trip(s2.socket, plane, g.cuda())
        for a, b in zip(got, host):
            assert torch.equal(a, b), plane


@gpu
def test_offload_muon_with_cuda_parameters_over_cuda_ipc(server_factory):
    if not has_cuda():
        pytest.skip("the client library was built without CUDA")
    runs = {}
    for plane in ("shm", "cuda_ipc"):
        s = server_factory(name=f"t-{plane}", extra=["--backend", "cuda"])
        m = TinyNet().cuda()
        opt = OffloadMuon(m.named_parameters(), servers=[s.socket], data_plane=plane, **KW)
        assert opt._device_io
        for step in range(2):
            opt.zero_grad(set_to_none=True)
            x = torch.randint(16, (4, 6), generator=torch.Generator().manual_seed(step)).cuda()
            m(x, (x * 3 + 1) % 16).backward()
            opt.step()
        runs[plane] = [p.detach().cpu() for p in m.parameters()]
        opt.close()
    assert all(torch.equal(a, b) for a, b in zip(runs["shm"], runs["cuda_ipc"]))
