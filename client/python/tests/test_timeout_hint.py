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
        # The client's own wait names no step: not the server's step timeout.
        assert (e.value.step, e.value.param) == (-1, "")
        assert "--step-timeout-ms" not in text, text
    finally:
        c.close()
    # The hint is added once, whatever re-raises it.
    again = muon_offload.Timeout(text)
    assert str(again).count("muon-offload status --job") == 1


def test_a_servers_registration_timeout_names_the_servers_knob(server_factory):
    # The server's own verdict on a registration (rank 1 never registers) names the parameter
    # and no step; the wait was the server's --step-timeout-ms, not the client's timeout.
    s = server_factory("s", ["--step-timeout-ms", "500"])
    c = Client([s.socket], rank=0, world_size=2, op_timeout_ms=20000)
    try:
        with pytest.raises(muon_offload.Timeout) as e:
            c.register("w", (4, 6))
        text = str(e.value)
        assert e.value.error_name == "timeout", text
        assert "incomplete after 500 ms" in text, text
        assert (e.value.param, e.value.step) == ("w", -1), text
        assert "--step-timeout-ms" in text and "never registered" in text, text
        assert "timeout_s" not in text, text
    finally:
        c.close()
