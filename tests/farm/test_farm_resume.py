"""The farm when a search raises, and ``--resume`` over what an earlier run left, on the CPU with the
search's GPU-path double (tests/search/doubles.py).

Mutations these tests kill: a search's exception left to propagate (no matrix recorded, no summary,
a traceback), an interrupt recorded as a failed matrix (or a swallowed one ignored), a failed matrix
counted as done by --resume, compile-only rows counted as done where a GPU can time them (or never
counted as done), resume matching the path as typed instead of the resolved one, a journal line
that is JSON but not a record crashing --resume, and appends running on from a line cut by a kill.
"""

from __future__ import annotations

import json
import logging
import zlib
from pathlib import Path

import pytest

from sparserl import interrupts
from sparserl.farm import run as farm_run
from sparserl.farm.run import JOURNAL, STATE, FarmConfig, run_farm
from sparserl.errors import SparseRLError
from sparserl.harness.result import ErrorKind
from sparserl.search.loop import SearchConfig
from tests.conftest import one_line_error
from tests.search.doubles import FakeTimingDouble, racy_beside, racy_landscape


def _time_of(text: str) -> float:
    return 20.0 + (zlib.crc32(text.encode()) % 1000) / 10.0


class _RaisesOn(FakeTimingDouble):
    """The double, whose ``register`` of the matrix named ``name`` calls ``raise_`` (the search's
    first touch of the evaluator: a full disk writing the matrix, a cluster gone ...)."""

    def __init__(self, name: str, raise_, **kw):
        super().__init__(_time_of, **kw)
        self.name, self.raise_ = name, raise_

    def register(self, A, name: str = "matrix"):
        if name == self.name:
            self.raise_()
        return super().register(A, name)


class _CompileOnly(FakeTimingDouble):
    """No GPU: every candidate compiles and nothing is timed (what the real evaluator answers)."""

    has_gpu = False

    def __init__(self):
        super().__init__(lambda text: ErrorKind.NO_GPU)


def _no_space() -> None:
    raise OSError(28, "No space left on device")


def _actor_died() -> None:
    raise RuntimeError("the actor died unexpectedly before finishing this task\n\tclass_name: GpuWorker")


def _state(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / STATE).read_text().splitlines()]


def _mats(d: Path, *names: str) -> tuple[str, ...]:
    return tuple(str(d / f"{n}.mtx") for n in names)


@pytest.mark.parametrize("raise_, said", [(_no_space, "No space left on device"), (_actor_died, "the actor died")])
def test_a_search_that_raises_fails_its_matrix_only(cli, farm_matrices: Path, tmp_path: Path, monkeypatch,
                                                    raise_, said: str) -> None:
    """A full disk (or a Ray error) in one matrix's search: that matrix is recorded as failed (one line), the others
    are searched and recorded, the summary is written, the command ends with one ``error:`` line,
    and --resume searches the failed matrix again (only it). Kills the exception left to propagate
    from the finished future (nothing recorded, no summary, a traceback), a failure recorded as done
    or as interrupted (not recorded: the summary would not list it as failed), and --resume counting
    a failed matrix as done."""
    out, store = tmp_path / "farm", tmp_path / "s.db"
    argv = ("farm", *_mats(farm_matrices, "banded", "random", "powerlaw"), "--budget", "4", "--at-once", "1",
            "--store", store, "--out", out)
    ev = _RaisesOn("random", raise_)
    monkeypatch.setattr(farm_run, "open_farm_evaluator", lambda cfg: ev)
    line = one_line_error(cli(*argv), "1 of 3 matrices failed", "random", said, "--resume")
    assert "summary.md" in line
    assert {d["name"]: d["status"] for d in _state(out)} == {"banded": "done", "random": "failed", "powerlaw": "done"}
    rows = {r["name"]: r for r in json.loads((out / "summary.json").read_text())["matrices"]}
    assert [rows[n]["status"] for n in ("banded", "random", "powerlaw")] == ["done", "failed", "done"]
    assert "\n" not in rows["random"]["message"] and said in rows["random"]["message"]
    assert sum(not f for f in ev.fresh) == 8  # the other two matrices' candidates (their second looks aside)
    again = FakeTimingDouble(_time_of)
    monkeypatch.setattr(farm_run, "open_farm_evaluator", lambda cfg: again)
    res = cli(*argv, "--resume")
    assert res.rc == 0, res.err[-2000:]
    assert sum(not f for f in again.fresh) == 4  # the failed matrix only (its second look aside)
    s = json.loads((out / "summary.json").read_text())
    assert [r["status"] for r in s["matrices"]] == ["done", "done", "done"]


def _interrupt() -> None:
    raise KeyboardInterrupt


def _interrupt_turned_into_an_error() -> None:
    interrupts._seen.set()  # Ctrl-C arrived, and became another error where it landed
    raise RuntimeError("initialization failed")


@pytest.mark.parametrize("raise_", [_interrupt, _interrupt_turned_into_an_error])
def test_an_interrupt_in_a_search_stops_the_farm(farm_matrices: Path, tmp_path: Path, raise_) -> None:
    """An interrupt that reaches a search (as itself, or seen by :mod:`sparserl.interrupts` and turned
    into another error) stops the farm as Ctrl-C does: KeyboardInterrupt, what finished before is
    kept, the summary written, the matrix not recorded as failed. Kills catching BaseException (the
    interrupt recorded as a failure, the farm going on) and an error after an interrupt recorded as
    a failure (--resume would list a matrix that only met the Ctrl-C as failed) or not stopping the farm."""
    out = tmp_path / "farm"
    cfg = FarmConfig(matrices=_mats(farm_matrices, "banded", "random"), out=str(out), store=str(tmp_path / "s.db"),
                     search=SearchConfig(budget=4), at_once=1, progress=False)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_farm(cfg, evaluator=_RaisesOn("random", raise_))
    finally:
        interrupts._seen.clear()
    assert [(d["name"], d["status"]) for d in _state(out)] == [("banded", "done")]
    rows = {r["name"]: r["status"] for r in json.loads((out / "summary.json").read_text())["matrices"]}
    assert rows == {"banded": "done", "random": "interrupted"}


def test_an_error_of_the_farm_itself_starts_nothing_more(farm_matrices: Path, tmp_path: Path,
                                                         monkeypatch) -> None:
    """matrices.jsonl that cannot be written (a full disk): the error is raised, the summary is
    written all the same, and the matrices still queued are not searched. Kills the summary written
    only after a clean drive, and the queued matrices left in the pool (its exit searches every one of
    them, recording none)."""
    out = tmp_path / "farm"
    cfg = FarmConfig(matrices=_mats(farm_matrices, "banded", "random", "powerlaw"), out=str(out),
                     store=str(tmp_path / "s.db"), search=SearchConfig(budget=4), at_once=1, progress=False)

    def full_disk(self, o) -> None:
        raise OSError(28, "No space left on device", str(out / STATE))

    monkeypatch.setattr(farm_run.Farm, "finished", full_disk)
    ev = FakeTimingDouble(_time_of, delay=0.2)  # each of a matrix's candidates takes a while
    with pytest.raises(OSError, match="No space left"):
        run_farm(cfg, evaluator=ev)
    assert sum(not f for f in ev.fresh) < 12  # powerlaw, queued behind random, never started (second looks aside)
    rows = json.loads((out / "summary.json").read_text())["matrices"]
    assert [r["name"] for r in rows] == ["banded", "random", "powerlaw"]


def test_resume_times_what_was_finished_compile_only(farm_matrices: Path, tmp_path: Path) -> None:
    """Matrices finished compile-only are searched again by a resume that can time, and only then.
    Kills rows with ``timed: false`` counted as done whatever the evaluator (never timed, and the
    summary says timed) and counted as not done without a GPU too (a compile-only farm searched
    again on every resume)."""
    out = tmp_path / "farm"
    cfg = FarmConfig(matrices=_mats(farm_matrices, "banded", "random"), out=str(out), store=str(tmp_path / "s.db"),
                     search=SearchConfig(budget=4), at_once=1, progress=False)
    first = run_farm(cfg, evaluator=_CompileOnly())
    assert [(r["status"], r["timed"]) for r in first["matrices"]] == [("done", False)] * 2
    resumed = FarmConfig(**{**cfg.__dict__, "resume": True})
    again = _CompileOnly()
    run_farm(resumed, evaluator=again)
    assert again.submitted == []  # no GPU: compile-only rows are done
    gpu = FakeTimingDouble(_time_of)
    s = run_farm(resumed, evaluator=gpu)
    assert sum(not f for f in gpu.fresh) == 8 and s["timed"] is True and any(gpu.fresh)  # and the second looks
    assert [(r["status"], r["timed"]) for r in s["matrices"]] == [("done", True)] * 2
    assert all(r["speedup"] for r in s["matrices"])
    last = FakeTimingDouble(_time_of)
    s = run_farm(resumed, evaluator=last)
    assert last.submitted == [] and len(s["matrices"]) == 2


def test_resume_knows_a_matrix_by_its_resolved_path(farm_matrices: Path, tmp_path: Path, monkeypatch) -> None:
    """A farm started on a relative folder and resumed on the same folder's absolute path searches
    nothing again and lists each matrix once. Kills matching the path string as typed."""
    monkeypatch.chdir(farm_matrices.parent)
    out = tmp_path / "farm"
    cfg = FarmConfig(matrices=(farm_matrices.name,), out=str(out), store=str(tmp_path / "s.db"),
                     search=SearchConfig(budget=4), progress=False)
    run_farm(cfg, evaluator=FakeTimingDouble(_time_of))
    ev = FakeTimingDouble(_time_of)
    s = run_farm(FarmConfig(**{**cfg.__dict__, "matrices": (str(farm_matrices.resolve()),), "resume": True}),
                 evaluator=ev)
    assert ev.submitted == []
    assert sorted(r["name"] for r in s["matrices"]) == ["banded", "broken", "powerlaw", "random"]
    assert s["farm"]["candidates"] == 0


def test_resume_skips_lines_that_are_not_records(farm_matrices: Path, tmp_path: Path, caplog) -> None:
    """Journal and state lines that are JSON but not records this version reads (a kernel with time 0,
    a field missing or one too many, a card without its fields, a row without a path, a list), and a
    last line cut by a kill: --resume skips them with one warning per file that counts them, writes
    the journal's good kernels, and the lines it appends start on a fresh line. Kills the lines read
    unchecked (a traceback from ``VerifiedKernel(**...)`` or the summary) and an append that runs on
    from the cut line (the first line written after it unreadable too)."""
    out, store = tmp_path / "farm", tmp_path / "s.db"
    cfg = FarmConfig(matrices=_mats(farm_matrices, "banded"), out=str(out), store=str(store),
                     search=SearchConfig(budget=4), progress=False)
    run_farm(cfg, evaluator=FakeTimingDouble(_time_of))
    lines = (out / JOURNAL).read_text().splitlines()
    kernel = next(json.loads(x)["kernel"] for x in lines if '"kernel"' in x)
    matrix = next(json.loads(x)["matrix"] for x in lines if '"matrix"' in x)
    bad = [{"kernel": {**kernel, "time_us": 0, "uid": "a"}}, {"kernel": {**kernel, "uid": "b", "new_field": 1}},
           {"kernel": {k: v for k, v in kernel.items() if k != "uid"}}, {"matrix": {**matrix, "card": {}}},
           [1, 2], "kernel"]
    with (out / JOURNAL).open("a") as fh:
        fh.write("".join(json.dumps(b) + "\n" for b in bad) + '{"kernel": {"fingerprint": "ab')  # cut by a kill
    row = _state(out)[0]
    with (out / STATE).open("a") as fh:
        fh.write(json.dumps({k: v for k, v in row.items() if k != "path"}) + "\n"
                 + json.dumps({**row, "evaluated": "many"}) + '\n{"name": "ra')
    fresh = tmp_path / "fresh.db"  # a store that lacks the journal's kernels: resume writes the good ones
    with caplog.at_level(logging.WARNING, logger="sparserl.farm.run"):
        s = run_farm(FarmConfig(**{**cfg.__dict__, "matrices": _mats(farm_matrices, "banded", "random"),
                                   "store": str(fresh), "resume": True}), evaluator=FakeTimingDouble(_time_of))
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(said) == 2 and "7 lines" in said[0] and JOURNAL in said[0], said
    assert "3 lines" in said[1] and STATE in said[1], said
    assert [(r["name"], r["status"]) for r in s["matrices"]] == [("banded", "done"), ("random", "done")]
    from sparserl.search.store import BestStore

    with BestStore(fresh) as st:  # banded's four kernels from the journal, random's four searched now
        assert len(st.results()) == 8
    for f, cut in ((JOURNAL, '{"kernel": {"fingerprint": "ab'), (STATE, '{"name": "ra')):
        text = (out / f).read_text().splitlines()
        after = text[text.index(cut) + 1:]
        assert after and all(isinstance(json.loads(x), dict) for x in after)  # each a line of its own
    assert json.loads((out / STATE).read_text().splitlines()[-1])["name"] == "random"


def test_replay_counts_only_the_kernels_it_wrote(farm_matrices: Path, tmp_path: Path, caplog) -> None:
    """Replaying a journal into a store that found one of its kernels wrong on the matrix meanwhile: that kernel
    is refused, and the count and the line say so (killed by: the count taken as every kernel replayed)."""
    from sparserl.search.store import BestStore, VerifiedKernel

    out = tmp_path / "farm"
    run_farm(FarmConfig(matrices=_mats(farm_matrices, "banded"), out=str(out), store=str(tmp_path / "s.db"),
                        search=SearchConfig(budget=4), progress=False), evaluator=FakeTimingDouble(_time_of))
    kernels = [VerifiedKernel(**json.loads(x)["kernel"]) for x in (out / JOURNAL).read_text().splitlines()
               if '"kernel"' in x]
    assert len(kernels) == 4
    v = kernels[0]
    fresh = tmp_path / "fresh.db"
    with BestStore(fresh) as st:
        st.retract(v.fingerprint, v.op, v.k, v.arch, v.regime, v.harness_version, v.text)
    with caplog.at_level(logging.INFO, logger="sparserl.farm.run"):
        assert farm_run.replay(out / JOURNAL, str(fresh)) == 3
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("resume:")]
    assert said and "3 verified kernels" in said[0] and "(1 not:" in said[0], said
    with BestStore(fresh) as st:
        assert len(st.results()) == 3


def test_the_farm_writes_the_kernel_its_second_look_chose(farm_matrices: Path, tmp_path: Path) -> None:
    """A kernel fastest once and wrong when evaluated again is not the matrix's kernel in the farm's summary or
    folder, and leaves the store as found wrong; the summary quotes the look's median (killed by: the farm's
    report written without the evaluator or the store, and the first timing kept in the summary). With
    ``retime=0`` the first timings decide and the racy kernel is written (the control)."""
    from sparserl.matrices import load_matrix
    from sparserl.matrices.card import matrix_card
    from sparserl.search.space import normalised
    from sparserl.search.store import BestStore

    fp = matrix_card(load_matrix(farm_matrices / "banded.mtx")).fingerprint
    for retime in (3, 0):
        time_of, order = racy_landscape(faster_again=1.0)
        out, store = tmp_path / f"farm{retime}", tmp_path / f"s{retime}.db"
        s = run_farm(FarmConfig(matrices=_mats(farm_matrices, "banded"), out=str(out), store=str(store),
                                search=SearchConfig(budget=5), progress=False, retime=retime),
                     evaluator=FakeTimingDouble(time_of))
        racy = next(t for t, r in order.items() if r == 0)
        row = s["matrices"][0]
        written = normalised((out / "banded" / "kernel.cu").read_text())
        with BestStore(store) as st:
            wrong = [normalised(t) for t in st.found_wrong_texts(fp, "spmv", None)]
        if retime:
            assert row["status"] == "done" and written != racy and row["time_us"] == 20.0, row
            assert row["speedup"] == pytest.approx(100.0 / 20.0) and wrong == [racy]
        else:
            assert written == racy and row["time_us"] == 5.0 and wrong == []


def _correct_once(later):
    """``time_of``: every kernel correct at its first evaluation; every later one ``later`` (``ErrorKind.INTERNAL``:
    the machine's doing; None: incorrect, its own)."""
    seen: dict[str, int] = {}

    def time_of(text: str):
        seen[text] = seen.get(text, 0) + 1
        return 20.0 + zlib.crc32(text.encode()) % 10 if seen[text] == 1 else later

    return time_of


def test_a_look_that_confirms_nothing_for_the_machine_s_reasons_fails_its_matrix(farm_matrices: Path,
                                                                                tmp_path: Path) -> None:
    """Every evaluation again fails for the machine's reasons: the matrix is failed, not finished without a kernel,
    and --resume searches it again (killed by: a failed look always recorded as 'no kernel', which --resume skips
    for good although the search verified kernels)."""
    out = tmp_path / "farm"
    cfg = FarmConfig(matrices=_mats(farm_matrices, "banded"), out=str(out), store=str(tmp_path / "s.db"),
                     search=SearchConfig(budget=4), progress=False)
    with pytest.raises(SparseRLError, match="1 of 1 matrices failed"):
        run_farm(cfg, evaluator=FakeTimingDouble(_correct_once(ErrorKind.INTERNAL)))
    assert [(d["name"], d["status"]) for d in _state(out)] == [("banded", "failed")]
    assert "not confirmed" in _state(out)[0]["message"]
    again = FakeTimingDouble(_time_of)
    s = run_farm(FarmConfig(**{**cfg.__dict__, "resume": True}), evaluator=again)
    assert [r["status"] for r in s["matrices"]] == ["done"] and any(again.fresh)


def test_a_stop_during_the_second_look_leaves_the_matrix_interrupted(farm_matrices: Path, tmp_path: Path,
                                                                     monkeypatch) -> None:
    """Ctrl-C (the farm's stop) while the fastest are evaluated again: no further evaluation starts, and the matrix
    is interrupted, not done, so --resume searches it again (killed by: the stop not passed to the look, which ran
    its nine evaluations and wrote the matrix as done)."""
    farms = []
    init = farm_run.Farm.__init__

    def keep(self, *a, **kw):
        init(self, *a, **kw)
        farms.append(self)

    monkeypatch.setattr(farm_run.Farm, "__init__", keep)

    class StopAtTheLook(FakeTimingDouble):
        def submit(self, text, ref, op, k=None, fresh=False):
            if fresh:
                farms[0].stop.set()
            return super().submit(text, ref, op, k, fresh)

    out = tmp_path / "farm"
    ev = StopAtTheLook(lambda text: 20.0 + zlib.crc32(text.encode()) % 10)
    run_farm(FarmConfig(matrices=_mats(farm_matrices, "banded"), out=str(out), store=str(tmp_path / "s.db"),
                        search=SearchConfig(budget=4), progress=False), evaluator=ev)
    assert sum(ev.fresh) == 1
    rows = json.loads((out / "summary.json").read_text())["matrices"]
    assert [(r["name"], r["status"]) for r in rows] == [("banded", "interrupted")]


@pytest.mark.parametrize("look", ["keeps one", "drops all"])
def test_a_store_that_cannot_retract_what_the_look_found_wrong_stops_the_farm(farm_matrices: Path, tmp_path: Path,
                                                                               monkeypatch, look: str) -> None:
    """The second look finds kernels wrong (and hands another back, or none) and the store cannot be reached to
    retract them: the farm stops as for a store that stopped answering, and the matrix is not finished, so --resume
    looks at it again (killed by: the store's error taken as 'no kernel' for the matrix, a finished row, while the
    wrong kernel stays the store's best; where the look dropped all, the retraction's error only logged beside the
    look's and not kept on it)."""
    from sparserl.search.store import BestStore
    from sparserl.search.store_backends import StoreUnavailable

    def gone(self, *a, **kw):
        raise StoreUnavailable("the best-known store stopped answering (test)")

    monkeypatch.setattr(BestStore, "retract", gone)
    time_of = racy_landscape(faster_again=1.0)[0] if look == "keeps one" else _correct_once(None)
    out = tmp_path / "farm"
    with pytest.raises(SparseRLError, match="stopped answering"):
        run_farm(FarmConfig(matrices=_mats(farm_matrices, "banded"), out=str(out), store=str(tmp_path / "s.db"),
                            search=SearchConfig(budget=5), progress=False), evaluator=FakeTimingDouble(time_of))
    rows = json.loads((out / "summary.json").read_text())["matrices"]
    assert [(r["name"], r["status"]) for r in rows] == [("banded", "interrupted")]


def test_the_summary_says_improved_only_for_a_best_that_outlived_the_look(farm_matrices: Path, tmp_path: Path) -> None:
    """A second farm on one store, whose only kernel faster than the first farm's best is fastest once and wrong
    when evaluated again: the look retracts it, the first farm's kernel is the best again, and the summary says the
    store was not improved (killed by: ``store_improved`` taken from the search's recordings, which the racy
    kernel's had made true). The first farm, on an empty store, did improve it (the control)."""
    from sparserl.search.space import normalised
    from sparserl.search.store import BestStore

    store = tmp_path / "s.db"
    first = run_farm(FarmConfig(matrices=_mats(farm_matrices, "banded"), out=str(tmp_path / "f1"), store=str(store),
                                search=SearchConfig(budget=4), progress=False), evaluator=FakeTimingDouble(_time_of))
    assert first["matrices"][0]["store_improved"] is True
    with BestStore(store) as st:
        (known,) = st.best()
    time_of, seen = racy_beside(known.text, _time_of)  # the first kernel other than the known best: racy

    second = run_farm(FarmConfig(matrices=_mats(farm_matrices, "banded"), out=str(tmp_path / "f2"),
                                 store=str(store), search=SearchConfig(budget=4), progress=False),
                      evaluator=FakeTimingDouble(time_of))
    row = second["matrices"][0]
    assert row["status"] == "done" and len(seen) == 1, row
    with BestStore(store) as st:
        (best,) = st.best()
    assert normalised(best.text) == normalised(known.text) and row["store_improved"] is False
