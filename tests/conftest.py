"""Shared fixtures: where the real SuiteSparse matrices are, and the GPU marker's skip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def suitesparse_dir() -> Path | None:
    """The folder of real SuiteSparse matrices (``$SPARSERL_SUITESPARSE`` or ``../shared``)."""
    env = os.environ.get("SPARSERL_SUITESPARSE")
    candidates = [Path(env)] if env else []
    candidates += [REPO.parent / "shared" / "matrices" / "suitesparse", REPO / ".devdata" / "suitesparse"]
    for c in candidates:
        if c.is_dir() and any(c.glob("*.mtx.gz")):
            return c
    return None


@pytest.fixture(scope="session")
def suitesparse() -> Path:
    d = suitesparse_dir()
    if d is None:
        pytest.skip("real SuiteSparse matrices not found (set SPARSERL_SUITESPARSE)")
    return d


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if any("gpu" in item.keywords for item in items) and not _gpu_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with cupy; run through the device tool")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
