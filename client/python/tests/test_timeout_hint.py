"""A wait that runs past its timeout says which knob sets it and how to look at the servers."""
import pytest

import muon_offload
import muon_offload.errors
from muon_offload import Client


def test_timeout_names_the_knob_and_the_way_to_look(server):
    # Rank 0 of a job of 2 registers alone: rank 1 never comes, so the wait for the
    # registration runs into the client's timeout.
    c = Client([server.socket], rank=0, world_size=2, op_timeout_ms=300)
    try:
        with pytest.raises(muon_offload.Timeout) as e:
            c.register("w", (4, 6))
        text = str(e.value)
        assert "timeout_s" in text and "op_timeout_ms" in text, text
        assert "muon-offload status --job NAME" in text, text
        assert e.value.code == muon_offload.errors.MUON_ERR_TIMEOUT
    finally:
        c.close()
    # The hint is added once, whatever re-raises it.
    again = muon_offload.Timeout(text)
    assert str(again).count("muon-offload status --job") == 1
