"""OffloadMuon(overlap=False): the gradients stay in .grad until step() pushes them, so what a
training loop does between backward and step() reaches the server as it reaches torch's
optimizers: clipping (clip_grad_norm_ over every parameter), a GradScaler (unscale_, and the
steps it skips on an overflow), and a step() skipped after backward. Each loop runs side by side
with InProcessMuon, which computes from .grad in step(), and must end bitwise equal to it (two
processes, one server).

With the default overlap=True the Muon gradients are pushed and consumed during backward:
clip_grad_norm_ sees only the AdamW ones, and a skipped step() is refused at the next backward
(test_errors.py); the contrast is asserted here so that these loops prove the keyword matters."""
import pytest
import torch
import torch.multiprocessing as mp

import dist_worker
import shard_worker

from helpers import TinyNet, batch, free_port, param_diff, same_params, train
from muon_offload import MuonOffloadError
from muon_offload.torch import InProcessMuon, OffloadMuon

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)
STEPS = 8
MAX_NORM = 0.2  # below TinyNet's gradient norm (about 1 to 3): clipping is active every step


def clipped_loop(m, opt, steps=STEPS):
    """zero_grad, backward, clip_grad_norm_ over every parameter, step. Returns the norms."""
    norms = []
    train(m, opt, steps, between=lambda s: norms.append(
        float(torch.nn.utils.clip_grad_norm_(m.parameters(), MAX_NORM))))
    return norms


def test_clip_grad_norm_before_step_is_bitwise_the_in_process_reference(server):
    m, ref = TinyNet(), TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[server.socket], overlap=False, **KW)
    ref_opt = InProcessMuon(ref.named_parameters(), overlap=False, **KW)
    m(*batch(0)).backward()
    assert all(p.grad is not None for p in opt._muon_params)  # kept for the clipping
    opt.zero_grad(set_to_none=True)
    norms = clipped_loop(m, opt)
    ref_norms = clipped_loop(ref, ref_opt)
    assert norms == ref_norms  # the total norm includes the Muon gradients, as torch's does
    assert min(norms) > MAX_NORM, norms  # clipping was active at every step
    assert same_params(m, ref), param_diff(m, ref)
    assert all(p.grad is not None for p in opt._muon_params)  # kept after step(), as torch
    opt.close()


def test_with_overlap_the_muon_gradients_are_gone_before_clipping(server):
    # The contrast: the default pushes during backward, so clip_grad_norm_ sees no Muon gradient
    # and the runs part (README, "Where it differs from torch").
    m, ref = TinyNet(), TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[server.socket], **KW)
    norms = clipped_loop(m, opt, steps=2)
    ref_norms = clipped_loop(ref, InProcessMuon(ref.named_parameters(), **KW), steps=2)
    assert norms[0] < ref_norms[0]
    assert not same_params(m, ref)
    opt.close()


def scaled_loop(m, opt, steps=STEPS):
    """The AMP loop of torch.amp.GradScaler, on the CPU, from a scale so large that the first
    backward passes overflow (the loss times 1000 for gradients of 1e2 to 1e3): those steps are
    skipped, the scale halving each time, and after 3 good steps it doubles and may overflow
    again. Returns the scale before each step."""
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 120, growth_interval=3)
    scales = []
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        scaler.scale(m(*batch(s)) * 1000).backward()
        scales.append(scaler.get_scale())
        scaler.step(opt)  # unscale_ (finds the overflow), then step() unless it found one
        scaler.update()
    return scales


def test_grad_scaler_unscales_and_skips_steps_bitwise_as_in_process(server):
    m, ref = TinyNet(), TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[server.socket], overlap=False, **KW)
    scales = scaled_loop(m, opt, steps=STEPS + 4)
    ref_scales = scaled_loop(ref, InProcessMuon(ref.named_parameters(), overlap=False, **KW),
                             steps=STEPS + 4)
    assert scales == ref_scales
    skipped = sum(b < a for a, b in zip(scales, scales[1:]))
    assert skipped >= 1, scales  # at least one overflow was found and its step skipped
    taken = STEPS + 4 - skipped
    assert all(opt.state[p]["step"] == taken for p in opt._muon_params), taken
    assert same_params(m, ref), param_diff(m, ref)
    opt.close()


def skipping_loop(m, opt, skip=(1, 4, 5)):
    """A step() skipped after backward at the steps in ``skip`` (a loss spike guard, a probe
    backward): the gradients are dropped by zero_grad; the others step as usual."""
    for s in range(STEPS):
        opt.zero_grad(set_to_none=True)
        m(*batch(s)).backward()
        if s not in skip:
            opt.step()


def test_a_step_skipped_after_backward_leaves_no_trace(server):
    m, ref = TinyNet(), TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[server.socket], overlap=False, **KW)
    skipping_loop(m, opt)
    skipping_loop(ref, InProcessMuon(ref.named_parameters(), **KW))
    assert same_params(m, ref), param_diff(m, ref)
    assert all(opt.state[p]["step"] == STEPS - 3 for p in opt._muon_params)
    opt.close()


def test_with_overlap_a_skipped_step_is_refused_and_stays_in_flight_for_the_next_step(server):
    # The default pushes and commits during backward: the server applied step 0 already. The
    # next backward is refused, naming the keyword, and leaves step 0 in flight: the next step()
    # applies it (the first backward's gradient, as the server did), and the run goes on.
    m, ref = TinyNet(), TinyNet()
    opt = OffloadMuon(m.named_parameters(), servers=[server.socket], **KW)
    opt.zero_grad(set_to_none=True)
    m(*batch(0)).backward()  # pushed and committed: the server steps the momentum
    opt.zero_grad(set_to_none=True)
    with pytest.raises(MuonOffloadError, match="stays in flight(.|\n)*overlap=False"):
        m(*batch(1)).backward()
    opt.zero_grad(set_to_none=True)
    opt.step()
    assert all(opt.state[p]["step"] == 1 for p in opt._muon_params)
    train(ref, InProcessMuon(ref.named_parameters(), **KW), 1)  # step 0 on batch 0
    muon = {n for n, (kind, _) in opt.routing.items() if kind == "muon"}
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        if n in muon:
            assert torch.equal(p, q), n
    train(m, opt, 2, start=2)  # not stuck: steps 1 and 2 go through
    assert all(opt.state[p]["step"] == 3 for p in opt._muon_params)
    opt.close()


def test_two_ranks_clip_bitwise_as_in_process_under_ddp_and_without(server, tmpdir_private):
    # Under DDP, DDP averages every gradient (no communication hook with overlap=False) and
    # rank 0 pushes the Muon means; without DDP the ranks clip their local gradients and the
    # optimizer averages (server_reduce: the server sums grad/2; shard: the ranks all-reduce).
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(dist_worker.run_clipped, args=(2, init, server.socket, str(tmpdir_private)),
             nprocs=2, join=True)
    out = {(v, r): torch.load(tmpdir_private / f"{v}_{r}.pt", weights_only=False)
           for v in ("ddp", "ddp_late", "ddp_ref", "server_reduce", "shard", "bare_ref")
           for r in (0, 1)}
    muon_bytes = 4 * sum(p.numel() for n, p in TinyNet().named_parameters()
                         if n in ("conv.weight", "fc1.weight", "fc2.weight", "experts"))
    # ddp= at construction: each rank pushes its row shard of DDP's mean, the matrix once in
    # all; attached later (registered whole): rank 0 the mean, rank 1 zeros, twice in all.
    assert [out[("ddp", r)]["state"]["bytes_pushed"] for r in (0, 1)] == [muon_bytes // 2] * 2
    assert [out[("ddp_late", r)]["state"]["bytes_pushed"] for r in (0, 1)] == [muon_bytes] * 2
    for r in (0, 1):
        for variant, ref in (("ddp", "ddp_ref"), ("ddp_late", "ddp_ref"),
                             ("server_reduce", "bare_ref"), ("shard", "bare_ref")):
            got, want = out[(variant, r)], out[(ref, r)]
            # losses, then the clipped norms (all above 0.2), then the Muon .grad kept
            assert got["losses"] == want["losses"], (variant, r)
            assert all(n > 0.2 for n in got["losses"][4:8]), got["losses"]
            assert all(got["losses"][8:]), (variant, "Muon .grad dropped")
            for i, (p, q) in enumerate(zip(got["params"], want["params"])):
                assert torch.equal(p, q), f"{variant} rank {r}: parameter {i} differs"
            # The momentum too: Newton-Schulz normalizes, so a gradient pushed at half its
            # value would still give these weights.
            for i, (p, q) in enumerate(zip(got["state"]["momentum"], want["state"]["momentum"])):
                assert torch.equal(p, q), f"{variant} rank {r}: momentum {i} differs"
    for p, q in zip(out[("ddp", 0)]["params"], out[("ddp", 1)]["params"]):
        assert torch.equal(p, q)


def test_fsdp2_clips_the_sharded_gradients_as_ddp_clips_the_whole(server, tmpdir_private):
    # FSDP2's gradients are DTensor shards: clip_grad_norm_ forms the total norm from them and
    # scales each shard, which step() then pushes. The reference clips DDP's whole mean
    # gradient: the norms are summed in another order, so within 1e-6, not bitwise.
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(shard_worker.run_fsdp_clipped, args=(2, init, server.socket,
                                                  str(tmpdir_private)), nprocs=2, join=True)
    initial = dict(shard_worker.ShardNet().named_parameters())
    for r in (0, 1):
        o = torch.load(tmpdir_private / f"fsdp_clipped_{r}.pt", weights_only=False)
        assert all(n > 0.2 for n in o["ddp_norms"]), o["ddp_norms"]
        assert o["fsdp_norms"] == pytest.approx(o["ddp_norms"], rel=1e-6)
        for n, p in o["fsdp"].items():
            assert torch.allclose(p, o["ddp"][n], rtol=1e-6, atol=1e-7), \
                f"rank {r}: '{n}' off by {(p - o['ddp'][n]).abs().max().item()}"
            assert not torch.equal(p, initial[n]), f"'{n}' did not train"
