"""``generate --search N``: the model's samples, then N searched candidates, the best of all returned
(compile-only here; the GPU path is the same code with verified results)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from sparserl.encoding import EncodingConfig  # noqa: E402
from sparserl.generate import GenerateConfig, generate_kernel  # noqa: E402
from sparserl.harness.compile import find_nvcc  # noqa: E402
from sparserl.matrices import generate, save_matrix  # noqa: E402
from sparserl.search.store import BestStore  # noqa: E402

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found")

BROKEN = "FORMAT: CSR\nLAUNCH: grid=ceil_div(m, 128), block=128\nnot cuda at all\n"


class FixedSampler:
    """Stands in for the policy's sampling only: returns given completions in turn."""

    config = type("C", (), {"encoding": EncodingConfig(max_nnz=16)})()
    device = "cpu"

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.prompts: list = []

    def generate(self, samples, **kw):
        self.prompts += [s.prompt for s in samples]
        return [self.texts[i % len(self.texts)] for i in range(len(samples))]


def test_generate_then_search(tmp_path: Path) -> None:
    from sparserl.devices import visible_gpus

    if visible_gpus():
        pytest.skip("a GPU is visible: this is the compile-only path")
    mtx = tmp_path / "banded.mtx"
    save_matrix(generate("banded", 3000, seed=0, bands=5), mtx)
    pol = FixedSampler([BROKEN])
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=2, out=str(tmp_path / "g"), compile_only=True,
                                         search=5, store=str(tmp_path / "s.db")), policy=pol)
    assert rep.counts.n == 2 and rep.counts.compiled == 0  # the model wrote nothing usable
    assert rep.search["evaluated"] == 5 and rep.source.startswith("search: ")
    trace = [json.loads(x) for x in (tmp_path / "g" / "search_trace.jsonl").read_text().splitlines()]
    assert [x["counted"] for x in trace].count(False) == 1, "the (deduplicated) samples entered without budget"
    assert sum(x["counted"] for x in trace) == 5
    refine = [p for p in pol.prompts if p is not None]
    assert refine and "Previous kernel:\n" + BROKEN.strip() in refine[0] and "Measured: contract_error" in refine[0]
    kernel = (tmp_path / "g" / "kernel.cu").read_text()
    searched = {x["text"]: x["id"] for x in trace if x["counted"] and x["verdict"] == "no_gpu"}
    assert kernel in searched, "the kernel returned is one the search compiled"
    assert rep.source.endswith(searched[kernel]), "the report names the kernel it returned"
    assert kernel.startswith("FORMAT: ") and kernel != BROKEN
    with BestStore(tmp_path / "s.db") as st:
        assert st.counts()["results"] == 0, "compile-only: nothing enters the store"
