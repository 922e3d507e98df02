"""Compute layouts named per parameter (muon_offload.compute_layouts): the resolution rules, the
plan's row_blocks as the default, the optimizer's result with a pattern bitwise the one with the
same explicit row_splits (and not the whole-matrix one), and how a sharded rank's local rows
fall into the blocks (StorageLayout.row_segments)."""
import json

import pytest
import torch
from torch.distributed.tensor import Shard

from helpers import TinyNet, train
from muon_offload import InProcessMuon, InvalidArgument
from muon_offload.compute_layouts import match, resolve
from muon_offload.layouts import layout_at

KW = dict(lr=0.03, weight_decay=0.05, adamw_lr=2e-3)


def test_resolution_rules_and_refusals():
    assert resolve("w", (12, 8), (12, 8), None) == (False, [12])
    assert resolve("w", (12, 8), (12, 8), "row_blocks:3") == (False, [4, 4, 4])
    assert resolve("w", (12, 8), (12, 8), {"row_blocks": 2}) == (False, [6, 6])
    assert resolve("w", (12, 8), (12, 8), [8, 2, 2]) == (False, [8, 2, 2])
    assert resolve("e", (3, 4, 5), (3, 4, 5), "per_expert") == (False, [4])
    assert resolve("e", (3, 4, 5), (3, 4, 5), "whole") == (True, [3])
    for bad, what in (("row_blocks:5", "divides"), ([6, 2], "sum to"), ("rows", "is not"),
                      ("per_expert", "3-D")):
        with pytest.raises(InvalidArgument, match=what) as e:
            resolve("blocks.0.qkv", (12, 8), (12, 8), bad)
        assert "blocks.0.qkv" in str(e.value)
    pats = {"blocks.*.qkv.weight": "row_blocks:3", "blocks.1.qkv.weight": "whole",
            "*.weight": "whole"}
    assert match("blocks.0.qkv.weight", pats) == "row_blocks:3"
    assert match("blocks.1.qkv.weight", pats) == "whole"  # an exact name wins
    assert match("fc.weight", pats) == "whole" and match("fc.bias", pats) is None


def _run(**kw):
    model = TinyNet()
    opt = InProcessMuon(model.named_parameters(), **KW, **kw)
    train(model, opt, 3)
    return [p.detach().clone() for p in model.parameters()], opt


def test_pattern_plan_and_row_splits_agree(tmpdir_private, monkeypatch):
    splits, opt = _run(row_splits={"fc1.weight": [12, 12], "fc2.weight": [6, 6]})
    assert {m.name: m.blocks for m in opt._meta.values()}["fc1.weight"] == [12, 12]
    pattern, opt = _run(compute_layouts={"fc?.weight": "row_blocks:2"})
    whole, _ = _run()
    assert all(torch.equal(a, b) for a, b in zip(splits, pattern))
    assert not all(torch.equal(a, b) for a, b in zip(splits, whole))
    plan = tmpdir_private / "plan.json"
    plan.write_text(json.dumps({"schema": "muon-offload-plan/1", "parameters": [
        {"name": "fc1.weight", "row_blocks": 2}, {"name": "fc2.weight", "row_blocks": 2},
        {"name": "experts", "row_blocks": 1}]}))
    monkeypatch.setenv("MUON_OFFLOAD_PLAN", str(plan))
    planned, _ = _run()
    assert all(torch.equal(a, b) for a, b in zip(splits, planned))
    # A pattern overrides the plan.
    overridden, _ = _run(compute_layouts={"fc*": "whole"})
    assert all(torch.equal(a, b) for a, b in zip(whole, overridden))


def test_local_rows_fall_into_their_blocks():
    # 6 x 4 by rows over 4 ranks (2, 2, 1, 1 rows); blocks of 1 and 5 rows.
    r0 = layout_at("w", (6, 4), [Shard(0)], [4], [0])
    assert r0.row_segments([1, 5], 0) == [(0, 4, 1), (4, 8, 5)]
    r1 = layout_at("w", (6, 4), [Shard(0)], [4], [1])
    assert r1.row_segments([1, 5], 0) == [(0, 8, 5)]
    # A column shard: every local row is in the block of its global row.
    c1 = layout_at("w", (6, 4), [Shard(1)], [2], [1])
    assert c1.row_segments([2, 4], 0) == [(0, 4, 2), (4, 12, 4)] and c1.local_shape == (6, 2)
    # An expert stack [2, 4, 3] cut by rows over 2 ranks; blocks of 1 and 3 rows per expert.
    e0 = layout_at("e", (2, 4, 3), [Shard(1)], [2], [0])
    assert e0.row_segments([1, 3], 1) == [(0, 3, 1), (3, 6, 3), (6, 9, 1), (9, 12, 3)]
    empty = layout_at("w", (1, 4), [Shard(0)], [2], [1])
    assert empty.wanted == () and empty.row_segments([1], 0) == []
