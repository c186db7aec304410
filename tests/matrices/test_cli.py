"""``sparserl matrix``: info / gen / families through CliRunner, and the error path end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import sparserl
from sparserl.errors import MatrixError
from sparserl.matrices import FAMILIES, compute_features, generate, load_matrix, save_matrix
from sparserl.cli.matrix import app

runner = CliRunner()


def ok(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exception is None, result.output
    assert result.exit_code == 0, result.output
    return result.output


def fails(args: list[str], *needles: str) -> MatrixError:
    result = runner.invoke(app, args)
    exc = result.exception
    assert isinstance(exc, MatrixError), (exc, result.output)
    msg = str(exc)
    assert msg and "\n" not in msg
    for needle in needles:
        assert needle in msg, msg
    return exc


def test_families_lists_every_family_with_defaults() -> None:
    out = ok(["families"])
    for name in FAMILIES:
        assert name in out
    assert "nnz_per_row=16" in out and "bands=9" in out


def test_gen_help_lists_families_descriptions_and_defaults() -> None:
    out = " ".join(ok(["gen", "--help"]).split())  # undo line wrapping
    for name, spec in FAMILIES.items():
        assert f"{name}:" in out
        for key, value in spec.defaults.items():
            assert f"{key}={'auto' if value is None else value}" in out
    assert "main diagonal only" in out


@pytest.mark.parametrize("suffix", [".mtx", ".mtx.gz", ".npz"])
def test_gen_writes_the_same_matrix_as_generate(tmp_path: Path, suffix: str) -> None:
    out_path = tmp_path / f"m{suffix}"
    out = ok(
        [
            "gen",
            "banded",
            "--rows",
            "120",
            "--cols",
            "100",
            "--seed",
            "3",
            "-p",
            "bands=5",
            "-o",
            str(out_path),
        ]
    )
    assert out.count("\n") == 1 and "120 x 100" in out and "nonzeros" in out and "s (generate" in out
    A = load_matrix(out_path)
    B = generate("banded", 120, cols=100, seed=3, bands=5)
    np.testing.assert_array_equal(A.indices, B.indices)
    np.testing.assert_array_equal(A.data, B.data)


def test_gen_param_types(tmp_path: Path) -> None:
    ok(
        [
            "gen",
            "powerlaw",
            "--rows",
            "300",
            "--param",
            "alpha=2.5",
            "--param",
            "mean_degree=4",
            "--out",
            str(tmp_path / "p.npz"),
        ]
    )
    ok(["gen", "skewed", "--rows", "300", "-p", "long_len=none", "-o", str(tmp_path / "s.npz")])
    assert load_matrix(tmp_path / "s.npz").shape == (300, 300)


def test_info_table_and_json(tmp_path: Path) -> None:
    path = tmp_path / "t.mtx"
    save_matrix(generate("stencil2d", 100, seed=1), path)
    table = ok(["info", str(path)])
    for key in ("rows", "bandwidth", "num_diagonals", "block_density_8", "pattern_symmetric", "row_len_hist"):
        assert key in table
    data = json.loads(ok(["info", str(path), "--json"]))
    assert data.pop("file") == str(path)
    assert set(data) == set(compute_features(load_matrix(path)).to_dict())  # every feature, by name


def test_info_json_gives_the_hand_derived_features(tmp_path: Path) -> None:
    """A 4 x 5 matrix written by hand, its features derived by hand (the earlier check compared the
    command's output with compute_features, the function it calls): entries (0,0) (0,1) (2,1) (2,2)
    (2,3) (3,0) (3,4); row lengths 2, 0, 3, 2; diagonals j - i: +1 three times, 0 twice, -1 and -3
    once, whose lengths inside the rectangle are 4, 4, 3 and 1; 2x2 blocks touched (0,0) (1,0) (1,1)
    (1,2), 4x4 blocks (0,0) (0,1), one 8x8 block.

    Mutations killed: the lower bandwidth taken from the upper side, diagonal lengths taken as
    min(m, n) - |d| (wrong for a rectangle), the sample std in place of the population std."""
    path = tmp_path / "hand.mtx"
    path.write_text("%%MatrixMarket matrix coordinate real general\n4 5 7\n"
                    "1 1 1.0\n1 2 -2.0\n3 2 0.5\n3 3 4.0\n3 4 1.5\n4 1 3.0\n4 5 -1.0\n")
    d = json.loads(ok(["info", str(path), "--json"]))
    assert (d["rows"], d["cols"], d["nnz"], d["density"]) == (4, 5, 7, 0.35)
    assert (d["row_len_min"], d["row_len_mean"], d["row_len_max"]) == (0, 1.75, 3)
    assert d["row_len_std"] == pytest.approx(1.1875 ** 0.5)
    assert d["row_len_hist"] == [1, 0, 3] + [0] * 13 and d["empty_rows"] == 1
    assert (d["bandwidth"], d["lower_bandwidth"], d["upper_bandwidth"]) == (3, 3, 1)
    assert d["num_diagonals"] == 4 and d["diag_fill"] == pytest.approx(7 / 12)
    assert d["diagonal_offsets_top"] == [1, 0, -1, -3]
    assert d["block_density_2"] == pytest.approx(7 / 16) and d["block_density_4"] == pytest.approx(7 / 32)
    assert d["block_density_8"] == pytest.approx(7 / 64)


def test_errors_are_matrix_errors(tmp_path: Path) -> None:
    fails(["info", str(tmp_path / "absent.mtx")], "absent.mtx", "no such file")
    bad = tmp_path / "bad.mtx"
    bad.write_text("%%MatrixMarket matrix coordinate real general\n2 2 1\n3 1 1.0\n")
    fails(["info", str(bad)], "bad.mtx", "line 3")
    out = str(tmp_path / "o.mtx")
    fails(["gen", "nope", "--rows", "5", "-o", out], "unknown matrix family")
    fails(["gen", "random", "--rows", "5", "-p", "nnz_per_row", "-o", out], "KEY=VALUE")
    fails(["gen", "random", "--rows", "5", "-p", "nnz_per_row=many", "-o", out], "not a number")
    fails(["gen", "random", "--rows", "5", "-p", "k=3", "-o", out], "unknown parameter")
    fails(["gen", "random", "--rows", "0", "-o", out], "rows must be")
    fails(["gen", "random", "--rows", "5", "-o", str(tmp_path / "o.csv")], "extension")
    assert not (tmp_path / "o.mtx").exists()


def test_usage_errors_stay_click_errors() -> None:
    result = runner.invoke(app, ["gen", "random"])  # --rows and --out missing
    assert result.exit_code == 2 and not isinstance(result.exception, MatrixError)


def test_root_cli_mounts_matrix_app(tmp_path: Path) -> None:
    from sparserl.cli import app as root_app

    result = runner.invoke(root_app, ["matrix", "families"])
    assert result.exit_code == 0 and "stencil3d_27" in result.output
    result = runner.invoke(root_app, ["matrix", "info", str(tmp_path / "absent.npz")])
    assert isinstance(result.exception, MatrixError)


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    src = str(Path(sparserl.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "sparserl.cli", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_subprocess_bad_file_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "BAD.mtx"
    bad.write_text("%%MatrixMarket matrix coordinate real general\n2 2 2\n1 1 nan\n2 2 1\n")
    proc = _run_cli("matrix", "info", str(bad))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "BAD.mtx: line 3" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_subprocess_missing_file_argument_is_one_error_line(tmp_path: Path) -> None:
    """A missing file is said the same way by every command ("PATH: no such file"), exit 2, no
    traceback: check-kernel (its kernel and its matrix), generate, search and matrix info."""
    absent_cu, absent_mtx = str(tmp_path / "absent.cu"), str(tmp_path / "absent.mtx")
    mtx = tmp_path / "m.mtx"
    save_matrix(generate("banded", 50, seed=0, bands=3), mtx)
    for args, missing in ((("check-kernel", absent_cu, absent_mtx), "absent"),
                          (("check-kernel", absent_cu, str(mtx)), "absent.cu"),
                          (("matrix", "info", absent_mtx), "absent.mtx"),
                          (("search", absent_mtx, "--budget", "1"), "absent.mtx")):
        proc = _run_cli(*args)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, (args, proc.stderr)
        assert lines[0].startswith("error: ") and missing in lines[0] and lines[0].endswith("no such file"), lines
        assert "Traceback" not in proc.stderr + proc.stdout


def test_gen_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    out = tmp_path / "a.npz"
    ok(["gen", "diagonal", "--rows", "10", "-o", str(out)])
    fails(["gen", "banded", "--rows", "10", "-o", str(out)], "a.npz exists", "--force")
    assert load_matrix(out).nnz == 10  # untouched
    ok(["gen", "banded", "--rows", "10", "-o", str(out), "--force"])
    assert load_matrix(out).nnz > 10


def test_gen_refuses_what_does_not_fit_in_memory_at_once(tmp_path: Path, monkeypatch, cli) -> None:
    """100M rows on a small machine: refused in one line before anything is built (it used to
    run out of memory after minutes)."""
    import time

    import sparserl.matrices.generators as gens
    from tests.conftest import one_line_error

    monkeypatch.setattr(gens, "available_memory", lambda: 8 << 30)
    t0 = time.perf_counter()
    line = one_line_error(cli("matrix", "gen", "random", "--rows", "100000000", "-o", tmp_path / "big.mtx"),
                          "1600000000 nonzeros", "GiB", "8.0 GiB is available", "fewer rows")
    assert time.perf_counter() - t0 < 5, line
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_expected_nnz_is_what_generate_builds(family: str) -> None:
    from sparserl.matrices.generators import _coerce_params, expected_nnz, memory_estimate

    for rows, cols in ((1000, None), (777, 300)):
        if not FAMILIES[family].takes_cols and cols is not None:
            continue
        A = generate(family, rows, cols=cols, seed=1)
        est = expected_nnz(family, rows, cols, _coerce_params(family, FAMILIES[family], {}))
        if family == "powerlaw":  # random row lengths with mean mean_degree (capped at cols)
            assert 0.7 * est < A.nnz < 1.3 * est
        elif family in ("block", "dense_lines"):  # an edge block counts whole; crossing lines count twice
            assert A.nnz <= est < 1.05 * A.nnz
        elif family == "rmat":  # edges drawn, before duplicates merge (more of them on small graphs)
            assert A.nnz <= est < 1.3 * A.nnz
        elif family in ("circuit", "kronecker", "cartesian"):  # random edges that may repeat
            assert A.nnz <= est < 1.3 * A.nnz
        elif family in ("lp", "fem_mixed", "road"):  # drawn row lengths, element types, streets: at their largest
            assert A.nnz <= est < 3 * A.nnz
        else:
            assert est == A.nnz, (family, rows, cols)
        assert memory_estimate(family, rows, cols) > 8 * A.nnz  # at least the matrix itself


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_kill_during_a_write_leaves_nothing_behind(tmp_path: Path, sig: str) -> None:
    """Interrupted while writing a large .mtx, `matrix gen` must not leave a hidden .NAME.tmpPID
    file of hundreds of MB behind: one line, status 130, no file at all."""
    import signal
    import time

    src = str(Path(sparserl.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "big.mtx"
    proc = subprocess.Popen([sys.executable, "-m", "sparserl.cli", "matrix", "gen", "random", "--rows", "1000000",
                             "-o", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".big.mtx.tmp*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "the write finished before it could be interrupted"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.strip() == "error: interrupted", err
    assert list(tmp_path.iterdir()) == []
