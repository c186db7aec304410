"""benchmarks/template_revision_speed.py on the CPU: the earlier form of a template is the one its
module held at ``--before`` (here a folder holding an altered copy of the module), not the one now;
``--compile-times`` compiles both forms of every point and compares their SASS. Mutation killed:
loading the module as it is now for the earlier form (a comparison of a template with itself)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from sparserl.harness.compile import CompileOptions, available_backend
from sparserl.kernels.contract import Op
from sparserl.kernels.templates import get_template
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from tests.conftest import load_benchmark


def _altered_folder(tmp: Path) -> Path:
    for name in ("dia_window_spec", "bsr_stream_spec"):
        path = Path(inspect.getsourcefile(get_template(Op.SPMV, name).renderer))
        (tmp / path.name).write_text(path.read_text().replace("// Specialised to the matrix:", "// Before: for"))
    return tmp


def test_the_earlier_form_comes_from_before_not_from_now(tmp_path) -> None:
    bench = load_benchmark("template_revision_speed")
    folder = _altered_folder(tmp_path)
    card = matrix_card(generate("banded", 4003, seed=1, bands=9))
    p = {"block": 256, "v": 2}
    old, now = bench.template_before("dia_window_spec", str(folder)), get_template(Op.SPMV, "dia_window_spec")
    assert "// Before: for" in old.render(p, card) and "// Before: for" not in now.render(p, card)
    with pytest.raises(SystemExit, match="no template"):
        bench.template_before("dia_window_spec", str(_empty_module(tmp_path / "empty")))


def test_the_earlier_form_renders_with_the_library_as_it_was_then(tmp_path) -> None:
    """csr_lanes_spec's CUDA lives in the library module its template module imports from: the earlier form renders
    with that module as it was at ``--before`` (here altered in a folder), and today's is back afterwards. Kills
    loading only the template's module (a template whose body lives in the library compared with itself) and
    leaving the earlier library in place."""
    import sys

    from sparserl.kernels.library import csr_irregular

    bench = load_benchmark("template_revision_speed")
    t = get_template(Op.SPMV, "csr_lanes_spec")
    module = Path(inspect.getsourcefile(t.renderer))
    (tmp_path / module.name).write_text(module.read_text())
    library = Path(csr_irregular.__file__)
    (tmp_path / library.name).write_text(library.read_text().replace("// Specialised to the matrix: every row",
                                                                       "// Before: every row"))
    card = matrix_card(generate("random", 3001, seed=1, nnz_per_row=16))
    p = next(q for q in t.seeds(card) if t.check(q, card) is None)
    old = bench.template_before("csr_lanes_spec", str(tmp_path))
    assert "// Before: every row" in old.render(p, card)
    assert "// Before:" not in t.render(p, card) and sys.modules[csr_irregular.__name__] is csr_irregular


def _empty_module(folder: Path) -> Path:
    folder.mkdir()
    (folder / "dia.py").write_text("def dia_templates():\n    return []\n")
    return folder


@pytest.mark.slow(seconds=15)
@pytest.mark.skipif(available_backend(CompileOptions(arch="sm_90", backend="nvrtc")) is None, reason="no NVRTC")
def test_compile_times_compile_both_forms_and_compare_their_sass(tmp_path, monkeypatch) -> None:
    """Both forms of every point compile; forms that differ in a comment only have the same SASS (when
    cuobjdump is at hand) and forms whose loads differ have not, so a comparison that always agrees,
or compares a form with itself, shows."""
    bench = load_benchmark("template_revision_speed")
    out = tmp_path / "compile.json"
    monkeypatch.setattr("sys.argv", ["x", "--before", str(_altered_folder(tmp_path)), "--rows", "3000",
                                     "--only", "banded9,block8_cut", "--compile-times", "--out", str(out)])
    assert bench.main() == 0
    res = json.loads(out.read_text())
    assert {r["matrix"] for r in res["compile_times"]} == {"banded9", "block8_cut"}
    assert all(r["before_ok"] and r["now_ok"] and r["now_spill_bytes"] == 0 for r in res["compile_times"])
    if bench.cuobjdump_path() is not None:
        assert all(r["same_sass"] is True for r in res["compile_times"])
        other = tmp_path / "other"  # val read through the read-only cache: other loads, other SASS
        other.mkdir()
        (other / "dia.py").write_text((tmp_path / "dia.py").read_text().replace("__ldcs(", "__ldg("))
        monkeypatch.setattr("sys.argv", ["x", "--before", str(other), "--rows", "3000", "--only", "banded9",
                                         "--compile-times", "--out", str(out)])
        assert bench.main() == 0
        assert all(r["same_sass"] is False for r in json.loads(out.read_text())["compile_times"])
    monkeypatch.setattr("sys.argv", ["x", "--before", str(tmp_path), "--only", "nonesuch"])
    with pytest.raises(SystemExit):
        bench.main()
