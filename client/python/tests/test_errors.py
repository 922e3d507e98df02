"""Error paths: no server, a server that dies or restarts mid-training, refused parameters,
non-finite gradients."""
import copy
import os
import subprocess

import pytest
import torch
import torch.nn as nn

from conftest import find_binary
from helpers import TinyNet, batch, param_diff, same_params, train
from muon_offload import (ConnectionLost, InvalidArgument, MuonOffloadError, NonFiniteGradient,
                          PeerLost, ServerError, StepMismatch, Timeout, errors)
from muon_offload.torch import InProcessMuon, OffloadMuon

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)


def reference(steps):
    m = TinyNet()
    train(m, InProcessMuon(m.named_parameters(), **KW), steps)
    return m


def test_server_down(tmpdir_private):
    sock = str(tmpdir_private / "nobody.sock")
    with pytest.raises(ConnectionLost) as e:
        OffloadMuon(TinyNet().named_parameters(), servers=[sock], connect_timeout_s=0.3)
    assert sock in str(e.value) and "muon-offloadd" in str(e.value)
    assert "muon-offload health" in str(e.value)
    # The cause as a code (core/error_code.hpp's stable integer), kept through the added advice.
    assert (e.value.error_name, e.value.error_code) == ("connection_lost", 16)


def test_every_cause_of_the_library_has_its_exception_type():
    """The library's ErrorCode table (muon_error_code_name 0, 1, ... until NULL) maps onto the
    exception types by cause, not by message: the server's causes are ServerError (or a more
    specific subclass), the client's own are theirs."""
    from muon_offload import _native
    lib = _native.lib()
    names = []
    while (raw := lib.muon_error_code_name(len(names))) is not None:
        names.append(raw.decode())
    assert names[:8] == ["none", "bad_request", "protocol", "unsupported", "unauthorized",
                         "peer_lost", "timeout", "non_finite"]
    assert names.index("step_mismatch") == 14 and names.index("internal") == 20
    want = {"invalid_argument": InvalidArgument, "peer_lost": PeerLost, "timeout": Timeout,
            "non_finite": NonFiniteGradient, "step_mismatch": StepMismatch,
            "connection_lost": ConnectionLost, "device": errors.DeviceError,
            "unavailable": errors.BackendUnavailable, "internal": MuonOffloadError}
    for name in names[1:]:
        got = errors.error_class(errors.MUON_ERR_SERVER, name)
        assert got is want.get(name, ServerError), (name, got)
    # A cause this package does not know (a newer server) falls back on the return code.
    assert errors.error_class(errors.MUON_ERR_TIMEOUT, "") is Timeout
    assert errors.error_class(errors.MUON_ERR_SERVER, "from_a_newer_server") is ServerError


def test_no_server_configured(monkeypatch, tmpdir_private):
    monkeypatch.delenv("MUON_OFFLOAD_SERVERS", raising=False)
    monkeypatch.delenv("MUON_OFFLOAD_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmpdir_private))  # no server's default socket
    with pytest.raises(InvalidArgument, match="MUON_OFFLOAD_SERVERS") as e:
        OffloadMuon(TinyNet().named_parameters())
    assert str(tmpdir_private / "muon-offload" / "muon-offloadd.sock") in str(e.value)
    # An empty list is a mistake to name, not a request for the default socket.
    with pytest.raises(InvalidArgument, match=r"servers= names no server \(\[\]\)"):
        OffloadMuon(TinyNet().named_parameters(), servers=[])
    monkeypatch.setenv("MUON_OFFLOAD_SERVERS", ",")
    with pytest.raises(InvalidArgument, match="MUON_OFFLOAD_SERVERS names no server"):
        OffloadMuon(TinyNet().named_parameters())


@pytest.mark.parametrize("rule", ["MUON_OFFLOAD_SOCKET", "XDG_RUNTIME_DIR"])
def test_no_server_given_finds_a_server_at_its_default_socket(rule, monkeypatch,
                                                              tmpdir_private):
    # `muon-offloadd` with no --socket and an optimizer with no servers= meet at the server's
    # default socket: the same rule on both sides (daemon/socket_path.hpp).
    monkeypatch.delenv("MUON_OFFLOAD_SERVERS", raising=False)
    monkeypatch.delenv("MUON_OFFLOAD_SOCKET", raising=False)
    if rule == "MUON_OFFLOAD_SOCKET":
        sock = tmpdir_private / "here.sock"
        monkeypatch.setenv("MUON_OFFLOAD_SOCKET", str(sock))
    else:
        sock = tmpdir_private / "muon-offload" / "muon-offloadd.sock"
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmpdir_private))
    daemon = subprocess.Popen([find_binary("muon-offloadd", "daemon"), "--threads", "1",
                               "--log-level", "warn"], env=dict(os.environ))
    try:
        # `muon-offload health` without --socket finds it by the same rule.
        health = subprocess.run([find_binary("muon-offload", "cli"), "health", "--timeout-ms",
                                 "20000"], capture_output=True, text=True)
        assert health.returncode == 0, health.stderr
        assert f"ready: {sock}" in health.stdout
        m = TinyNet()
        opt = OffloadMuon(m.named_parameters(), **KW)
        assert opt.servers == [str(sock)]
        train(m, opt, 2)
        assert same_params(m, reference(2))
        opt.close()
    finally:
        daemon.terminate()
        daemon.wait(20)


def test_servers_from_the_environment(server, monkeypatch):
    monkeypatch.setenv("MUON_OFFLOAD_SERVERS", server.socket)
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), **KW)
    train(m, opt, 1)
    opt.close()


def test_server_killed_restarted_then_resumed_from_checkpoint(server):
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[server.socket], **KW)
    train(m, opt, 2)
    # state_dict() holds references to live tensors (as in torch): copy it, as torch.save would
    ckpt = copy.deepcopy({"model": m.state_dict(), "opt": opt.state_dict()})
    train(m, opt, 1, start=2)                 # a step the crash will lose
    server.kill()
    server.restart()                          # a fresh server: no momentum at all
    with pytest.raises(ConnectionLost) as e:
        train(m, opt, 1, start=3)
    msg = str(e.value)
    assert server.socket in msg and "reconnect()" in msg and "load_state_dict" in msg
    opt.reconnect()
    # The fresh server's momentum does not match: training refuses until a checkpoint is loaded.
    with pytest.raises(MuonOffloadError, match="load_state_dict"):
        train(m, opt, 1, start=3)
    m.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    train(m, opt, 3, start=2)
    assert same_params(m, reference(5)), param_diff(m, reference(5))
    opt.close()


def test_server_restarted_from_its_snapshot(server_factory, tmpdir_private):
    snap = str(tmpdir_private / "momentum.safetensors")
    s = server_factory("snap", extra=["--snapshot", snap])
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[s.socket], **KW)
    train(m, opt, 2)
    opt.snapshot()                             # the server writes its --snapshot path
    s.kill()
    s.restart(extra=["--snapshot", snap, "--restore", snap])
    opt.reconnect()                            # momentum restored: nothing else to load
    train(m, opt, 2, start=2)
    assert same_params(m, reference(4)), param_diff(m, reference(4))
    opt.close()
    # A new trainer process can adopt the server's state (steps and momentum) too.
    assert s.stop() == 0                       # SIGTERM: final snapshot, clean exit
    s.restart(extra=["--restore", snap])
    m2 = TinyNet()
    m2.load_state_dict(m.state_dict())
    opt2 = OffloadMuon(m2.named_parameters(), servers=[s.socket], resume_from_server=True, **KW)
    assert all(opt2.state[p]["step"] == 4 for p in opt2._muon_params)
    opt2.close()


def test_refused_parameters_are_named(server):
    w = nn.Parameter(torch.randn(8, 6))
    with pytest.raises(MuonOffloadError) as e:
        OffloadMuon([("blocks.0.w", w)], servers=[server.socket], schedule="no-such-schedule")
    assert "blocks.0.w" in str(e.value) and "no-such-schedule" in str(e.value)
    with pytest.raises(MuonOffloadError) as e:
        OffloadMuon([("blocks.0.qkv", w)], servers=[server.socket],
                    row_splits={"blocks.0.qkv": [3, 3]})
    assert "blocks.0.qkv" in str(e.value)
    # the same name registered again with another shape by the same job
    # (a new job, the default, would start the name fresh with its own shape: test_job_identity)
    OffloadMuon([("blocks.0.x", w)], servers=[server.socket], job="one job").close()
    with pytest.raises(ServerError) as e:
        OffloadMuon([("blocks.0.x", nn.Parameter(torch.randn(6, 8)))], servers=[server.socket],
                    job="one job")
    assert "blocks.0.x" in str(e.value)
    assert (e.value.error_name, e.value.error_code) == ("bad_request", 1)
    # The refusal names its parameter and rank as fields too, not only in the message.
    assert (e.value.param, e.value.step, e.value.rank) == ("blocks.0.x", -1, 0)
    with pytest.raises(InvalidArgument, match="mode"):
        OffloadMuon([("w", w)], servers=[server.socket], mode="ring")


def test_nonfinite_gradient_is_refused_then_training_goes_on(server):
    m = TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[server.socket], **KW)
    train(m, opt, 1)
    # Gradients set by hand (no backward: step() pushes them), one of them NaN.
    opt.zero_grad()
    for p in m.parameters():
        p.grad = torch.full_like(p, 0.01)
    m.fc1.weight.grad = torch.full_like(m.fc1.weight, float("nan"))
    fc1, fc2 = m.fc1.weight.detach().clone(), m.fc2.weight.detach().clone()
    with pytest.raises(NonFiniteGradient, match="fc1.weight") as e:
        opt.step()
    assert (e.value.error_name, e.value.error_code) == ("non_finite", 7)
    assert torch.equal(m.fc1.weight, fc1)           # refused: not updated
    assert not torch.equal(m.fc2.weight, fc2)       # the others were
    train(m, opt, 2, start=2)                       # the step was consumed; training goes on
    assert all(torch.isfinite(p).all() for p in m.parameters())
    opt.close()


def test_push_refuses_a_buffer_of_the_wrong_size_or_dtype_and_loses_nothing(server):
    """A push reads `count` elements of the grad dtype from the buffer: a shorter buffer, or one
    of another dtype (float64, bf16 for an f32 gradient), is refused before anything is sent.
    The right push afterwards gives bitwise the update of a parameter that never saw the refused
    ones."""
    from muon_offload import Client
    c = Client([server.socket])
    c.register("w", (8, 4))
    c.register("v", (8, 4))
    g = torch.randn(8, 4)
    with pytest.raises(InvalidArgument, match="128 bytes"):
        c.push("w", 0, 0, torch.arange(4, dtype=torch.float32), count=32)
    with pytest.raises(InvalidArgument, match="torch.float64"):
        c.push("w", 0, 0, g.double())
    with pytest.raises(InvalidArgument, match="bf16|bfloat16"):
        c.push("w", 0, 0, g.bfloat16())
    outs = []
    for name in ("w", "v"):
        c.push(name, 0, 0, g)
        c.commit(name, 0)
        out = torch.empty(8, 4)
        assert c.wait_update(name, 0, out)
        outs.append(out)
    assert torch.equal(outs[0].view(torch.int32), outs[1].view(torch.int32))
    c.close()


def test_each_cause_a_real_server_sends_reaches_python_as_its_type(server_factory):
    """A real muon-offloadd sends each cause as its ErrorCode on the wire (core/error_code.hpp);
    the client library hands it to Python as muon_last_error_code() and errors.error_class picks
    the type from it alone: non_finite, step_mismatch, bad_request, timeout and unsupported, each
    the exact class (a plain ServerError is no subclass) with the cause's name and integer."""
    import threading

    from muon_offload import Client
    s = server_factory("causes", extra=["--step-timeout-ms", "1500"])

    def raised(f):
        with pytest.raises(MuonOffloadError) as e:
            f()
        return type(e.value), e.value.error_name, e.value.error_code

    out = torch.empty(8, 4)
    with Client([s.socket]) as c:
        c.register("w", (8, 4))
        # non_finite: a NaN gradient under the default policy; the step is consumed (step 0).
        c.push("w", 0, 0, torch.full((8, 4), float("nan")))
        c.commit("w", 0)
        assert raised(lambda: c.wait_update("w", 0, out)) == (NonFiniteGradient, "non_finite", 7)
        # step_mismatch: step 3 after step 0 is a gap; the push's error waits for step 3.
        c.push("w", 3, 0, torch.ones(8, 4))
        assert raised(lambda: c.wait_update("w", 3, out)) == (StepMismatch, "step_mismatch", 14)
        # bad_request: a commit of a step with no data from this rank.
        c.commit("w", 1)
        assert raised(lambda: c.wait_update("w", 1, out)) == (ServerError, "bad_request", 1)
        # The session lives on: step 1 pushed properly gives an update.
        c.push("w", 1, 0, torch.ones(8, 4))
        c.commit("w", 1)
        assert c.wait_update("w", 1, out)

    # timeout: rank 1 of 2 registers but never pushes; the server's step timeout (1.5 s) fails
    # rank 0's step with the server's own verdict.
    ranks = [Client([s.socket], rank=r, world_size=2) for r in (0, 1)]
    threads = [threading.Thread(target=c.register, args=("t", (8, 4))) for c in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ranks[0].push("t", 0, 0, torch.ones(8, 4))
    ranks[0].commit("t", 0)
    with pytest.raises(Timeout) as e:
        ranks[0].wait_update("t", 0, out)
    assert (type(e.value), e.value.error_name, e.value.error_code) == (Timeout, "timeout", 6)
    assert "did not commit within 1500 ms" in str(e.value), str(e.value)
    # What the server's verdict names comes as fields, and picks the server's knob for the hint.
    assert (e.value.param, e.value.step, e.value.rank) == ("t", 0, 1)
    assert "--step-timeout-ms" in str(e.value), str(e.value)
    for c in ranks:
        c.close()

    # unsupported: a data plane a CPU server cannot serve, refused in the hello.
    assert raised(lambda: Client([s.socket], data_plane="cuda_ipc")) == (
        ServerError, "unsupported", 3)


def test_a_second_optimizer_in_one_process_is_refused_saying_what_to_do(server):
    # The server keys sessions by rank: a second optimizer of this trainer is rank 0 again.
    a, b = TinyNet(), TinyNet()
    first = OffloadMuon(a.named_parameters(), servers=[server.socket], prefix="a/", **KW)
    with pytest.raises(ServerError) as e:
        OffloadMuon(b.named_parameters(), servers=[server.socket], prefix="b/", **KW)
    msg = str(e.value)
    assert "rank 0 is already connected" in msg and "one optimizer per trainer process" in msg
    assert msg.count(f"pid {os.getpid()}") == 2, msg  # both clients named: this process twice
    assert "param group" in msg and "close()" in msg
    train(a, first, 1)  # the first goes on
    first.close()
    # Once the first is closed, another connects.
    second = OffloadMuon(b.named_parameters(), servers=[server.socket], prefix="b/", **KW)
    second.close()


@pytest.mark.filterwarnings("ignore:muon_offload.*name rule")  # Sequential names, on purpose
def test_two_models_whose_names_collide_in_one_optimizer_are_refused():
    # Two nn.Sequential both name their weights "0.weight": as two param groups of one optimizer
    # the names would key one server parameter twice (the first step then fails obscurely).
    enc, dec = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4))
    groups = [{"params": enc.named_parameters()}, {"params": dec.named_parameters(), "lr": 0.01}]
    with pytest.raises(InvalidArgument, match="two tensors are both named '0.weight'"):
        InProcessMuon(groups)
    opt = InProcessMuon([{"params": enc.named_parameters()},
                         {"params": [(f"dec.{n}", p) for n, p in dec.named_parameters()]}])
    assert set(opt.routing) == {"0.weight", "0.bias", "dec.0.weight", "dec.0.bias"}
