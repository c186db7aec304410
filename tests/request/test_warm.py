"""The prompts' CPU work done up front, in threads: the same results as made one by one, each made
once, and nothing left to make on the path where the GPU waits."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sparserl.data.rows import Refinement, SFTRow  # noqa: E402
from sparserl.encoding import EncodingConfig  # noqa: E402
from sparserl.eval.compare import EvalConfig, matrix_set  # noqa: E402
from sparserl.kernels.contract import Op  # noqa: E402
from sparserl.matrices import family_names, generate, save_matrix  # noqa: E402
from sparserl.matrices.card import prompt_card  # noqa: E402
from sparserl.model.policy import PolicyConfig  # noqa: E402
from sparserl import parallel  # noqa: E402
from sparserl.request import warm  # noqa: E402
from sparserl.request.context import MatrixContext  # noqa: E402
from sparserl.train import dataset  # noqa: E402
from sparserl.train.dataset import SFTDataset  # noqa: E402

CONFIG = PolicyConfig(encoding=EncodingConfig(max_nnz=16, d_pe=8, summary_tokens=2), card=True)


def test_warm_contexts_leaves_nothing_to_compute(monkeypatch) -> None:
    ctxs = [MatrixContext(generate(f, 400, seed=i), f, Op.SPMV) for i, f in enumerate(("banded", "powerlaw"))]
    fresh = [MatrixContext(c.A, c.name, Op.SPMV) for c in ctxs]
    warm.warm_contexts(ctxs, [CONFIG, CONFIG], workers=2)
    # nothing may be computed again: the card and the encoder input must already be in each context
    import sparserl.encoding as enc
    import sparserl.request.context as context

    def boom(*a, **k):
        raise AssertionError("computed again after warm_contexts")

    monkeypatch.setattr(context, "card_and_features", boom)
    monkeypatch.setattr(enc.MatrixInput, "from_matrix", boom)
    warmed = [c.sample(CONFIG) for c in ctxs]
    monkeypatch.undo()
    for w, f in zip(warmed, fresh):  # the same as made one by one
        s = f.sample(CONFIG)
        assert w.card == s.card == prompt_card(f.A)
        assert np.array_equal(w.matrix.rows, s.matrix.rows) and np.array_equal(w.matrix.cols, s.matrix.cols)
        assert np.array_equal(w.matrix.summary, s.matrix.summary) and w.matrix.shape == s.matrix.shape


def test_evaluate_makes_the_prompts_in_the_warm_up_threads(tmp_path: Path, monkeypatch) -> None:
    """evaluate makes every matrix's card before generation, in the warm-up's threads, and never again
    on the generation path. Kills: the warm-up left out of evaluate (the cards are then made in the
    main thread, as the first batch asks for them)."""
    import sparserl.request.context as context
    from sparserl.eval.compare import evaluate

    d = tmp_path / "m"
    d.mkdir()
    for i, fam in enumerate(("banded", "random", "skewed")):
        save_matrix(generate(fam, 400, seed=i), d / f"{fam}.mtx")
    made: list[str] = []
    real = context.card_and_features
    monkeypatch.setattr(context, "card_and_features", lambda A: made.append(threading.current_thread().name) or real(A))
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 4)  # threads even on a one-core machine

    class Stand:
        config = CONFIG

        def generate(self, samples, **kw):
            return ["FORMAT: CSR"] * len(samples)

    evaluate(EvalConfig(matrices=str(d), samples=2, out=str(tmp_path / "e"), compile_only=True, plots=False),
             policies={"stand-in": Stand()})
    assert len(made) == 3 and all(name.startswith("warm") for name in made)


def test_families_made_in_threads_are_the_serial_ones() -> None:
    got = matrix_set(EvalConfig(matrices="families", family_rows=500, out="unused"))
    assert [fam for _, fam in got] == family_names()
    for ctx, fam in got:
        A = generate(fam, 500, seed=EvalConfig().seed + 7)
        assert ctx.name == f"{fam}_500" and ctx.shape == A.shape
        assert np.array_equal(ctx.A.indptr, A.indptr) and np.array_equal(ctx.A.indices, A.indices)
        assert np.array_equal(ctx.A.data, A.data)


def test_sft_dataset_warm_makes_each_matrix_once_before_the_loop(tmp_path: Path, monkeypatch) -> None:
    rows = []
    for i, fam in enumerate(("banded", "skewed", "random")):
        A = generate(fam, 600, seed=i)
        path = tmp_path / f"{fam}.npz"
        save_matrix(A, path)
        base = SFTRow(matrix=str(path), shape=A.shape, rows=[0], cols=[int(A.indices[0])], op="spmv",
                      nnz=int(A.nnz), code="FORMAT: CSR")
        rows += [base, dataclasses.replace(base, code="FORMAT: COO"),
                 dataclasses.replace(base, refinement=Refinement("FORMAT: CSR", "1.0x", True))]
    loads: list[str] = []
    real_load = dataset.load_matrix
    monkeypatch.setattr(dataset, "load_matrix", lambda p: loads.append(str(p)) or real_load(p))
    ds = SFTDataset(rows, CONFIG)
    assert ds.warm(workers=2) >= 0
    assert sorted(loads) == sorted({r.matrix for r in rows})  # each file once
    assert sorted(ds.matrices_made()) == sorted({r.matrix for r in rows})

    def boom(*a, **k):
        raise AssertionError("made again on the training loop's path")

    monkeypatch.setattr(dataset, "load_matrix", boom)
    monkeypatch.setattr(dataset, "prompt_card", boom)
    monkeypatch.setattr(dataset.MatrixInput, "from_matrix", boom)
    samples = [ds.sample(r) for r in rows]  # refinement rows too: their prompt only differs
    assert all(s.card == prompt_card(real_load(r.matrix)) for s, r in zip(samples, rows))
    assert "1.0x" in samples[2].prompt


def test_families_that_do_not_fit_together_are_generated_one_by_one(monkeypatch) -> None:
    """Each generation checks its own memory need against what is free; in threads, all would run at
    once. So when their needs together pass the free memory, matrix_set generates them in turn.
    Kills: the threads used whatever the memory."""
    from sparserl.matrices import generators
    from sparserl.matrices.generators import generation_bytes

    rows = 300
    total = sum(generation_bytes(f, rows) for f in family_names())
    seen: list[str] = []
    real = generators.generate
    monkeypatch.setattr(generators, "generate",
                        lambda *a, **k: seen.append(threading.current_thread().name) or real(*a, **k))
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 4)
    for have, threaded in ((total - 1, False), (total, True), (None, True)):
        seen.clear()
        monkeypatch.setattr(generators, "available_memory", lambda: have)
        matrix_set(EvalConfig(matrices="families", family_rows=rows, out="unused"))
        assert len(seen) == len(family_names())
        assert all(n.startswith("generate") for n in seen) if threaded else set(seen) == {
            threading.current_thread().name}, (have, seen)


def test_a_context_given_for_a_job_is_reused_only_for_its_own_file(tmp_path: Path) -> None:
    """Kills: a context of another matrix used in place of the job's (a search of the wrong matrix)."""
    a, b = tmp_path / "a.npz", tmp_path / "b.npz"
    save_matrix(generate("banded", 300, seed=0), a)
    save_matrix(generate("random", 300, seed=1), b)
    ctx = MatrixContext.load(a)
    ctx.prompt_card  # noqa: B018
    again = MatrixContext.reuse_or_load(ctx, str(a), "spmm", 8)
    assert again.A is ctx.A and again.op is Op.SPMM and again.k == 8 and "card_and_features" in again._shared
    assert MatrixContext.reuse_or_load(None, b).name == "b"
    with pytest.raises(ValueError, match="not of"):
        MatrixContext.reuse_or_load(ctx, b)
    with pytest.raises(ValueError, match="made in memory"):
        MatrixContext.reuse_or_load(MatrixContext(ctx.A, "x", Op.SPMV), a)
