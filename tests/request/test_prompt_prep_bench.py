"""benchmarks/prompt_prep.py on small matrices: it times one thread against several and refuses to
write a figure when the two passes' prompts differ. Mutations killed: a comparison of the cards only
(an encoder input made otherwise in threads goes unseen), a result written after a mismatch."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.conftest import load_benchmark  # noqa: E402

bench = load_benchmark("prompt_prep")


def test_times_both_passes_and_writes_them(tmp_path, capsys) -> None:
    out = tmp_path / "p.json"
    assert bench.main(["--rows", "300", "--workers", "2", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    fam = res["families"]
    assert set(fam["one_thread"]) == set(fam["threads"]) == {"generate", "cards", "total"}
    assert fam["ratio"] == pytest.approx(fam["one_thread"]["total"] / fam["threads"]["total"])
    assert "| families |" in capsys.readouterr().out


def test_prompts_that_differ_between_the_passes_are_an_error(tmp_path, monkeypatch, capsys) -> None:
    import sparserl.encoding as enc

    real = enc.MatrixInput.from_matrix
    calls = [0]

    def drifting(A, config, features=None):  # the threaded pass's inputs differ from the serial ones
        calls[0] += 1
        inp = real(A, config, features)
        if calls[0] > 13:
            inp.summary[0] += 1.0
        return inp

    monkeypatch.setattr(enc.MatrixInput, "from_matrix", staticmethod(drifting))
    out = tmp_path / "p.json"
    assert bench.main(["--rows", "300", "--workers", "2", "--out", str(out)]) == 1
    assert "differ" in capsys.readouterr().err and not out.exists()
