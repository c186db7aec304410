"""What ``sparserl best export`` writes trains with ``sparserl sft --data`` (a tiny model, two steps)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from sparserl.kernels.library import variants  # noqa: E402
from sparserl.matrices import generate  # noqa: E402
from sparserl.matrices.card import matrix_card  # noqa: E402
from sparserl.search.export import ExportFilter, export_sft  # noqa: E402
from sparserl.search.store import BestStore, VerifiedKernel, harness_version  # noqa: E402


def test_exported_pairs_train(tmp_path: Path, tiny_model_dir: Path) -> None:
    from sparserl.encoding import sample_nonzeros
    from sparserl.train.sft import SFTConfig, sft

    with BestStore(tmp_path / "s.db") as st:
        for i, fam in enumerate(("banded", "random", "powerlaw")):
            A = generate(fam, 600, seed=i)
            card = matrix_card(A)
            r, c = sample_nonzeros(A, 1024, 0)
            st.add_matrix(card, fam, None, (r.tolist(), c.tolist()))  # no file: prompts from the coordinates
            for v, t in zip(variants("spmv", "CSR")[:2], (10.0, 12.0)):
                st.record(VerifiedKernel(card.fingerprint, "spmv", None, "sm_90", "H200", "cold", v.render(), t, 20.0,
                                         20.0 / t, None, "CSR", v.strategy, v.id, "seed", None, None, "r", harness_version()))
        res = export_sft(st, tmp_path / "pairs.jsonl", ExportFilter(per_matrix=2))
    assert res["rows"] == 6 and res["matrices"] == 3
    out = sft(SFTConfig(data=str(tmp_path / "pairs.jsonl"), model=str(tiny_model_dir), out=str(tmp_path / "sft"),
                        steps=2, batch_size=2, max_nnz=16, eval_every=1000, eval_samples=1, max_new_tokens=8,
                        compile_only=True, device="cpu"))
    assert out["steps"] == 2 and out["train_rows"] + out["val_rows"] == 6
    assert (tmp_path / "sft" / "checkpoint" / "policy.json").exists()
