"""Data-parallel training over several GPUs (or CPU processes), launched by ``torchrun``.

``torchrun --nproc_per_node N -m sparserl.cli sft|ppo|grpo ...`` starts N copies of the same
command; :func:`init` reads torchrun's environment, joins the process group (NCCL on GPUs,
gloo on CPUs) and pins each process to GPU ``LOCAL_RANK``. Each process then trains a
replica wrapped in PyTorch's ``DistributedDataParallel`` (gradients averaged across replicas
in every backward pass), draws its own batches (SFT) or its own matrices and samples (RL),
and owns the harness worker on its own GPU, where its timing waits for its own trainer's
lease (harness/pool.py), so no kernel is timed beside training. Rank 0 logs, evaluates and
writes checkpoints. Without torchrun's environment everything here is a single-process no-op.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch

from sparserl.errors import SparseRLError
from sparserl.devices import pick_device

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init(device_name: str = "auto") -> tuple[DistInfo, torch.device | None]:
    """Join torchrun's process group if launched by it; returns (info, device) where device is
    this rank's device (None when not distributed: the caller picks as usual)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), None
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_name)  # checks the name and sets the CUDA defaults
    if device.type == "cuda":  # each rank its own GPU, whatever index the name gave
        if local >= torch.cuda.device_count():
            raise SparseRLError(f"LOCAL_RANK {local} but only {torch.cuda.device_count()} GPUs are visible")
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    if not dist.is_initialized():
        # rank 0 evaluates alone while the others wait in a collective: allow for long evaluations
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(hours=2))
    log.info("data-parallel rank %d of %d on %s", rank, world, device)
    return DistInfo(rank, world, local), device


def harness_devices(info: DistInfo, device: torch.device) -> tuple[int, ...] | None:
    """The GPUs this process's harness may use: its own when distributed, else all (None)."""
    return (device.index,) if info.enabled and device.type == "cuda" else None


def wrap(module: torch.nn.Module, info: DistInfo, device: torch.device) -> torch.nn.Module:
    """``module`` wrapped in DistributedDataParallel when distributed (parameters are
    broadcast from rank 0 here, so every replica starts the same), else itself."""
    if not info.enabled:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    # find_unused_parameters: ablations can leave encoder parameters out of a forward pass
    return DDP(module, device_ids=ids, find_unused_parameters=True)


def mean_over_ranks(x: float, device) -> float:
    """``x`` averaged over the data-parallel ranks (itself when not distributed); every rank gets it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return x
    t = torch.tensor([x], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def gather_metrics(metrics: dict, info: DistInfo, summed: tuple[str, ...] = ()) -> dict:
    """Every rank's scalar metrics combined on all ranks: the mean, or the sum for ``summed``
    keys (throughputs). Keys missing on some ranks are combined over the ranks that have them."""
    if not info.enabled:
        return metrics
    import torch.distributed as dist

    parts: list[dict] = [None] * info.world  # type: ignore[list-item]
    dist.all_gather_object(parts, {k: v for k, v in metrics.items() if isinstance(v, (int, float))})
    out = dict(metrics)
    for k in {k for p in parts for k in p}:
        vals = [float(p[k]) for p in parts if k in p]
        out[k] = sum(vals) if k in summed else sum(vals) / len(vals)
    out["dist/world_size"] = float(info.world)
    return out


def check_in_sync(params: list[torch.Tensor], info: DistInfo) -> None:
    """Raise if the replicas' trainable parameters have drifted apart (a checksum per rank)."""
    if not info.enabled:
        return
    import torch.distributed as dist

    with torch.no_grad():
        s = torch.stack([p.detach().float().sum() for p in params]).double().sum().reshape(1)
    sums: list[float] = [0.0] * info.world
    dist.all_gather_object(sums, float(s.item()))
    if max(sums) - min(sums) > 1e-6 * max(1.0, max(abs(x) for x in sums)):
        raise SparseRLError(f"data-parallel replicas diverged: parameter checksums {sums}")


def shutdown(info: DistInfo) -> None:
    """Leave the process group, all ranks together. Drop every DistributedDataParallel wrapper
    first: one that outlives its group aborts the process at exit."""
    if info.enabled:
        import gc

        import torch.distributed as dist

        if dist.is_initialized():
            gc.collect()
            dist.barrier()
            dist.destroy_process_group()
