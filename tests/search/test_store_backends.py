"""The best-known store on both databases: SQLite (a file) and a real PostgreSQL server.

The same operations give the same rows on both; schema migrations take an old store forward and
an older SparseRL refuses a newer one in one line; a result written twice (by its uid) is recorded
once; concurrent writers leave exactly one best row per key, the fastest; bad URLs, wrong
credentials, an unreachable server and a database that vanishes are one line each, on the command
line too. Mutations these tests kill: the upsert's ``WHERE excluded.time_us < best.time_us``
dropped (a slower result replaces the best), ``ON CONFLICT (uid) DO NOTHING`` dropped (a replayed
journal duplicates results), a migration step skipped (version 2's columns missing), the newer-
schema check removed, the reconnect removed (a cut connection fails the write).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sparserl.errors import SparseRLError
from sparserl.matrices import generate
from sparserl.matrices.card import MatrixCard, matrix_card
from sparserl.search.store import MIGRATIONS, SCHEMA_V1, SCHEMA_VERSION, BestStore, Recorded, harness_version, kernel_sha
from sparserl.search.store_backends import SQLiteBackend, StoreUnavailable
from tests.conftest import one_line_error
from tests.search.test_store import KERNEL, verified


@pytest.fixture(scope="module")
def card() -> MatrixCard:
    return matrix_card(generate("banded", 2000, seed=3, bands=5))


@pytest.fixture(params=["sqlite", "postgresql"])
def spec(request, tmp_path: Path) -> str:
    """A new, empty store's spec on each database."""
    if request.param == "sqlite":
        return str(tmp_path / "s.db")
    return request.getfixturevalue("pg_url")


def _fill(st: BestStore, card: MatrixCard) -> list[bool]:
    other = replace(card, fingerprint="f" * 32)
    st.add_matrix(card, "banded", "/data/banded.mtx", ([0, 1], [0, 2]))
    st.add_matrix(other, "Zeta")
    return [st.record(verified(card, 50.0, "a")), st.record(verified(card, 60.0, "b")),
            st.record(verified(card, 50.0, "c")), st.record(verified(card, 40.0, "d", provenance="mutation",
                                                                  parent_id="spmv/csr_vector/-/a")),
            st.record(verified(card, 90.0, "e", harness_version="older")),
            st.record(verified(card, 95.0, "f", regime="warm")),
            st.record(verified(card, 30.0, "g", op="spmm", k=8)),
            st.record(verified(other, 80.0, "y", fingerprint=other.fingerprint, arch="sm_100"))]


def _portable(rows) -> list[dict]:
    """Rows without what differs by construction (ids, timestamps, run ids)."""
    drop = {"id", "created_at", "updated_at"}
    return [{k: v for k, v in r.__dict__.items() if k not in drop} for r in rows]


def test_both_databases_give_the_same_rows(tmp_path: Path, pg_url: str, card: MatrixCard) -> None:
    out = {}
    for spec in (str(tmp_path / "s.db"), pg_url):
        with BestStore(spec) as st:
            won = _fill(st, card)
            out[st.backend] = (won, _portable(st.best()), _portable(st.results()), st.counts(),
                               st.matrix(card.fingerprint), _portable(st.best(fingerprint=card.fingerprint[:6],
                                                                              op="spmv", k=None, regime="cold")))
    assert out["sqlite"] == out["postgresql"]
    won, best, _, counts, m, cold = out["postgresql"]
    assert won == [True, False, False, True, True, True, True, True]
    assert counts["results"] == 8 and counts["best"] == 5
    assert [r["time_us"] for r in cold] == [40.0, 90.0]  # this harness version's best, and the older one's
    assert [r["name"] for r in best] == ["Zeta", "banded", "banded", "banded", "banded"]  # code-point order
    assert MatrixCard.from_dict(m.card) == card and m.coords == ([0, 1], [0, 2])


def test_times_keep_double_precision(spec: str, card: MatrixCard) -> None:
    t = 12.345678901234567
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        st.record(verified(card, t, "a"))
        assert st.best()[0].time_us == t  # PostgreSQL's REAL would round this to 12.345679


def test_a_result_written_twice_is_recorded_once(spec: str, card: MatrixCard) -> None:
    v = verified(card, 50.0, "a")
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        assert st.record(v) is True
        assert st.record(v) is False  # the same uid: a retry or a replayed journal
        assert st.record(replace(v, time_us=10.0)) is False  # a faster time under a known uid is not a new result
        assert st.record_outcome(v) is Recorded.SEEN  # told apart from a slower result (kills SEEN as WRITTEN)
        assert st.counts()["results"] == 1 and st.best()[0].time_us == 50.0
        assert st.has_uids([v.uid, "nope"]) == {v.uid}
        assert st.results()[0].host == v.host and v.host
        assert st.record_outcome(verified(card, 60.0, "b")) is Recorded.WRITTEN  # slower: written, not the best


def test_newer_schema_is_refused_in_one_line(spec: str) -> None:
    BestStore(spec).close()
    with BestStore(spec) as st:
        with st.transaction():
            st.db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(SparseRLError, match="newer SparseRL") as exc:
        BestStore(spec)
    assert "\n" not in str(exc.value) and f"store schema {SCHEMA_VERSION + 1}" in str(exc.value)


def test_a_version_1_store_is_migrated_and_keeps_its_rows(spec: str, card: MatrixCard) -> None:
    """A store as version 1 wrote it (no host, no uid) is brought to version 2 on open."""
    from sparserl.search.store_backends import open_backend

    db = open_backend(spec)
    with db.transaction():
        for stmt in filter(str.strip, SCHEMA_V1.format(**db.types).split(";")):
            db.execute(stmt)
        db.execute("INSERT INTO schema_version (version) VALUES (1)")
    db.close()
    assert SCHEMA_VERSION == max(MIGRATIONS)
    with BestStore(spec) as st:
        with st.transaction():  # a version-1 writer's row: no host or uid columns in its INSERT
            st.db.execute("INSERT INTO matrices (fingerprint, name, rows, cols, nnz, card_json, added_at) "
                          "VALUES (?, 'old', 1, 1, 1, ?, 'then')", (card.fingerprint, json.dumps(card.to_dict())))
        assert st.record(verified(card, 50.0, "a")) is True
        assert st._schema_version() == SCHEMA_VERSION
        assert st.best()[0].name == "old" and st.results()[0].host is not None
    with BestStore(spec) as st:  # opening again changes nothing
        assert st._schema_version() == SCHEMA_VERSION and st.counts()["results"] == 1


def test_sqlite_files_that_are_not_stores_are_still_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE t (x INTEGER)")
    con.commit()
    con.close()
    with pytest.raises(SparseRLError, match="not a SparseRL best-known store"):
        BestStore(other)
    assert isinstance(BestStore(tmp_path / "new.db").db, SQLiteBackend)


def _writer(spec: str, card_dict: dict, seed: int, n: int) -> None:
    card = MatrixCard.from_dict(card_dict)
    rng = np.random.default_rng(seed)
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        for i in range(n):
            st.record(verified(card, float(rng.uniform(10, 100)), f"{seed}-{i}", run_id=f"run{seed}"))


def test_four_processes_on_one_postgresql_store(pg_url: str, card: MatrixCard) -> None:
    """Four writers at once, racing on one key and on the schema's creation: one best row, the fastest."""
    n, seeds = 25, [11, 12, 13, 14]
    ctx = mp.get_context("fork")  # no connection is open in this process yet
    procs = [ctx.Process(target=_writer, args=(pg_url, card.to_dict(), s, n)) for s in seeds]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with BestStore(pg_url) as st:
        assert st.counts()["results"] == 4 * n and st.counts()["schema_version"] == 1
        (b,) = st.best()
        expected = min(float(np.random.default_rng(s).uniform(10, 100, n).min()) for s in seeds)
        assert b.time_us == pytest.approx(expected)
        assert b.time_us == min(r.time_us for r in st.results())


def test_a_cut_connection_is_opened_again(pg_url: str, postgres_server, card: MatrixCard) -> None:
    import psycopg

    with BestStore(pg_url) as st:
        st.add_matrix(card, "banded")
        pid = st.conn.info.backend_pid
        with psycopg.connect(postgres_server.url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert st.record(verified(card, 50.0, "a")) is True  # reconnected once, written once
        assert st.conn.info.backend_pid != pid and st.counts()["results"] == 1


def test_a_vanished_database_is_one_line(pg_url: str, postgres_server, card: MatrixCard) -> None:
    st = BestStore(pg_url)
    st.add_matrix(card, "banded")
    postgres_server.drop_database(pg_url)
    with pytest.raises(StoreUnavailable) as exc:
        st.record(verified(card, 50.0, "a"))
    msg = str(exc.value)
    assert "\n" not in msg and "does not exist" in msg and "recording a verified kernel" in msg
    assert postgres_server.password not in msg
    st.close()


# -- the command line ------------------------------------------------------------------------


def test_best_list_show_export_agree_on_both(cli, tmp_path: Path, pg_url: str, card: MatrixCard) -> None:
    outs = {}
    for name, spec in (("sqlite", str(tmp_path / "s.db")), ("postgresql", pg_url)):
        with BestStore(spec) as st:
            _fill(st, card)
        listed = cli("best", "list", "--store", spec, "--json")
        shown = cli("best", "show", card.fingerprint[:10], "--store", spec, "--op", "spmm")
        exported = cli("best", "export", str(tmp_path / f"{name}.jsonl"), "--store", spec)
        assert listed.rc == shown.rc == exported.rc == 0, (listed.err, shown.err, exported.err)
        rows = [json.loads(x) for x in listed.out.splitlines()]
        for r in rows:
            r.pop("updated_at")
        lines = [json.loads(x) for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        outs[name] = (rows, re.sub(r"\d{4}-\d\d-\d\dT[\d:]+\+00:00", "WHEN", shown.out), lines)
    assert outs["sqlite"] == outs["postgresql"]
    rows, shown, lines = outs["sqlite"]
    assert len(rows) == 5 and KERNEL.format("g").strip() in shown and "3.33x" in shown
    assert len(lines) == 4 and {x["code"] for x in lines} >= {KERNEL.format("d"), KERNEL.format("g")}  # Zeta: no coords


def test_store_urls_that_cannot_work_are_one_line(cli, postgres_server) -> None:
    wrong = postgres_server.url("postgres", password="not-the-password")
    line = one_line_error(cli("best", "list", "--store", wrong), "password authentication failed")
    assert "not-the-password" not in line and "***" in line
    one_line_error(cli("best", "list", "--store", "mysql://u@h/db"), "unsupported best-known store URL scheme 'mysql'")
    closed = f"postgresql://u@127.0.0.1:{_closed_port()}/db"
    one_line_error(cli("best", "list", "--store", closed), "cannot open the best-known store", "refused")


def test_a_newer_postgresql_store_is_one_line_on_the_command_line(cli, pg_url: str) -> None:
    with BestStore(pg_url) as st:
        with st.transaction():
            st.db.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 5,))
    one_line_error(cli("best", "list", "--store", pg_url), "newer SparseRL", "upgrade sparserl")


def _closed_port() -> int:
    from tests.postgres import free_port

    return free_port()


def test_harness_versions_on_one_store_are_kept_apart(spec: str, card: MatrixCard) -> None:
    """Two farms measuring under different harness versions: each its own best, neither compared."""
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        other = str(int(harness_version()) + 1)  # a farm on a newer harness
        assert st.record(verified(card, 50.0, "a", harness_version=other))
        assert st.record(verified(card, 90.0, "b"))  # slower, but another version: its own best
        assert st.record(verified(card, 40.0, "c", harness_version=other))
        assert not st.record(verified(card, 95.0, "d"))
        by = {r.harness_version: r.time_us for r in st.best()}
        assert by == {other: 40.0, harness_version(): 90.0}


def test_two_gpu_models_of_one_architecture_are_compared_by_speedup(spec: str, card: MatrixCard) -> None:
    """An H200's 10 us (2.0x its cuSPARSE's 20 us) and an H100's 12 us (3.0x its 36 us) are not one scale: the
    best is the larger speedup across GPU models, the shorter time on one model. Kills: raw times compared
    across models (the H100's kernel never becomes the best), speedups compared on one model (a faster kernel
    on the H200 beside a slower cuSPARSE run would lose to its own 2.0x)."""
    h200 = dict(arch="sm_90", gpu="NVIDIA H200")
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        assert st.record(verified(card, 10.0, "a", cusparse_us=20.0, speedup=2.0, **h200)) is True
        assert st.record(verified(card, 12.0, "b", cusparse_us=36.0, speedup=3.0, arch="sm_90",
                                  gpu="NVIDIA H100")) is True
        assert st.best()[0].gpu == "NVIDIA H100" and st.best()[0].speedup == 3.0
        assert st.record(verified(card, 11.9, "c", cusparse_us=30.0, speedup=30.0 / 11.9, arch="sm_90",
                                  gpu="NVIDIA H100")) is True  # same model: the shorter time, whatever its ratio
        assert st.record(verified(card, 9.0, "d", cusparse_us=20.0, speedup=20.0 / 9.0, **h200)) is False
        assert st.record(verified(card, 6.0, "e", cusparse_us=20.0, speedup=20.0 / 6.0, **h200)) is True
        assert [(r.gpu, r.time_us) for r in st.best()] == [("NVIDIA H200", 6.0)]


def test_the_search_quotes_the_best_known_of_its_own_architecture(tmp_path: Path, card: MatrixCard) -> None:
    """The search's report says what the best known was: the row of the GPU architecture it times on comes first
    (another architecture's shorter time is another machine's), then this harness version and regime; every row
    still seeds. Kills: the architecture left out of the order (an sm_100 time quoted on an sm_90 search)."""
    from sparserl.kernels.contract import Op
    from sparserl.search.run import _known

    with BestStore(tmp_path / "s.db") as st:
        st.add_matrix(card, "banded")
        st.record(verified(card, 10.0, "a", arch="sm_90", cusparse_us=20.0, speedup=2.0))
        st.record(verified(card, 5.0, "b", arch="sm_100", cusparse_us=6.0, speedup=1.2))
        row, seeds = _known(st, card.fingerprint, Op.SPMV, None, "cold", "sm_90")
        assert row.arch == "sm_90" and row.speedup == 2.0 and len(seeds) == 2
        assert _known(st, card.fingerprint, Op.SPMV, None, "cold", "sm_100")[0].arch == "sm_100"
        assert _known(st, card.fingerprint, Op.SPMV, None, "cold")[0].time_us == 5.0  # no GPU: the fastest


def test_a_kernel_found_wrong_later_is_retracted_and_the_best_chosen_again(spec: str, card: MatrixCard) -> None:
    """``retract``: a kernel a second look found wrong leaves the store; the key's best is chosen again among the
    results left (killed by: the results removed but the best row left pointing at them, or the best not chosen
    again); found wrong under another key of the matrix, its results under this one go too (killed by: only the
    retraction's own key cleaned)."""
    with BestStore(spec) as st:
        _fill(st, card)
        key = dict(fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", regime="cold",
                   harness_version=harness_version())
        assert st.retract(**key, text=KERNEL.format("d")) == 1  # the best (40 us)
        best = st.best(**key)
        assert [(b.time_us, b.text) for b in best] == [(50.0, KERNEL.format("a"))]  # 'a' before 'c': the first
        assert kernel_sha(KERNEL.format("d")) not in {r.kernel_sha for r in st.results(**key)}
        n = len(st.results(**key))
        assert st.retract(**key, text=KERNEL.format("b")) == 1 and len(st.results(**key)) == n - 1
        assert [b.time_us for b in st.best(**key)] == [50.0]  # not the best: left as it was
        assert st.retract(**key, text=KERNEL.format("zzz")) == 0
        assert st.retract(**(key | {"harness_version": "older"}), text=KERNEL.format("a")) == 1  # another key's
        assert [b.text for b in st.best(**key)] == [KERNEL.format("c")]
        assert st.retract(**key, text=KERNEL.format("a")) == 0  # gone already
        st.retract(**key, text=KERNEL.format("c"))
        assert st.best(**key) == [] and st.results(**key) == []
        assert len(st.best()) == 4  # the other keys' bests are untouched (older version, warm, spmm, the other matrix)


def test_retract_chooses_again_by_record_s_rule_in_every_key(spec: str, card: MatrixCard) -> None:
    """After a retraction the best is the fastest where one GPU model measured every result (not the largest
    speedup: cuSPARSE's time differs run to run), the largest speedup across models; the same text under another
    key of the matrix goes too, and that key's best is chosen again; retracting a kernel that is not the best
    leaves the best row as it was. Killed mutations: the best chosen again by speedup alone; only the
    retraction's own key cleaned; the best chosen again in the retraction's own key only; the best re-chosen when
    it was not touched."""
    key = dict(fingerprint=card.fingerprint, op="spmv", k=None, arch="sm_90", regime="cold",
               harness_version=harness_version())
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        st.record(verified(card, 50.0, "a", cusparse_us=100.0, speedup=2.0))   # one H200 run
        st.record(verified(card, 45.0, "b", cusparse_us=85.0, speedup=85.0 / 45.0))  # faster, a lower speedup
        st.record(verified(card, 40.0, "w"))                                  # found wrong later
        st.record(verified(card, 40.0, "w", regime="warm"))                   # the same text, another key
        st.record(verified(card, 55.0, "v", regime="warm"))
        assert [b.text for b in st.best(**key)] == [KERNEL.format("w")]
        assert st.retract(**key, text=KERNEL.format("w")) == 2
        assert [b.text for b in st.best(**key)] == [KERNEL.format("b")]  # by time: one GPU model
        assert [b.text for b in st.best(**(key | {"regime": "warm"}))] == [KERNEL.format("v")]
        before = st.best(**key)[0]
        assert st.retract(**key, text=KERNEL.format("a")) == 1
        after = st.best(**key)[0]
        assert (after.text, after.time_us, after.updated_at) == (before.text, before.time_us, before.updated_at)
    other = dict(key, fingerprint="e" * 32)
    with BestStore(spec) as st:
        st.add_matrix(replace(card, fingerprint="e" * 32), "other")
        st.record(verified(card, 30.0, "x", fingerprint="e" * 32))
        st.record(verified(card, 50.0, "y", fingerprint="e" * 32, gpu="H100", cusparse_us=100.0, speedup=2.0))
        st.record(verified(card, 45.0, "z", fingerprint="e" * 32, gpu="H200", cusparse_us=85.0, speedup=85.0 / 45.0))
        st.retract(**other, text=KERNEL.format("x"))
        assert [b.text for b in st.best(**other)] == [KERNEL.format("y")]  # two GPU models: by speedup


def test_retracting_a_kernel_that_is_not_the_best_leaves_the_best_row(spec: str, card: MatrixCard) -> None:
    """The best that record's pairwise rule left (here s, though p has the largest speedup) is not chosen again
    when a kernel that is not the best is retracted (killed by: re-choosing whenever a kernel leaves)."""
    fp = "d" * 32
    key = dict(fingerprint=fp, op="spmv", k=None, arch="sm_90", regime="cold", harness_version=harness_version())
    with BestStore(spec) as st:
        st.add_matrix(replace(card, fingerprint=fp), "pairwise")
        st.record(verified(card, 50.0, "p", fingerprint=fp, gpu="H200", cusparse_us=100.0, speedup=2.0))
        st.record(verified(card, 45.0, "q", fingerprint=fp, gpu="H200", cusparse_us=67.5, speedup=1.5))
        st.record(verified(card, 60.0, "s", fingerprint=fp, gpu="H100", cusparse_us=114.0, speedup=1.9))
        st.record(verified(card, 70.0, "r", fingerprint=fp, gpu="H200", cusparse_us=100.0, speedup=100 / 70))
        assert [b.text for b in st.best(**key)] == [KERNEL.format("s")]
        assert st.retract(**key, text=KERNEL.format("r")) == 1
        assert [b.text for b in st.best(**key)] == [KERNEL.format("s")]


# -- kernels found wrong ---------------------------------------------------------------------

W = KERNEL.format("w")


def _key(fingerprint: str, **kw) -> dict:
    return dict(fingerprint=fingerprint, op="spmv", k=None, arch="sm_90", regime="cold",
                harness_version=harness_version()) | kw


def _texts(st: BestStore, **key) -> list[str]:
    return [b.text for b in st.best(**key)]


def _plant_found_wrong(st: BestStore, fingerprint: str, text: str, op: str = "spmv", k: int = 0) -> None:
    """A found-wrong row written by hand beside results of the kernel that are still there (a retraction leaves
    none; this stands for a row that outlived one, whatever the cause)."""
    with st.transaction():
        st.db.execute("INSERT INTO found_wrong (fingerprint, op, k, kernel_sha, arch, regime, harness_version, reason, "
                      "found_at) VALUES (?, ?, ?, ?, 'sm_90', 'cold', ?, 'by hand', 'then')",
                      (fingerprint, op, k, kernel_sha(text), harness_version()))


def test_a_kernel_found_wrong_leaves_every_key_of_its_matrix_and_nothing_else(spec: str, card: MatrixCard) -> None:
    """Found wrong under one key, the kernel's results on that matrix go under every architecture, regime and
    harness version, each key it was the best of gets the best of what is left, and the finding is recorded with
    its key and reason; the same text under another op of the fingerprint, or on another matrix, stays. Killed
    mutations: only the retraction's own key cleaned (returns 1); the best chosen again in its own key only (the
    warm and older keys left without a best); the matrix taken as the fingerprint alone (the SpMM row goes); no
    found-wrong row written."""
    other = replace(card, fingerprint="c" * 32)
    key = _key(card.fingerprint)
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        st.add_matrix(other, "other")
        for kw in ({}, {"regime": "warm"}, {"arch": "sm_100"}, {"harness_version": "older"}, {"op": "spmm", "k": 8},
                   {"fingerprint": other.fingerprint}):
            assert st.record(verified(card, 40.0, "w", **kw)) is True
        st.record(verified(card, 50.0, "a"))
        st.record(verified(card, 60.0, "b", regime="warm"))
        st.record(verified(card, 45.0, "c", harness_version="older"))
        assert st.retract(**key, text=W, reason="incorrect when evaluated again\n(max error 0.3)") == 4
        assert _texts(st, **key) == [KERNEL.format("a")]
        assert _texts(st, **(key | {"regime": "warm"})) == [KERNEL.format("b")]
        assert _texts(st, **(key | {"harness_version": "older"})) == [KERNEL.format("c")]
        assert _texts(st, **(key | {"arch": "sm_100"})) == []
        assert _texts(st, **(key | {"op": "spmm", "k": 8})) == [W]  # another op: another matrix's kernel
        assert _texts(st, **(key | {"fingerprint": other.fingerprint})) == [W]
        assert kernel_sha(W) not in {r.kernel_sha for r in st.results(card.fingerprint, op="spmv")}
        assert st.found_wrong_texts(card.fingerprint, "spmv", None) == [W]
        assert st.found_wrong_texts(card.fingerprint, "spmm", 8) == st.found_wrong_texts(other.fingerprint, "spmv",
                                                                                          None) == []
        row = st.db.execute("SELECT * FROM found_wrong").fetchall()
        assert len(row) == 1 and st.counts()["found_wrong"] == 1
        assert ({c: row[0][c] for c in ("fingerprint", "op", "k", "arch", "regime", "harness_version", "reason")} ==
                {"fingerprint": card.fingerprint, "op": "spmv", "k": 0, "arch": "sm_90", "regime": "cold",
                 "harness_version": harness_version(), "reason": "incorrect when evaluated again (max error 0.3)"})
        assert row[0]["found_at"][:2] == "20"
        assert st.kernel_text(kernel_sha(W)) == W  # the text stays: other matrices hold it


def test_a_kernel_found_wrong_is_not_recorded_again_on_its_matrix(spec: str, card: MatrixCard, caplog) -> None:
    """A racy kernel a later search times correct again is not recorded again on the matrix it was found wrong on
    (``record`` returns False and says so once at INFO), under any key; it is on another matrix, and under
    another op; a kernel the store never held is remembered all the same; a second finding keeps the first.
    Killed mutations: record ignoring the found-wrong table; said at every refusal; the refusal keyed on the
    fingerprint alone (the SpMM result refused)."""
    import logging

    key = _key(card.fingerprint)
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        st.add_matrix(replace(card, fingerprint="c" * 32), "other")
        st.record(verified(card, 40.0, "w"))
        st.record(verified(card, 50.0, "a"))
        assert st.retract(**key, text=W, reason="first") == 1
        with caplog.at_level(logging.INFO, logger="sparserl.search.store"):
            assert st.record(verified(card, 35.0, "w")) is False  # a new uid: a later search timed it correct
            assert st.record(verified(card, 35.0, "w", regime="warm", arch="sm_100")) is False
        said = [r for r in caplog.records if "found wrong" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.INFO and kernel_sha(W)[:12] in said[0].getMessage()
        assert kernel_sha(W) not in {r.kernel_sha for r in st.results(card.fingerprint)}
        assert _texts(st, **key) == [KERNEL.format("a")] and len(st.best()) == 1
        assert st.record(verified(card, 35.0, "w", fingerprint="c" * 32)) is True  # another matrix
        assert st.record(verified(card, 35.0, "w", op="spmm", k=8)) is True  # another op of the structure
        assert st.retract(**key, text=KERNEL.format("z")) == 0  # never held
        assert st.record(verified(card, 10.0, "z")) is False
        assert st.record_outcome(verified(card, 10.0, "z")) is Recorded.REFUSED
        assert st.retract(**(key | {"regime": "warm"}), text=W, reason="second") == 0
        reasons = st.db.execute("SELECT kernel_sha, reason FROM found_wrong").fetchall()
        assert {r["kernel_sha"]: r["reason"] for r in reasons} == {kernel_sha(W): "first",
                                                                    kernel_sha(KERNEL.format("z")): "found wrong when "
                                                                    "evaluated again"}


def _paused_at(st: BestStore, prefix: str) -> tuple[threading.Event, threading.Event]:
    """Make ``st``'s first statement that starts with ``prefix`` wait, its transaction open: (reached, go)."""
    reached, go = threading.Event(), threading.Event()
    execute = st.db.execute

    def paused(sql: str, args=()):
        if sql.startswith(prefix) and not reached.is_set():
            reached.set()
            assert go.wait(60)
        return execute(sql, args)

    st.db.execute = paused
    return reached, go


def _in_thread(fn, out: list) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t


def test_a_recording_in_flight_does_not_bring_a_retracted_kernel_back(spec: str, card: MatrixCard) -> None:
    """Two writers at once. A search records a racy kernel again while another retracts it: the retraction waits
    for the recording and removes its result too. A retraction in flight when a recording comes: the recording
    waits, then sees the kernel found wrong. Killed mutations (PostgreSQL; SQLite's write lock serialises both
    anyway): the matrix's lock not taken (either side), the found-wrong check made before the lock."""
    key = _key(card.fingerprint)
    with BestStore(spec) as a, BestStore(spec) as b:
        a.add_matrix(card, "banded")
        a.record(verified(card, 40.0, "w"))
        reached, go = _paused_at(b, "INSERT INTO best")  # b's result is in, its transaction open
        recorded, retracted = [], []
        t = _in_thread(lambda: b.record(verified(card, 35.0, "w")), recorded)
        assert reached.wait(60)
        r = _in_thread(lambda: a.retract(**key, text=W), retracted)
        time.sleep(0.5)
        assert r.is_alive(), "the retraction did not wait for the recording in flight"
        go.set()
        t.join(60)
        r.join(60)
        assert recorded == [True] and retracted == [2]
        assert a.best() == [] and a.results() == []
    with BestStore(spec) as a, BestStore(spec) as b:
        a.record(verified(card, 40.0, "v"))
        a.record(verified(card, 50.0, "x"))
        reached, go = _paused_at(a, "SELECT id, kernel_sha")  # a's results are gone, the best to choose again
        recorded, retracted = [], []
        r = _in_thread(lambda: a.retract(**key, text=KERNEL.format("v")), retracted)
        assert reached.wait(60)
        t = _in_thread(lambda: b.record(verified(card, 30.0, "v")), recorded)
        time.sleep(0.5)
        go.set()
        r.join(60)
        t.join(60)
        assert retracted == [1] and recorded == [False]
        assert _texts(a, **key) == [KERNEL.format("x")] and [x.time_us for x in a.results()] == [50.0]


@pytest.mark.parametrize("version", range(1, SCHEMA_VERSION))
def test_a_store_of_every_earlier_version_is_migrated_to_remember_kernels_found_wrong(
        spec: str, card: MatrixCard, version: int) -> None:
    """A store as version N wrote it (N = 1 .. the one before this) opens at this version, its rows kept, and
    retracts and refuses as a new one (killed by: the found-wrong table made for a new store only, a migration
    step skipped)."""
    from sparserl.search.store_backends import open_backend

    db = open_backend(spec)
    with db.transaction():
        for stmt in filter(str.strip, SCHEMA_V1.format(**db.types).split(";")):
            db.execute(stmt)
        for v in range(2, version + 1):
            for stmt in MIGRATIONS[v]:
                db.execute(stmt)
        db.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
        db.execute("INSERT INTO matrices (fingerprint, name, rows, cols, nnz, card_json, added_at) "
                   "VALUES (?, 'old', 1, 1, 1, ?, 'then')", (card.fingerprint, json.dumps(card.to_dict())))
        db.execute("INSERT INTO kernels (kernel_sha, text) VALUES (?, ?)", (kernel_sha(W), W))
        rid = db.execute("INSERT INTO results (fingerprint, op, k, arch, gpu, regime, harness_version, kernel_sha, "
                         "time_us, cusparse_us, speedup, provenance, run_id, created_at) VALUES (?, 'spmv', 0, "
                         "'sm_90', 'H200', 'cold', ?, ?, 40.0, 80.0, 2.0, 'seed', 'r1', 'then') RETURNING id",
                         (card.fingerprint, harness_version(), kernel_sha(W))).fetchone()
        db.execute("INSERT INTO best VALUES (?, 'spmv', 0, 'sm_90', 'cold', ?, ?, ?, 40.0, 80.0, 2.0, 'then')",
                   (card.fingerprint, harness_version(), rid[0] if db.name == "sqlite" else rid["id"], kernel_sha(W)))
    db.close()
    with BestStore(spec) as st:
        assert st._schema_version() == SCHEMA_VERSION and st.counts()["found_wrong"] == 0
        assert _texts(st) == [W] and st.best()[0].name == "old"
        assert st.retract(**_key(card.fingerprint), text=W) == 1 and st.best() == []
        assert st.record(verified(card, 40.0, "w")) is False
        assert st.found_wrong_texts(card.fingerprint, "spmv", None) == [W]


def test_a_database_with_a_found_wrong_table_of_its_own_is_refused(postgres_server) -> None:
    """A PostgreSQL database without a store's schema_version that holds a table named like the store's found-wrong
    table is not taken over (killed by: found_wrong left out of the store's tables)."""
    import psycopg

    url = postgres_server.new_database()
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE found_wrong (x INTEGER)")
    with pytest.raises(SparseRLError, match=r"not a SparseRL best-known store \(tables \['found_wrong'\]\)"):
        BestStore(url)


def test_a_result_left_of_a_kernel_found_wrong_never_becomes_a_best_again(spec: str, card: MatrixCard) -> None:
    """Where a result of a kernel found wrong on the matrix is still there (written by hand here: a retraction
    leaves none), the best chosen again after a retraction is never it, though it is the fastest (killed by: the
    best chosen again among every result left)."""
    key = _key(card.fingerprint)
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        st.record(verified(card, 40.0, "w"))
        st.record(verified(card, 45.0, "s"))  # found wrong, its result left
        st.record(verified(card, 50.0, "a"))
        _plant_found_wrong(st, card.fingerprint, KERNEL.format("s"))
        assert st.retract(**key, text=W) == 1
        assert _texts(st, **key) == [KERNEL.format("a")]


def test_the_search_is_never_seeded_with_a_kernel_found_wrong_on_its_matrix(tmp_path: Path, card: MatrixCard) -> None:
    """The search's seeds and the best known it quotes leave out a kernel found wrong on the matrix, under every
    architecture (written by hand here: its best rows outlived the finding; it is the fastest, and of the search's
    own architecture and regime); on another matrix the same text still seeds. Killed mutation: the store's
    ``best`` not leaving found-wrong kernels out (the rows the seeds and the quoted best come from)."""
    from sparserl.kernels.contract import Op
    from sparserl.search.run import _known

    other = replace(card, fingerprint="c" * 32)
    with BestStore(tmp_path / "s.db") as st:
        st.add_matrix(card, "banded")
        st.add_matrix(other, "other")
        st.record(verified(card, 10.0, "w", arch="sm_90"))
        st.record(verified(card, 12.0, "w", arch="sm_100"))
        st.record(verified(card, 20.0, "a", arch="sm_90", regime="warm"))
        st.record(verified(card, 10.0, "w", fingerprint=other.fingerprint))
        _plant_found_wrong(st, card.fingerprint, W)
        row, seeds = _known(st, card.fingerprint, Op.SPMV, None, "cold", "sm_90")
        assert row.text == KERNEL.format("a") and [t for _, t in seeds] == [KERNEL.format("a")]
        assert _known(st, card.fingerprint, Op.SPMV, None, "cold", "sm_100") == (row, seeds)
        assert [t for _, t in _known(st, other.fingerprint, Op.SPMV, None, "cold", "sm_90")[1]] == [W]
        st.retract(**_key(card.fingerprint, regime="warm"), text=KERNEL.format("a"))
        assert _known(st, card.fingerprint, Op.SPMV, None, "cold", "sm_90") == (None, [])


def test_transactions_see_what_a_lock_holder_committed_whatever_the_database_default(pg_url: str,
                                                                                   card: MatrixCard) -> None:
    """With the database's default isolation at repeatable read, a recording that waited for a retraction of
    its kernel under another regime still sees the found-wrong row and is refused (a snapshot taken before
    the wait would not see it, and the kernel would become the best again). Kills the read-committed pin
    in the PostgreSQL backend's connection."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as admin:
        dbname = admin.execute("SELECT current_database()").fetchone()[0]
        admin.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_isolation = \'repeatable read\'')
    key = _key(card.fingerprint)
    with BestStore(pg_url) as a, BestStore(pg_url) as b:
        with b.transaction():
            assert b.db.execute("SHOW transaction_isolation").fetchone()["transaction_isolation"] == "read committed"
        a.add_matrix(card, "banded")
        a.record(verified(card, 40.0, "v"))
        reached, go = _paused_at(a, "SELECT id, kernel_sha")  # the retraction holds the matrix's lock
        recorded, retracted = [], []
        r = _in_thread(lambda: a.retract(**key, text=KERNEL.format("v")), retracted)
        assert reached.wait(60)
        t = _in_thread(lambda: b.record(replace(verified(card, 30.0, "v"), regime="warm")), recorded)
        time.sleep(0.5)
        go.set()
        r.join(60)
        t.join(60)
        assert retracted == [1] and recorded == [False]
        assert a.best() == [] and a.results() == []


def test_a_row_of_a_kernel_found_wrong_left_in_the_store_is_read_by_no_one(spec: str, card: MatrixCard) -> None:
    """A best row and a result of a kernel found wrong that a retraction did not delete (written by hand, or by
    an earlier version's one-key retraction) are returned by neither ``best`` nor ``results``, so no reader
    (export's teacher rows, improve, RL, the cost model) takes them. Kills the found-wrong condition missing from the readers' filters."""
    with BestStore(spec) as st:
        st.add_matrix(card, "banded")
        st.record(verified(card, 40.0, "v"))
        st.record(verified(card, 50.0, "x"))
        with st.transaction():
            st.db.execute("INSERT INTO found_wrong (fingerprint, op, k, kernel_sha, arch, regime, harness_version, "
                          "reason, found_at) VALUES (?, 'spmv', 0, ?, 'sm_90', 'cold', 'h', 'by hand', 'now')",
                          (card.fingerprint, kernel_sha(KERNEL.format("v"))))
        assert st.best() == []  # the key's best row is v's (40 us): left out, not replaced by a reader
        assert [r.time_us for r in st.results()] == [50.0]
