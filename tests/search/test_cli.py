"""``sparserl search`` for real on the CPU (compile-only through the harness), bad input as one-line
errors, ``sparserl best list|show|export``, export read by the SFT trainer, and the GPU size check."""

from __future__ import annotations

import dataclasses

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparserl.cli import main
from sparserl.harness.compile import find_nvcc
from sparserl.kernels.library import variants
from sparserl.matrices import generate, save_matrix
from sparserl.matrices.card import matrix_card
from sparserl.search.store import (
    SCHEMA_VERSION,
    BestStore,
    VerifiedKernel,
    harness_version,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mtx(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("m") / "banded.mtx"
    save_matrix(generate("banded", 4000, seed=0, bands=5), p)
    return p


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    old = sys.argv
    sys.argv = ["sparserl", *args]
    try:
        with pytest.raises(SystemExit) as exc:
            main()
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")
def test_search_on_a_cpu_compiles_only_and_leaves_the_store_alone(mtx: Path, tmp_path: Path) -> None:
    from sparserl.devices import visible_gpus

    if visible_gpus():
        pytest.skip("a GPU is visible: this is the CPU path")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), SPARSERL_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-m", "sparserl.cli", "search", str(mtx), "--budget", "4", "--store",
           str(tmp_path / "new" / "s.db"), "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "nothing was timed (no GPU)" in proc.stdout and "store was not updated" in proc.stdout
    assert "NOT verified" in proc.stdout
    lines = [json.loads(x) for x in (tmp_path / "out" / "trace.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(x["counted"] and x["verdict"] == "no_gpu" for x in lines)
    assert len({x["id"] for x in lines}) == 4
    first = min(lines, key=lambda x: x["order"])
    assert first["note"] == "selector" and first["id"] == "spmv/dia_vec4/-/block=128"  # the selector's DIA pick
    assert (tmp_path / "out" / "kernel.cu").read_text() == first["text"]
    info = json.loads((tmp_path / "out" / "launch.json").read_text())
    assert info["format"] == "DIA"
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["verified"] is False and rep["search"]["evaluated"] == 4 and rep["search"]["store_writes"] == 0
    assert "## Search" in (tmp_path / "out" / "report.md").read_text()
    assert not (tmp_path / "new").exists()  # nothing to write, so no store made (killed by: opened regardless)


def one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], lines[0]


def test_bad_input_is_a_one_line_error(mtx: Path, tmp_path: Path, capsys) -> None:
    store = ["--store", str(tmp_path / "s.db"), "--out", str(tmp_path / "o")]
    one_line_error(*run_cli(["search", str(mtx), "--budget", "0", *store], capsys)[:3:2], "budget")
    one_line_error(*run_cli(["search", str(mtx), "--budget", "-2", *store], capsys)[:3:2], "budget")
    one_line_error(*run_cli(["search", str(mtx), "--templates", "csr_vector,warp_magic", *store], capsys)[:3:2],
                   "warp_magic", "templates are")
    one_line_error(*run_cli(["search", str(mtx), "--op", "spmm", *store], capsys)[:3:2], "--k")
    bad = tmp_path / "bad.mtx"
    bad.write_text("%%MatrixMarket matrix coordinate real general\n3 3 2\n1 1 1.0\n")
    one_line_error(*run_cli(["search", str(bad), *store], capsys)[:3:2], "bad.mtx")
    newer = tmp_path / "newer.db"
    BestStore(newer).close()
    import sqlite3

    con = sqlite3.connect(newer)
    con.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 5,))
    con.commit()
    con.close()
    one_line_error(*run_cli(["search", str(mtx), "--store", str(newer)], capsys)[:3:2], "newer SparseRL")
    one_line_error(*run_cli(["best", "list", "--store", str(newer)], capsys)[:3:2], "newer SparseRL")
    one_line_error(*run_cli(["best", "list", "--store", str(tmp_path / "none.db")], capsys)[:3:2], "no best-known store")
    missing = str(tmp_path / "no-model.json.gz")  # a mistyped model file: it only warned, and searched without it
    one_line_error(*run_cli(["search", str(mtx), "--cost-model", missing, *store], capsys)[:3:2], "--cost-model",
                   "no such file")


def test_too_large_for_the_gpu_is_refused() -> None:
    from sparserl.errors import SparseRLError
    from sparserl.search.footprint import check_fits, device_footprint_bytes

    need = device_footprint_bytes(1_000_000, 1_000_000, 16_000_000)
    assert need >= 3 * 8 * 16_000_000  # the matrix three times over at least
    check_fits("m", 1_000_000, 1_000_000, 16_000_000, memory=[(need + 1, need + 1)])
    with pytest.raises(SparseRLError, match="too large for the GPU") as exc:  # the smaller GPU counts
        check_fits("m", 1_000_000, 1_000_000, 16_000_000, memory=[(140 << 30, 140 << 30), (need - 1, need - 1)])
    assert "\n" not in str(exc.value)
    assert device_footprint_bytes(1000, 1000, 5000, k=64) > device_footprint_bytes(1000, 1000, 5000)


def test_little_free_memory_warns_and_does_not_refuse(caplog) -> None:
    """The harness's own caches make the GPU look full (nvidia-smi counts them as used) and are let go
    when a matrix needs room: a matrix that fits the GPU's memory is not refused for what is free now.
    Kills: the check reading free memory again (a bench of eleven 1M-row matrices died on the
    seventh with "0.0 GiB is free")."""
    from sparserl.search.footprint import check_fits, device_footprint_bytes

    need = device_footprint_bytes(1_000_000, 1_000_000, 16_000_000)
    with caplog.at_level(logging.WARNING, logger="sparserl.search.footprint"):
        check_fits("m", 1_000_000, 1_000_000, 16_000_000, memory=[(0, 80 << 30)])
    assert "is free now" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sparserl.search.footprint"):
        check_fits("m", 1_000_000, 1_000_000, 16_000_000, memory=[(need + 1, 80 << 30)])
    assert not caplog.text


def test_visible_devices_select_the_gpus_checked(monkeypatch) -> None:
    from sparserl.search.footprint import _visible_filter

    rows = [("0", "GPU-aaa", 10), ("1", "GPU-bbb", 20)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert _visible_filter(rows) == [rows[1]]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa")
    assert _visible_filter(rows) == [rows[0]]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert _visible_filter(rows) == rows


@pytest.fixture()
def filled_store(tmp_path: Path, mtx: Path) -> tuple[Path, object]:
    """A store holding three verified kernels of one matrix (written as a GPU search would)."""
    from sparserl.matrices import load_matrix

    A = load_matrix(mtx)
    card = matrix_card(A)
    path = tmp_path / "s.db"
    vs = variants("spmv", "DIA")[:2] + variants("spmv", "CSR")[:1]
    with BestStore(path) as st:
        st.add_matrix(card, "banded", str(mtx), ([0, 1, 2], [0, 1, 3]))
        for v, t in zip(vs, (20.0, 15.0, 30.0)):
            st.record(VerifiedKernel(card.fingerprint, "spmv", None, "sm_90", "NVIDIA H200", "cold", v.render(), t,
                                     45.0, 45.0 / t, 0.5, v.format, v.strategy, v.id, "seed", None, None, "run1",
                                     harness_version()))
    return path, card


def test_best_list_and_show(filled_store, capsys) -> None:
    path, card = filled_store
    rc, out, _ = run_cli(["best", "list", "--store", str(path)], capsys)
    assert rc == 0 and "banded" in out and "3.00x" in out and card.fingerprint[:12] in out
    rc, out, _ = run_cli(["best", "list", "--store", str(path), "--json"], capsys)
    rows = [json.loads(x) for x in out.splitlines()]
    assert len(rows) == 1 and rows[0]["speedup"] == 3.0 and rows[0]["candidate_id"] == variants("spmv", "DIA")[1].id
    rc, out, _ = run_cli(["best", "show", "banded", "--store", str(path), "--results"], capsys)
    assert rc == 0 and variants("spmv", "DIA")[1].render().strip().splitlines()[0] in out
    assert "15.00 us" in out and "verified kernels of banded (3)" in out
    rc, _, err = run_cli(["best", "show", "nosuch", "--store", str(path)], capsys)
    one_line_error(rc, err, "nosuch")


def test_export_within_a_share_of_the_best_known(filled_store, tmp_path: Path, capsys) -> None:
    """--within keeps the kernels at most that fraction slower than the matrix's best (15, 20, 30 us here)."""
    from sparserl.data.rows import read_rows
    from sparserl.search.export import ExportFilter, export_rows

    path, card = filled_store
    out = tmp_path / "near.jsonl"
    rc, _, _ = run_cli(["best", "export", str(out), "--store", str(path), "--per-matrix", "5", "--within", "0.4"],
                         capsys)
    assert rc == 0 and [r.times.kernel_us for r in read_rows(out)] == [15.0, 20.0]
    with BestStore(path) as st:
        assert [r.times.kernel_us for r in export_rows(st, ExportFilter(per_matrix=5, within=0.3))[0]] == [15.0]
        assert len(export_rows(st, ExportFilter(per_matrix=5))[0]) == 3
        assert export_rows(st, ExportFilter(per_matrix=5, fingerprints=frozenset({"other"})))[0] == []
        assert len(export_rows(st, ExportFilter(per_matrix=5, fingerprints=frozenset({card.fingerprint})))[0]) == 3
    rc, _, err = run_cli(["best", "export", str(out), "--store", str(path), "--within", "-1"], capsys)
    one_line_error(rc, err, "--within must be >= 0")


def test_export_is_sft_data_the_trainer_reads(filled_store, tmp_path: Path, capsys, mtx: Path) -> None:
    from sparserl.data.rows import KernelTimes, read_rows

    path, card = filled_store
    out = tmp_path / "pairs.jsonl"
    rc, msg, _ = run_cli(["best", "export", str(out), "--store", str(path)], capsys)
    assert rc == 0 and "wrote 1 rows" in msg
    (row,) = read_rows(out)
    assert row.code == variants("spmv", "DIA")[1].render() and row.format == "DIA"
    assert row.shape == (card.rows, card.cols) and row.rows == [0, 1, 2] and row.matrix == str(mtx)
    assert row.times == KernelTimes(kernel_us=15.0, cusparse_us=45.0, speedup=3.0, regime="cold")
    run_cli(["best", "export", str(out), "--store", str(path), "--per-matrix", "5", "--min-speedup", "2"], capsys)
    assert [r.variant for r in read_rows(out)] == [variants("spmv", "DIA")[1].id, variants("spmv", "DIA")[0].id]
    rc, _, err = run_cli(["best", "export", str(out), "--store", str(path), "--min-speedup", "9"], capsys)
    one_line_error(rc, err, "nothing to export")

    pytest.importorskip("torch")
    from sparserl.encoding import EncodingConfig
    from sparserl.train.dataset import SFTDataset

    rows = read_rows(out)
    s = SFTDataset(rows, EncodingConfig(max_nnz=16)).sample(rows[0])  # from the matrix file
    assert s.matrix.shape == (card.rows, card.cols) and s.nnz == card.nnz
    gone = dataclasses.replace(rows[0], matrix=None)  # the file is gone: the prompt comes from the coordinates
    s2 = SFTDataset([gone], EncodingConfig(max_nnz=16)).sample(gone)
    assert s2.matrix.shape == (card.rows, card.cols) and s2.nnz == card.nnz


def test_outputs_that_would_destroy_an_input_or_that_the_machine_refuses_are_one_line(filled_store, tmp_path: Path,
                                                                                       capsys) -> None:
    """``best export`` or ``best cost-model`` onto the store they read is refused and the store is left whole (it
    was overwritten with JSONL, rc 0); an output path the machine refuses (a folder where a file goes, a file where
    a folder goes) is one ``error:`` line and leaves no partial file (it was a traceback); ``--op`` is checked by
    list and show too (a typo listed nothing, rc 0)."""
    path, _ = filled_store
    before = path.read_bytes()
    one_line_error(*run_cli(["best", "export", str(path), "--store", str(path)], capsys)[:3:2], "the store", "destroy")
    one_line_error(*run_cli(["best", "cost-model", "--store", str(path), "--out", str(path)], capsys)[:3:2],
                   "the store")
    assert path.read_bytes() == before
    out = tmp_path / "out"
    out.mkdir()
    folder = out / "taken.jsonl"
    folder.mkdir()
    one_line_error(*run_cli(["best", "export", str(folder), "--store", str(path)], capsys)[:3:2], "taken.jsonl")
    assert [p.name for p in out.iterdir()] == ["taken.jsonl"], "no partial file left beside it"
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    one_line_error(*run_cli(["matrix", "gen", "random", "--rows", "10", "-o", str(a_file / "a.mtx")], capsys)[:3:2],
                   "file.txt")
    one_line_error(*run_cli(["best", "list", "--store", str(path), "--op", "SPMV"], capsys)[:3:2], "--op")
    one_line_error(*run_cli(["best", "show", "banded", "--store", str(path), "--op", "SpMV"], capsys)[:3:2], "--op")
