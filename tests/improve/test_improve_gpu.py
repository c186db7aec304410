"""GPU: one round of ``sparserl improve`` on two small matrices with the real harness (no double):
search with the tiny policy proposing, the best-known store, the teacher set, a real fine-tune,
validation against the library oracle, the keep/reject decision.

Mutations this kills: kernels entering the store (and so the teacher set) without having been
verified, as the CPU test's double lets any text that starts with "FORMAT:" be (every teacher
row is verified again by an independent harness); a search that verifies nothing or reports
compile-only results on a GPU; a round that skips its fine-tune or its validation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparserl.improve import ImproveConfig, improve
from sparserl.kernels.contract import Op
from sparserl.matrices import load_matrix
from sparserl.search.store import BestStore, harness_version
from tests.improve.data_folder import write_data_folder

pytestmark = pytest.mark.gpu

TRAIN = (("banded", 0, 3000), ("random", 1, 2500))
VAL = (("stencil2d", 2, 2500),)


def data_folder(d: Path) -> Path:
    """A data folder as 'sparserl data build' writes it: 2 train and 1 val matrices, a row each."""
    return write_data_folder(d, {"train": TRAIN, "val": VAL})


def test_one_round_on_two_small_matrices(tiny_model_dir: Path, loop_evaluator, fresh_evaluator,
                                         tmp_path: Path) -> None:
    cfg = ImproveConfig(data=str(data_folder(tmp_path / "data")), model=str(tiny_model_dir),
                        out=str(tmp_path / "improve"), rounds=1, store=str(tmp_path / "best.sqlite"),
                        matrices_per_round=2, search_budget=8, search_seconds=None, policy_share=0.25,
                        max_new_tokens=64, within=0.5, per_matrix=2, sft_steps=2, sft_batch_size=2, sft_warmup=1,
                        val_matrices=1, val_samples=2, test_samples=0)
    res = improve(cfg, loop_evaluator)

    assert [r["round"] for r in res["rounds"]] == [0, 1]
    r1 = res["rounds"][1]
    search = r1["search"]
    assert set(search) == {f"{fam}_{seed}" for fam, seed, _ in TRAIN}, search
    for name, s in search.items():  # real verdicts: library seeds verified and timed, on a GPU
        assert not s["no_gpu"] and s["evaluated"] == 8 and s["correct"] >= 1, (name, s)
        assert s["best_speedup"] > 0 and s["best_known_speedup"] == pytest.approx(s["best_speedup"]), (name, s)
    assert r1["teacher"]["rows"] >= 2 and r1["teacher"]["matrices"] == 2, r1["teacher"]
    assert r1["sft"]["steps"] == 2 and Path(r1["sft"]["checkpoint"], "policy.json").exists()
    for fig in (res["rounds"][0]["val"], r1["val"]):  # validated on the GPU: compile and correct rates measured
        assert fig["samples"] == 2 and 0.0 <= fig["correct_rate"] <= fig["compile_rate"] <= 1.0, fig
        assert fig["vs_oracle"] is not None, fig
    assert res["rounds"][0]["kept"] and r1["why"]

    # every teacher row that came from the store is a kernel an independent harness verifies on its matrix
    teacher = [json.loads(line) for line in Path(cfg.out, "round_1", "teacher", "train.jsonl").read_text().splitlines()]
    from_store = [row for row in teacher if "fingerprint" in row]
    assert len(from_store) == r1["teacher"]["rows"]
    with BestStore(cfg.store) as store:
        best = store.best(op="spmv", regime="cold", harness_version=harness_version())
    assert {b.fingerprint for b in best} == {row["fingerprint"] for row in from_store}
    refs = {}
    for row in from_store:
        if row["matrix"] not in refs:
            refs[row["matrix"]] = fresh_evaluator.register(load_matrix(row["matrix"]), Path(row["matrix"]).stem)
        again = fresh_evaluator.evaluate(row["code"], refs[row["matrix"]], Op.SPMV)
        assert again.ok, (row["variant"], row["matrix"], again.error_kind.value, again.message)
