"""GPU health from nvidia-smi's CSV: another process on our GPU is 'shared', slowdown bits are
'throttled', slow launch round trips are reported. Mutations killed: our own worker's pid counted
as a stranger, the idle/application-clock bits read as throttling, a GPU's processes put on another GPU."""

from __future__ import annotations

from sparserl.farm.health import HealthWatch, parse, parse_reasons

GPUS = """0, GPU-aaaa, NVIDIA H200, 1980, 1980, 41, 0x0000000000000000
1, GPU-bbbb, NVIDIA H200, 1410, 1980, 87, 0x0000000000000044
2, GPU-cccc, NVIDIA H200, 1980, 1980, 35, 0x0000000000000001
"""
APPS = """GPU-aaaa, 4242, python
GPU-bbbb, 5151, python
GPU-bbbb, 777, other-trainer
"""


def test_shared_and_throttled_gpus_are_told_apart() -> None:
    found = {h.index: h for h in parse(GPUS, APPS, ours={4242, 5151})}
    assert found[0].problems == []  # only our worker on it, full clock
    assert found[1].others == (777,) and found[1].throttle == ("thermal slowdown", "power capped")
    assert found[1].problems == ["shared with process 777", "thermal slowdown", "power capped"]
    assert found[2].problems == []  # 0x1 is 'idle', not a slowdown
    assert parse_reasons("0x0000000000000008") == ("hardware slowdown",) and parse_reasons("[N/A]") == ()


def test_slow_launches_are_reported_once() -> None:
    from dataclasses import replace

    (h,) = parse(GPUS.splitlines()[0], "", ours=set())
    slow = replace(h, latency_ms=3.2)
    w = HealthWatch()
    assert w.note("gpu0", slow) == ["slow launches (3.20 ms round trip): busy with another context"]
    assert w.note("gpu0", slow) == []  # said once
    assert w.note("gpu0", replace(h, latency_ms=0.02)) == []
