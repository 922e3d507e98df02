"""Jobs on one server through the Python Client (issue 13's friction list; the server side is
tested in tests/daemon/test_job_lifecycle.cpp): a new job identity starts fresh under the same
names, resume adopts the state the last job left, and a lone rank's registration timeout names
the ranks it waits for."""
import numpy as np
import pytest

from muon_offload import Client, Timeout, local_update

OPTS = {"mu": 0.9, "nesterov": True}
SHAPE = (4, 6)


def grad(step):
    return np.random.default_rng(step).standard_normal(SHAPE).astype(np.float32)


def run_step(c, step, g):
    c.push("w", step, 0, g)
    c.commit("w", step)
    out = np.empty(g.size, np.float32)
    assert c.wait_update("w", step, out)
    return out.reshape(SHAPE)


def reference(steps):
    """Updates and the final momentum of a fresh run over grad(0..steps-1)."""
    momentum = np.zeros(SHAPE, np.float32)
    updates = []
    for s in range(steps):
        u = np.empty(SHAPE, np.float32)
        local_update("w", SHAPE, OPTS, grad(s), momentum, u, threads=1)
        updates.append(u)
    return updates, momentum


def test_a_new_job_starts_fresh_and_resume_adopts_the_state(server):
    updates, momentum = reference(3)
    with Client([server.socket], job="run 1") as c:
        c.register("w", SHAPE, OPTS)
        for s in range(2):
            run_step(c, s, grad(s))
    # A rerun under the same names: was "step 0 was already applied" without prefix=.
    with Client([server.socket], job="run 2") as c:
        c.register("w", SHAPE, OPTS)
        for s in range(2):
            assert np.array_equal(run_step(c, s, grad(s)), updates[s]), s
    # A third job resumes what run 2 left: its momentum, and step 2 next.
    with Client([server.socket], job="run 3", resume=True) as c:
        c.register("w", SHAPE, OPTS)
        assert np.array_equal(run_step(c, 2, grad(2)), updates[2])
    with Client([server.socket], job="run 3") as c:  # the same job again: its state by name
        c.register("w", SHAPE, OPTS)
        m = np.empty(SHAPE, np.float32)
        assert c.fetch_momentum("w", m) == 2
        assert np.array_equal(m, momentum)


def test_a_lone_rank_hears_which_ranks_its_registration_waits_for(server):
    with Client([server.socket], rank=0, world_size=3, op_timeout_ms=1500) as c:
        with pytest.raises(Timeout) as e:
            c.register("alone", SHAPE, OPTS)
    msg = str(e.value)
    assert "within 1500 ms" in msg, msg
    assert "ranks 1, 2 of the job's 3 have not registered it" in msg, msg


def test_offload_muon_rerun_starts_fresh_without_prefix_and_resume_keeps_momentum(server):
    """OffloadMuon's own job identity (a UUID per optimizer, broadcast by rank 0): a second
    optimizer over the same names, no prefix=, starts at step 0 with zero momentum (its first
    update is bitwise the first optimizer's first update, same gradient); one made with
    resume_from_server=True adopts the momentum and step the last one left."""
    import torch
    from muon_offload import OffloadMuon

    def make():
        torch.manual_seed(0)
        return torch.nn.Linear(6, 4, bias=False)

    def step_once(opt, model, s):
        model.weight.grad = torch.from_numpy(grad(s))
        opt.step()

    first, again, resumed = make(), make(), make()
    opt = OffloadMuon(first.named_parameters(), servers=[server.socket], lr=0.02)
    w0 = first.weight.detach().clone()
    step_once(opt, first, 0)
    first_update = first.weight.detach() - w0
    step_once(opt, first, 1)
    left = opt.momentum_buffer(first.weight)
    opt.close()

    opt = OffloadMuon(again.named_parameters(), servers=[server.socket], lr=0.02)
    w0 = again.weight.detach().clone()
    step_once(opt, again, 0)  # step 0 again: no "already applied"
    assert torch.equal(again.weight.detach() - w0, first_update)
    opt.close()

    opt = OffloadMuon(resumed.named_parameters(), servers=[server.socket], lr=0.02,
                      resume_from_server=True)
    # The state the last job left: its momentum after step 0 (the rerun above).
    again_opt_momentum = opt.momentum_buffer(resumed.weight)
    assert again_opt_momentum.abs().sum() > 0
    assert not torch.equal(again_opt_momentum, left)  # the rerun's, not the first run's
    assert opt.state[resumed.weight]["step"] == 1
    opt.close()


def test_resume_from_a_server_that_holds_nothing_warns_naming_the_parameters(server):
    # Asked to resume, a server that holds none of the names (restarted without --restore,
    # forgotten, other names): the run starts at step 0, and the optimizer says so.
    import torch
    from muon_offload import OffloadMuon
    model = torch.nn.Linear(6, 4, bias=False)
    with pytest.warns(UserWarning, match=r"hold no momentum for 1 of this optimizer's 1 Muon "
                                         r"parameter\(s\) \('weight'\)"):
        opt = OffloadMuon(model.named_parameters(), servers=[server.socket], lr=0.02,
                          resume_from_server=True)
    assert "step" not in opt.state[model.weight]
    opt.close()
