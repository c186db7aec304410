"""``sparserl farm`` on this host: the real compile-only path through the in-process evaluator,
the summary, resume, a clean Ctrl-C, one-line errors; and, with the search's GPU-path double
(tests/search/doubles.py: it answers with timed results, so kernels are verified and written),
the store's side: a PostgreSQL database that vanishes mid-farm loses nothing (the journal keeps
what the store did not take, --resume writes it), and four farms on one store leave one best row
per key, the fastest.

Mutations these tests kill: the journal written after the store instead of before (a vanished
store loses kernels), replay skipping the uid check (kernels written twice), resume not skipping
finished matrices (they are searched again: more candidates), the stop event ignored (Ctrl-C
waits for every matrix: the interrupted run finishes them all), an unreadable matrix stopping the
farm, the best row's faster-only condition dropped (four farms leave a slower best).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from sparserl.errors import SparseRLError
from sparserl.farm.run import JOURNAL, STATE, FarmConfig, run_farm
from sparserl.harness.compile import find_nvcc
from sparserl.search.loop import SearchConfig
from sparserl.search.store import BestStore
from tests.conftest import one_line_error
from tests.search.doubles import FakeTimingDouble

REPO = Path(__file__).resolve().parents[2]
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")


def _no_gpu() -> None:
    from sparserl.devices import visible_gpus

    if visible_gpus():
        pytest.skip("a GPU is visible: these are the CPU path's tests")


@needs_nvcc
def test_compile_only_farm_summary_resume(cli, farm_matrices: Path, tmp_path: Path, monkeypatch) -> None:
    _no_gpu()
    monkeypatch.setenv("SPARSERL_CACHE_DIR", str(tmp_path / "cache"))
    out, store = tmp_path / "farm", tmp_path / "s.db"
    res = cli("farm", farm_matrices, "--budget", "4", "--store", store, "--out", out)
    assert res.rc == 0, res.err[-2000:]
    assert "3 done, 1 unreadable; compile-only, nothing timed" in res.out and "skipped broken" in res.out
    s = json.loads((out / "summary.json").read_text())
    rows = {r["name"]: r for r in s["matrices"]}
    assert set(rows) == {"banded", "broken", "powerlaw", "random"} and s["timed"] is False
    assert rows["broken"]["status"] == "unreadable" and "malformed" in rows["broken"]["message"]
    assert all(rows[n]["status"] == "done" and rows[n]["evaluated"] == 4 for n in ("banded", "powerlaw", "random"))
    assert rows["banded"]["best_format"] == "DIA"  # the selector's pick compiles first
    assert s["farm"]["candidates"] == 12 and [x["name"] for x in s["skipped"]] == ["broken"]
    md = (out / "summary.md").read_text()
    assert "| banded | 3000 | 14994 | done | spmv/dia_vec4/-/block=128 | DIA |" in md and "## Not tuned" in md
    for n in ("banded", "powerlaw", "random"):  # each matrix's report, in generate's shape
        assert (out / n / "kernel.cu").exists() and len((out / n / "trace.jsonl").read_text().splitlines()) == 4
    with BestStore(store) as st:
        assert st.counts()["results"] == 0  # compile-only: nothing verified enters the store
    one_line_error(cli("farm", farm_matrices, "--budget", "4", "--store", store, "--out", out),
                   "holds a farm already", "--resume")
    again = cli("farm", farm_matrices, "--budget", "4", "--store", store, "--out", out, "--resume")
    assert again.rc == 0, again.err[-2000:]
    s2 = json.loads((out / "summary.json").read_text())
    assert s2["farm"]["candidates"] == 0 and len(s2["matrices"]) == 4  # nothing searched again, all listed


def test_bad_input_is_one_line(cli, farm_matrices: Path, tmp_path: Path) -> None:
    from tests.postgres import free_port

    one_line_error(cli("farm", farm_matrices, "--ray", f"127.0.0.1:{free_port()}", "--store", tmp_path / "s.db",
                       "--out", tmp_path / "a"), "no Ray cluster answers at 127.0.0.1")
    one_line_error(cli("farm", farm_matrices, "--store", "mysql://u@h/db", "--out", tmp_path / "b"),
                   "unsupported best-known store URL scheme")
    one_line_error(cli("farm", tmp_path / "missing", "--out", tmp_path / "c"), "no such file or folder")
    one_line_error(cli("farm", farm_matrices, "--op", "spmm", "--out", tmp_path / "d"), "--op spmm needs --k")


@needs_nvcc
def test_ctrl_c_stops_cleanly_and_resume_finishes(farm_matrices: Path, tmp_path: Path) -> None:
    _no_gpu()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), SPARSERL_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "farm"
    cmd = [sys.executable, "-m", "sparserl.cli", "farm", str(farm_matrices), "--budget", "12", "--at-once", "1",
           "--parallel", "2", "--store", str(tmp_path / "s.db"), "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any((out / n / "trace.jsonl").exists() for n in ("banded", "powerlaw")):
        time.sleep(0.2)
    time.sleep(1.0)  # a few candidates into the first matrix
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "error: interrupted" in err and "--resume" in err
    s = json.loads((out / "summary.json").read_text())
    status = {r["name"]: r["status"] for r in s["matrices"]}
    assert "interrupted" in status.values()  # not every matrix was searched: the stop was heeded
    res = subprocess.run(cmd + ["--resume"], env=env, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-2000:]
    s = json.loads((out / "summary.json").read_text())
    assert {r["name"]: r["status"] for r in s["matrices"]} == \
        {"banded": "done", "broken": "unreadable", "powerlaw": "done", "random": "done"}
    assert all(r["evaluated"] == 12 for r in s["matrices"] if r["status"] == "done")
    state = [json.loads(x) for x in (out / STATE).read_text().splitlines()]
    assert sorted(d["name"] for d in state) == ["banded", "broken", "powerlaw", "random"]  # each finished once


# -- the store's side, with the GPU-path double -----------------------------------------------------


def _time_of(offset: float):
    """A kernel time per text (us), fixed by the text; ``offset`` stands for another farm's GPU."""
    return lambda text: 20.0 + (zlib.crc32(text.encode()) % 1000) / 10.0 + offset


def _journal(out: Path) -> list[dict]:
    return [json.loads(x)["kernel"] for x in (out / JOURNAL).read_text().splitlines() if '"kernel"' in x]


def test_a_vanishing_store_loses_nothing_and_resume_writes_it(farm_matrices: Path, tmp_path: Path,
                                                              postgres_server) -> None:
    url = postgres_server.new_database()
    mats = tuple(str(farm_matrices / f) for f in ("banded.mtx", "random.mtx", "powerlaw.mtx"))
    cfg = FarmConfig(matrices=mats, out=str(tmp_path / "farm"), store=url, search=SearchConfig(budget=12),
                     at_once=1, progress=False)
    calls = [0]

    def time_then_vanish(text: str) -> float:
        calls[0] += 1
        if calls[0] == 16:  # into the second matrix
            postgres_server.drop_database(url)
        return _time_of(0.0)(text)

    with pytest.raises(SparseRLError) as exc:
        run_farm(cfg, evaluator=FakeTimingDouble(time_then_vanish))
    msg = str(exc.value)
    assert "\n" not in msg and "does not exist" in msg and "--resume" in msg and JOURNAL in msg
    kept = _journal(tmp_path / "farm")
    assert len(kept) > 12  # the first matrix's kernels and the second's, up to the store's end
    import psycopg

    with psycopg.connect(postgres_server.url(), autocommit=True) as c:  # the database is back, empty
        c.execute(f"CREATE DATABASE {url.rsplit('/', 1)[1]}")
    summary = run_farm(FarmConfig(**{**cfg.__dict__, "resume": True}), evaluator=FakeTimingDouble(_time_of(0.0)))
    assert [r["status"] for r in summary["matrices"]] == ["done", "done", "done"]
    journal = _journal(tmp_path / "farm")
    with BestStore(url) as st:
        results = st.results()
        assert len(results) == len(journal) == len({j["uid"] for j in journal})  # every verified kernel, once
        assert st.has_uids([j["uid"] for j in kept]) == {j["uid"] for j in kept}  # the ones the store lost
        for b in st.best():
            assert b.time_us == min(r.time_us for r in results if r.fingerprint == b.fingerprint)
    postgres_server.drop_database(url)


def _one_farm(url: str, mats: tuple, out: str, offset: float) -> None:
    run_farm(FarmConfig(matrices=mats, out=out, store=url, search=SearchConfig(budget=10, seed=int(offset)),
                        at_once=2, progress=False), evaluator=FakeTimingDouble(_time_of(offset), delay=0.002))


def test_four_farms_on_one_postgresql_store(farm_matrices: Path, tmp_path: Path, pg_url: str) -> None:
    mats = tuple(str(farm_matrices / f) for f in ("banded.mtx", "random.mtx"))
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_one_farm, args=(pg_url, mats, str(tmp_path / f"f{i}"), float(i)))
             for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
        assert p.exitcode == 0
    journals = [j for i in range(4) for j in _journal(tmp_path / f"f{i}")]
    with BestStore(pg_url) as st:
        results = st.results()
        assert len(results) == len(journals) == 4 * 2 * 10  # every candidate verified and written once
        best = st.best()
        keys = [(b.fingerprint, b.op, b.k, b.arch, b.regime, b.harness_version) for b in best]
        assert len(keys) == len(set(keys)) == 2  # one best row per matrix
        for b in best:
            assert b.time_us == min(r.time_us for r in results if r.fingerprint == b.fingerprint)


def test_the_farm_double_reaches_the_store_in_one_thread_too(farm_matrices: Path, tmp_path: Path) -> None:
    """The journal's kernels are the store's results (SQLite, in-process)."""
    summary = run_farm(FarmConfig(matrices=(str(farm_matrices / "banded.mtx"),), out=str(tmp_path / "f"),
                                  store=str(tmp_path / "s.db"), search=SearchConfig(budget=8), progress=False),
                       evaluator=FakeTimingDouble(_time_of(0.0)))
    (row,) = summary["matrices"]
    assert row["status"] == "done" and row["speedup"] == pytest.approx(100.0 / row["time_us"])
    with BestStore(tmp_path / "s.db") as st:
        assert {r.id for r in st.results()} and len(st.results()) == len(_journal(tmp_path / "f")) == 8
