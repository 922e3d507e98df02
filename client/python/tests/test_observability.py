"""What a trainer and an operator can see: ``OffloadMuon.last_step_stats`` after each step, the
step reports it sends arriving in the server's Prometheus endpoint (``--metrics-port``, read over
HTTP here), and ``Client.report_step`` on the raw client."""
import math
import socket
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from helpers import TinyNet, train
from muon_offload import Client
from muon_offload.torch import OffloadMuon


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def scrape_until(port: int, done, timeout=20.0) -> dict:
    """Step reports are handled asynchronously: scrape until `done(metrics)` holds."""
    end = time.monotonic() + timeout
    while True:
        m = scrape(port)
        if done(m) or time.monotonic() > end:
            return m
        time.sleep(0.01)


def test_last_step_stats_and_the_servers_histogram(server_factory):
    port = free_port()
    srv = server_factory(extra=["--metrics-port", str(port)])
    model = TinyNet()
    opt = OffloadMuon(model.named_parameters(), lr=0.02, servers=[srv.socket])
    assert opt.last_step_stats == {}
    muon = {n: shape for n, (kind, shape) in opt.routing.items() if kind == "muon"}
    assert sorted(muon) == ["conv.weight", "experts", "fc1.weight", "fc2.weight"]
    bytes_per_step = 4 * sum(math.prod(s) for s in muon.values())  # fp32 gradients
    steps = 3
    train(model, opt, steps)
    stats = opt.last_step_stats
    assert stats["step"] == steps - 1
    assert stats["bytes_pushed"] == bytes_per_step
    assert stats["parameters"] == len(muon)
    assert stats["slowest_parameter"] in muon
    assert 0.0 <= stats["exposed_wait_s"] <= opt.last_step_seconds
    m = scrape_until(port, lambda m: m.get("muon_offload_client_step_reports_total") == steps)
    assert m["muon_offload_client_step_reports_total"] == steps
    assert m["muon_offload_client_exposed_wait_seconds_count"] == steps
    assert m["muon_offload_client_reported_pushed_bytes_total"] == steps * bytes_per_step
    assert m['muon_offload_received_bytes_total{kind="gradient"}'] == steps * bytes_per_step
    # Step latency is labelled by the parameter's shape: every step of every parameter is counted
    # once, under its own shape.
    latency = {k: v for k, v in m.items() if k.startswith("muon_offload_step_latency_seconds_count{")}
    assert sum(latency.values()) == steps * len(muon)
    assert all(v % steps == 0 for v in latency.values())
    assert m["muon_offload_clients_connected"] == 1
    opt.close()
    m = scrape_until(port, lambda m: m.get("muon_offload_clients_connected") == 0)
    assert m["muon_offload_clients_connected"] == 0
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
    assert e.value.code == 404


def test_raw_client_report_step(server):
    c = Client([server.socket])
    c.register("a", (8, 16), {"mu": 0.9})
    c.register("b", (16, 8), {"mu": 0.9})
    g = np.linspace(-1, 1, 128, dtype=np.float32)
    out = np.empty(128, dtype=np.float32)
    for name in ("a", "b"):
        c.push(name, 0, 0, g)
        c.commit(name, 0)
    for name in ("a", "b"):
        assert c.wait_update(name, 0, out)
    r = c.report_step(0)
    assert r["step"] == 0
    assert r["bytes_pushed"] == 2 * 128 * 4
    assert r["push_frames"] == 2  # one frame each: 512 bytes fit a slot
    assert r["bytes_received"] == 2 * 128 * 4  # the two updates, f32
    assert r["parameters"] == 2
    assert r["slowest_parameter"] in ("a", "b")
    assert r["exposed_wait_s"] >= 0.0
    # The next report starts from zero.
    assert c.report_step(1) == {"step": 1, "exposed_wait_s": 0.0, "bytes_pushed": 0,
                                "push_frames": 0, "bytes_received": 0, "parameters": 0, "slowest_parameter": ""}
    c.close()
