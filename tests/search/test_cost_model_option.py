"""``--cost-model FILE`` checked before any work (``search``, ``farm``, ``improve``): a missing file or one that is
no cost model at all (a matrix given by mistake, junk) is one error line; a cost model file of another version or
feature layout passes here and falls back to the selector's order with a logged line at the search (the rule for
a model of another version; tested in test_cost_model.py). Killed mutation: the content check removed (a matrix
given as the model warned and searched on)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sparserl.errors import SparseRLError
from sparserl.search.cost_model import MODEL_FORMAT
from sparserl.search.ranker import check_cost_model_option


def test_the_cost_model_option_refuses_what_is_no_model(tmp_path: Path) -> None:
    for spec in (None, "default", "none"):
        check_cost_model_option(spec)
    with pytest.raises(SparseRLError, match="no such file"):
        check_cost_model_option(str(tmp_path / "absent.json"))
    (tmp_path / "A.mtx").write_text("%%MatrixMarket matrix coordinate real general\n1 1 1\n1 1 1.0\n")
    (tmp_path / "other.json").write_text(json.dumps({"format": "something else"}))
    (tmp_path / "broken.json.gz").write_bytes(b"\x1f\x8bnot gzip")
    for name in ("A.mtx", "other.json", "broken.json.gz"):
        with pytest.raises(SparseRLError, match=f"--cost-model {tmp_path / name}: not a cost model file"):
            check_cost_model_option(str(tmp_path / name))
    old = {"format": MODEL_FORMAT, "format_version": -1, "booster": ""}  # another version: the search falls back
    (tmp_path / "old.json.gz").write_bytes(gzip.compress(json.dumps(old).encode()))
    check_cost_model_option(str(tmp_path / "old.json.gz"))
