"""The best-known store: schema, round trip, the strictly-faster rule, concurrency, newer versions."""

from __future__ import annotations

import json
import multiprocessing as mp
import sqlite3
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sparserl.errors import SparseRLError
from sparserl.matrices import generate
from sparserl.matrices.card import MatrixCard, matrix_card
from sparserl.search.store import (
    SCHEMA_VERSION,
    BestStore,
    VerifiedKernel,
    harness_version,
)

KERNEL = "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 128), block=128\n// kernel {}\n"


@pytest.fixture(scope="module")
def card() -> MatrixCard:
    return matrix_card(generate("banded", 2000, seed=3, bands=5))


def verified(card: MatrixCard, t: float, tag: str = "a", **kw) -> VerifiedKernel:
    base = dict(fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", gpu="H200", regime="cold",
                text=KERNEL.format(tag), time_us=t, cusparse_us=100.0, speedup=100.0 / t if t else 0.0, roofline=0.4,
                format="CSR", template="csr_vector", candidate_id=f"spmv/csr_vector/-/{tag}", provenance="seed",
                parent_id=None, model=None, run_id="run1", harness_version=harness_version())
    return VerifiedKernel(**(base | kw))


def test_round_trip_and_the_strictly_faster_rule(tmp_path: Path, card: MatrixCard) -> None:
    with BestStore(tmp_path / "s.db") as st:
        st.add_matrix(card, "banded", "/data/banded.mtx", ([0, 1], [0, 2]))
        assert st.record(verified(card, 50.0, "a")) is True  # the first result is the best
        assert st.record(verified(card, 60.0, "b")) is False  # slower
        assert st.record(verified(card, 50.0, "c")) is False  # as fast is not faster
        assert st.record(verified(card, 40.0, "d", provenance="mutation", parent_id="spmv/csr_vector/-/a")) is True
        # another harness version or regime is another key: never compared with these times
        assert st.record(verified(card, 90.0, "e", harness_version="older")) is True
        assert st.record(verified(card, 95.0, "f", regime="warm")) is True
    with BestStore(tmp_path / "s.db") as st:  # reopened
        rows = st.best(fingerprint=card.fingerprint, harness_version=harness_version(), regime="cold")
        assert len(rows) == 1
        b = rows[0]
        assert (b.time_us, b.speedup, b.candidate_id, b.provenance, b.parent_id) == \
            (40.0, 2.5, "spmv/csr_vector/-/d", "mutation", "spmv/csr_vector/-/a")
        assert b.text == KERNEL.format("d") and (b.name, b.rows, b.nnz) == ("banded", card.rows, card.nnz)
        assert b.k is None and b.arch == "sm_90" and b.gpu == "H200"
        assert len(st.best()) == 3
        res = st.results(card.fingerprint[:8])
        assert [r.time_us for r in res] == [40.0, 50.0, 50.0, 60.0, 90.0, 95.0]  # every verified result, fastest first
        m = st.matrix(card.fingerprint)
        assert MatrixCard.from_dict(m.card) == card and m.coords == ([0, 1], [0, 2])
        assert m.source_path == "/data/banded.mtx"
        assert st.counts()["kernels"] == 6
        assert st.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_spmm_keys_by_k(tmp_path: Path, card: MatrixCard) -> None:
    with BestStore(tmp_path / "s.db") as st:
        st.add_matrix(card, "banded")
        assert st.record(verified(card, 50.0, "a", op="spmm", k=8))
        assert st.record(verified(card, 70.0, "b", op="spmm", k=32))  # another k: its own best
        assert {(r.k, r.time_us) for r in st.best(op="spmm")} == {(8, 50.0), (32, 70.0)}
        assert [r.k for r in st.best(op="spmm", k=32)] == [32]


def test_a_verified_kernel_needs_positive_times(card: MatrixCard) -> None:
    with pytest.raises(ValueError, match="positive times"):
        verified(card, 0.0, speedup=1.0)


def test_newer_store_is_a_one_line_error(tmp_path: Path) -> None:
    p = tmp_path / "s.db"
    BestStore(p).close()
    con = sqlite3.connect(p)
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    con.commit()
    con.close()
    with pytest.raises(SparseRLError, match="newer SparseRL") as exc:
        BestStore(p)
    assert "\n" not in str(exc.value)


def test_files_that_are_not_stores_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(SparseRLError, match="not a SparseRL best-known store"):
        BestStore(junk)
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(SparseRLError, match="not a SparseRL best-known store"):
        BestStore(other)


def _writer(path: str, card_dict: dict, seed: int, n: int) -> None:
    card = MatrixCard.from_dict(card_dict)
    rng = np.random.default_rng(seed)
    with BestStore(path) as st:
        st.add_matrix(card, "banded")
        for i in range(n):
            st.record(verified(card, float(rng.uniform(10, 100)), f"{seed}-{i}", run_id=f"run{seed}"))


def _expected_min(seeds: list[int], n: int) -> float:
    return min(float(np.random.default_rng(s).uniform(10, 100, n).min()) for s in seeds)


def test_two_processes_writing_at_once(tmp_path: Path, card: MatrixCard) -> None:
    p = str(tmp_path / "s.db")
    n = 40
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(p, card.to_dict(), s, n)) for s in (1, 2)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(60)
        assert pr.exitcode == 0
    with BestStore(p) as st:
        assert st.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert st.counts()["results"] == 2 * n
        (b,) = st.best()
        assert b.time_us == pytest.approx(_expected_min([1, 2], n))


def test_threads_writing_at_once(tmp_path: Path, card: MatrixCard) -> None:
    p = str(tmp_path / "s.db")
    threads = [threading.Thread(target=_writer, args=(p, card.to_dict(), s, 25)) for s in (3, 4, 5, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    with BestStore(p) as st:
        assert st.counts()["results"] == 100
        (b,) = st.best()
        assert b.time_us == pytest.approx(_expected_min([3, 4, 5, 6], 25))


def test_a_new_store_made_by_two_processes_at_once(tmp_path: Path) -> None:
    p = str(tmp_path / "fresh.db")
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_open_close, args=(p,)) for _ in range(4)]
    for pr in procs:
        pr.start()
    for pr in procs:
        pr.join(60)
        assert pr.exitcode == 0
    with BestStore(p) as st:
        assert st.conn.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == 1


def _open_close(path: str) -> None:
    BestStore(path).close()


def test_record_replaces_only_under_the_same_key(tmp_path: Path, card: MatrixCard) -> None:
    other = replace(card, fingerprint="f" * 32)
    with BestStore(tmp_path / "s.db") as st:
        st.add_matrix(card, "a")
        st.add_matrix(other, "b")
        assert st.record(verified(card, 50.0, "x"))
        assert st.record(verified(other, 80.0, "y", fingerprint=other.fingerprint))
        assert st.record(verified(card, 30.0, "z", arch="sm_100"))  # another GPU: its own best
        assert sorted((r.name, r.arch, r.time_us) for r in st.best()) == \
            [("a", "sm_100", 30.0), ("a", "sm_90", 50.0), ("b", "sm_90", 80.0)]


SCHEMA_V1 = (Path(__file__).parent / "data" / "store_schema_v1.sql").read_text()


def test_only_an_old_store_reports_its_migration(tmp_path: Path, caplog) -> None:
    """A new store is made at the current schema without a word (a command's one-line error must stay one
    line on a machine whose default store did not exist yet); a schema-1 store says each step.
    Mutations killed: the migration logged for a new store, or never logged."""
    import logging

    with caplog.at_level(logging.INFO, logger="sparserl.search.store"):
        BestStore(tmp_path / "new.db").close()
    assert not [r for r in caplog.records if "schema" in r.getMessage()]
    con = sqlite3.connect(tmp_path / "old.db")
    con.executescript(SCHEMA_V1)
    con.execute("INSERT INTO schema_version (version) VALUES (1)")
    con.commit()
    con.close()
    with caplog.at_level(logging.INFO, logger="sparserl.search.store"):
        BestStore(tmp_path / "old.db").close()
    steps = [r.getMessage().rsplit("schema ", 1)[-1] for r in caplog.records if "schema" in r.getMessage()]
    assert steps == [f"{v - 1} -> {v}" for v in range(2, SCHEMA_VERSION + 1)]


def test_a_schema_1_store_is_migrated_and_keeps_every_result(tmp_path: Path, card: MatrixCard) -> None:
    """A store written at schema 1 (no features column) opens at the current schema with its
    matrices, results and best rows intact, and a matrix recorded again gains its features.
    Mutations killed: no migration step (add_matrix fails on the missing column), a migration
    that rewrites or drops rows, the version left at 1, features overwritten once set."""
    from sparserl.matrices.features import MatrixFeatures, compute_features

    p = tmp_path / "old.db"
    con = sqlite3.connect(p)
    con.executescript(SCHEMA_V1)
    con.execute("INSERT INTO schema_version (version) VALUES (1)")
    con.execute("INSERT INTO matrices VALUES (?, 'banded_old', ?, ?, ?, ?, NULL, '/data/b.mtx', '2026-01-01')",
                (card.fingerprint, card.rows, card.cols, card.nnz, json.dumps(card.to_dict())))
    con.execute("INSERT INTO kernels VALUES ('sha1', 'text', 'CSR', 'csr_vector', 'spmv/csr_vector/-/tpr=4,block=128')")
    con.execute("INSERT INTO runs VALUES ('r1', ?, 'spmv', 0, '2026-01-01', NULL, 'finished', '{}')", (card.fingerprint,))
    con.execute("INSERT INTO results (fingerprint, op, k, arch, gpu, regime, harness_version, kernel_sha, time_us, "
                "cusparse_us, speedup, roofline, provenance, parent_id, model, run_id, created_at) VALUES "
                "(?, 'spmv', 0, 'sm_90', 'H200', 'cold', '7', 'sha1', 40.0, 80.0, 2.0, NULL, 'seed', NULL, NULL, "
                "'r1', '2026-01-01')", (card.fingerprint,))
    con.execute("INSERT INTO best VALUES (?, 'spmv', 0, 'sm_90', 'cold', '7', 1, 'sha1', 40.0, 80.0, 2.0, "
                "'2026-01-01')", (card.fingerprint,))
    con.commit()
    con.close()
    feats = compute_features(generate("banded", 2000, seed=3, bands=5))
    with BestStore(p) as st:
        assert st._schema_version() == SCHEMA_VERSION == 4
        m = st.matrix(card.fingerprint)
        assert m is not None and m.features is None and MatrixCard.from_dict(m.card) == card and m.source_path == "/data/b.mtx"
        [r] = st.results(card.fingerprint)
        assert (r.time_us, r.cusparse_us, r.candidate_id) == (40.0, 80.0, "spmv/csr_vector/-/tpr=4,block=128")
        assert [b.time_us for b in st.best()] == [40.0]
        st.add_matrix(card, "banded_new", features=feats)
        m = st.matrix(card.fingerprint)
        assert m.name == "banded_old" and MatrixFeatures.from_dict(m.features) == feats
        st.add_matrix(card, "banded_new", features=replace(feats, bandwidth=feats.bandwidth + 1))
        assert MatrixFeatures.from_dict(st.matrix(card.fingerprint).features) == feats  # the first features stay
    with BestStore(p) as st:  # reopened: nothing to migrate, nothing lost
        assert st._schema_version() == SCHEMA_VERSION and st.counts()["results"] == 1
