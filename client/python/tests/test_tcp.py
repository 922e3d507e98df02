"""TCP endpoints and the server's token from Python: ``tcp://127.0.0.1:PORT`` with
``auth_token=`` (or ``MUON_OFFLOAD_TOKEN_FILE``) gives the same bits as the Unix socket; a wrong
or missing token is refused with ServerError ("unauthorized"); ``nccl`` is a known data plane
name (a CPU server refuses it with its reason)."""
import os
import socket

import numpy as np
import pytest

from muon_offload import BackendUnavailable, Client, ServerError

OPTS = {"mu": 0.9, "nesterov": True}
TOKEN = "python-test-token-0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tcp_server(server_factory, tmpdir_private):
    token_file = str(tmpdir_private / "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    port = free_port()
    s = server_factory(extra=["--backend", "cpu", "--listen", f"127.0.0.1:{port}",
                              "--auth-token-file", token_file])
    return s, f"tcp://127.0.0.1:{port}", token_file


def two_steps(c: Client, name: str):
    shape, n = (6, 10), 60
    c.register(name, shape, OPTS)
    out = []
    for step in range(2):
        g = np.random.default_rng(step).standard_normal(shape).astype(np.float32)
        c.push(name, step, 0, g)
        c.commit(name, step)
        u = np.empty(n, np.float32)
        assert c.wait_update(name, step, u)
        out.append(u)
    return out


def test_tcp_with_the_token_matches_the_unix_socket(tcp_server, monkeypatch):
    monkeypatch.delenv("MUON_OFFLOAD_TOKEN_FILE", raising=False)
    s, tcp, _ = tcp_server
    with Client([s.socket]) as c:
        over_unix = two_steps(c, "w_unix")
    with Client([tcp], auth_token=TOKEN) as c:
        over_tcp = two_steps(c, "w_tcp")
    for a, b in zip(over_unix, over_tcp):
        assert a.tobytes() == b.tobytes()


def test_token_file_from_the_environment(tcp_server, monkeypatch):
    s, tcp, token_file = tcp_server
    monkeypatch.setenv("MUON_OFFLOAD_TOKEN_FILE", token_file)
    with Client([tcp]) as c:
        assert len(two_steps(c, "w_env")) == 2


def test_wrong_or_missing_token_is_refused(tcp_server, monkeypatch):
    monkeypatch.delenv("MUON_OFFLOAD_TOKEN_FILE", raising=False)
    _, tcp, _ = tcp_server
    with pytest.raises(ServerError, match="token") as e:
        Client([tcp], auth_token="not-the-token-0123456789abcdef")
    assert e.value.server_code == "unauthorized"
    with pytest.raises(ServerError, match="token"):
        Client([tcp])


def test_nccl_is_a_data_plane_name(server):
    # A CPU server refuses it (or this library has no NCCL): either way not an unknown name.
    with pytest.raises((ServerError, BackendUnavailable), match="nccl"):
        Client([server.socket], data_plane="nccl")


def test_no_server_at_a_tcp_endpoint_says_how_to_start_one_there():
    """The advice for a TCP endpoint nobody listens on is the server's --listen (its --socket is
    a Unix socket path)."""
    import torch
    from muon_offload import ConnectionLost
    from muon_offload.torch import OffloadMuon
    port = free_port()
    w = torch.nn.Parameter(torch.randn(6, 4))
    with pytest.raises(ConnectionLost) as e:
        OffloadMuon([("w", w)], servers=[f"tcp://127.0.0.1:{port}"], connect_timeout_s=0.5)
    msg = str(e.value)
    assert f"muon-offloadd --listen 127.0.0.1:{port} --auth-token-file FILE" in msg, msg
    assert f"muon-offload health --socket tcp://127.0.0.1:{port}" in msg, msg
