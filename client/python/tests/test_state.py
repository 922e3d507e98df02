"""Offload vs in-process bitwise, state_dict round trip and bitwise resume, gradient
accumulation on the server."""
import io

import pytest
import torch

from helpers import TinyNet, param_diff, same_params, train
from muon_offload import MuonOffloadError
from muon_offload.torch import InProcessMuon, OffloadMuon

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)


def sched_of(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def test_offload_is_bitwise_inprocess_with_scheduler(server):
    m1, m2 = TinyNet(), TinyNet()
    off = OffloadMuon(m1.named_parameters(), servers=[server.socket], **KW)
    ref = InProcessMuon(m2.named_parameters(), **KW)
    l1 = train(m1, off, 5, sched=sched_of(off))
    l2 = train(m2, ref, 5, sched=sched_of(ref))
    assert l1 == l2
    assert same_params(m1, m2), param_diff(m1, m2)
    # The state dicts agree too: the server's momentum is the in-process momentum, bitwise.
    s1, s2 = off.state_dict(), ref.state_dict()
    assert s1["state"].keys() == s2["state"].keys()
    for k in s1["state"]:
        for key, v in s2["state"][k].items():
            v1 = s1["state"][k][key]
            assert (torch.equal(v1, v) if torch.is_tensor(v) else v1 == v), (k, key)
    assert off.exposed_seconds >= off.last_step_seconds > 0
    off.close()


def checkpoint(model, opt, sched) -> bytes:
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, buf)
    return buf.getvalue()


def restore(blob: bytes, model, opt, sched):
    ck = torch.load(io.BytesIO(blob))
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    sched.load_state_dict(ck["sched"])


def test_state_dict_round_trip_and_resume_is_bitwise(server_factory):
    # The uninterrupted run: 6 steps.
    a = server_factory("a")
    m_ref = TinyNet()
    o_ref = OffloadMuon(m_ref.named_parameters(), servers=[a.socket], **KW)
    train(m_ref, o_ref, 6, sched=sched_of(o_ref))
    o_ref.close()

    # 3 steps, a checkpoint through torch.save, a new trainer and a NEW server, 3 more steps.
    b = server_factory("b")
    m = TinyNet()
    o = OffloadMuon(m.named_parameters(), servers=[b.socket], **KW)
    s = sched_of(o)
    train(m, o, 3, sched=s)
    blob = checkpoint(m, o, s)
    o.close()
    b.stop()

    c = server_factory("c")
    m2 = TinyNet(seed=99)                   # different initial weights: all from the checkpoint
    o2 = OffloadMuon(m2.named_parameters(), servers=[c.socket], **KW)
    s2 = sched_of(o2)
    restore(blob, m2, o2, s2)
    # the round trip: what we loaded is what state_dict() gives back
    again = o2.state_dict()
    saved = torch.load(io.BytesIO(blob))["opt"]
    for k, st in saved["state"].items():
        for key, v in st.items():
            assert (torch.equal(again["state"][k][key], v) if torch.is_tensor(v)
                    else again["state"][k][key] == v), (k, key)
    train(m2, o2, 3, start=3, sched=s2)
    assert same_params(m_ref, m2), param_diff(m_ref, m2)

    # The same checkpoint resumes in process too (one state_dict format).
    m3 = TinyNet(seed=5)
    o3 = InProcessMuon(m3.named_parameters(), **KW)
    s3 = sched_of(o3)
    restore(blob, m3, o3, s3)
    train(m3, o3, 3, start=3, sched=s3)
    assert same_params(m_ref, m3), param_diff(m_ref, m3)
    o2.close()


def test_gradient_accumulation_accumulates_on_the_server(server):
    m1, m2 = TinyNet(), TinyNet()
    off = OffloadMuon(m1.named_parameters(), servers=[server.socket], **KW)
    ref = InProcessMuon(m2.named_parameters(), **KW)
    # 3 micro-batches per step: pushes of the first two accumulate on the server uncommitted;
    # the sum g1 + g2 + g3 is formed in the same order as .grad accumulates in process.
    train(m1, off, 3, micro=3)
    train(m2, ref, 3, micro=3)
    assert same_params(m1, m2), param_diff(m1, m2)
    # Forgetting no_commit() on an earlier micro-batch is an error that says what to do.
    from helpers import batch
    off.zero_grad()
    m1(*batch(0)).backward()
    with pytest.raises(MuonOffloadError, match="no_commit"):
        m1(*batch(1)).backward()
    off.close()


def test_muon_parameter_without_gradient_is_skipped(server):
    m1, m2 = TinyNet(), TinyNet()
    off = OffloadMuon(m1.named_parameters(), servers=[server.socket], **KW)
    ref = InProcessMuon(m2.named_parameters(), **KW)
    for m in (m1, m2):
        m.experts.requires_grad_(False)
    frozen = m1.experts.detach().clone()
    train(m1, off, 2)
    train(m2, ref, 2)
    assert torch.equal(m1.experts, frozen)
    assert same_params(m1, m2)
    off.close()


def test_bf16_wire(server):
    """Gradients and updates may travel as bf16 (half the bytes). Exactness of the bf16 path is
    checked in test_client.py; here the optimizer trains with it as well as with fp32."""
    m1, m2 = TinyNet(), TinyNet()
    off = OffloadMuon(m1.named_parameters(), servers=[server.socket], grad_dtype="bf16",
                      update_dtype="bf16", **KW)
    ref = InProcessMuon(m2.named_parameters(), **KW)
    start = [p.detach().clone() for p in m1.parameters()]
    l1 = train(m1, off, 4)
    l2 = train(m2, ref, 4)
    assert all(not torch.equal(p, p0) for p, p0 in zip(m1.parameters(), start))
    assert abs(l1[-1] - l2[-1]) < 0.01 * l2[-1] and l1[-1] < l1[0]
    off.close()
