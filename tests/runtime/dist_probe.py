"""Run under torchrun with 2 CPU processes: the data-parallel helpers do what they claim."""

from __future__ import annotations

import sys

import torch

from sparserl.errors import SparseRLError
from sparserl.runtime import dist


def main() -> int:
    info, device = dist.init("cpu")
    assert info.enabled and info.world == 2 and device.type == "cpu", (info, device)
    m = dist.gather_metrics({"loss": float(info.rank), "speed": 10.0 + info.rank, "note": "x"}, info,
                            summed=("speed",))
    assert m["loss"] == 0.5 and m["speed"] == 21.0 and m["note"] == "x" and m["dist/world_size"] == 2.0, m
    # DDP averages gradients: rank r sees input r + 1, the mean gradient of sum(w * x) is 1.5
    w = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.constant_(w.weight, float(info.rank))  # different on purpose: wrap() broadcasts rank 0's
    model = dist.wrap(w, info, device)
    assert float(w.weight.detach()) == 0.0
    model(torch.tensor([[info.rank + 1.0]])).sum().backward()
    assert abs(float(w.weight.grad) - 1.5) < 1e-6, float(w.weight.grad)
    dist.check_in_sync([w.weight], info)
    with torch.no_grad():
        w.weight.add_(info.rank)  # replicas drift apart: the check must say so on every rank
    try:
        dist.check_in_sync([w.weight], info)
    except SparseRLError as exc:
        assert "diverged" in str(exc)
    else:
        raise AssertionError("check_in_sync missed diverged replicas")
    del model
    dist.shutdown(info)
    print(f"rank {info.rank} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
