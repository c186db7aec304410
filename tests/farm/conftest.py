"""Fixtures of the farm's tests: small matrix files, one real local Ray cluster per session."""

from __future__ import annotations

import secrets
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def farm_matrices(tmp_path_factory) -> Path:
    """A folder of three small matrices and one file that is not a matrix."""
    from sparserl.matrices import generate, save_matrix

    d = tmp_path_factory.mktemp("farm_matrices")
    save_matrix(generate("banded", 3000, seed=0, bands=5), d / "banded.mtx")
    save_matrix(generate("random", 2000, seed=1, nnz_per_row=6), d / "random.mtx")
    save_matrix(generate("powerlaw", 2500, seed=2), d / "powerlaw.mtx")
    (d / "broken.mtx").write_text("%%MatrixMarket nonsense\n1 2\n")
    return d


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A head node (no CPUs: it only coordinates) and two worker nodes of one CPU each, compile-only
    (no GPU declared), shared by the session's farm tests; the driver is this test process.

    The cluster wants an authentication token, as one that ``ray start`` starts where a token file
    exists does (Ray 2.59 on). The driver's side has the token's file (``RAY_AUTH_TOKEN_PATH``) but
    no ``RAY_AUTH_MODE``: the farm has to join with the token by itself (kills a ``connect`` that
    leaves the mode unset: every test of the cluster then fails to join)."""
    pytest.importorskip("ray", reason="the farm needs Ray: pip install -e '.[farm]'")
    from sparserl.farm.local_cluster import LocalCluster

    token = tmp_path_factory.mktemp("ray_auth") / "auth_token"
    token.write_text(secrets.token_hex(32))
    c = LocalCluster.start(workers=2, cpus_per_worker=1, head_cpus=0,
                           cache=tmp_path_factory.mktemp("ray_cache"), token=token)
    with pytest.MonkeyPatch.context() as env, c:
        env.delenv("RAY_AUTH_MODE", raising=False)
        env.setenv("RAY_AUTH_TOKEN_PATH", str(token))
        yield c
