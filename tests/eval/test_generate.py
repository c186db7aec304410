"""The main job's logic with a stand-in sampler (fixed completions), compile-only on CPU and
verified on a GPU, plus load_kernel on the GPU."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from sparserl.encoding import EncodingConfig  # noqa: E402
from sparserl.errors import SparseRLError  # noqa: E402
from sparserl.generate import GenerateConfig, generate_kernel  # noqa: E402
from sparserl.harness.compile import find_nvcc  # noqa: E402
from sparserl.harness.result import ErrorKind  # noqa: E402
from sparserl.request.report import Counts  # noqa: E402
from tests.conftest import NEEDS_NVCC  # noqa: E402
from sparserl.kernels.library import get_variant, variants  # noqa: E402
from sparserl.matrices import generate, save_matrix  # noqa: E402

pytestmark = pytest.mark.skipif(find_nvcc() is None, reason=NEEDS_NVCC)

BROKEN = "Here you go:\n```cuda\nFORMAT: CSR\nLAUNCH: grid=ceil_div(m, 128), block=128\nnot cuda at all\n```"


class FixedSampler:
    """Stands in for the policy's sampling only: returns given completions in turn."""

    def __init__(self, texts: list[str]):
        self.texts = texts
        self.config = type("C", (), {"encoding": EncodingConfig(max_nnz=16)})()

    def generate(self, samples, **kw):
        return [self.texts[i % len(self.texts)] for i in range(len(samples))]


@pytest.fixture(scope="module")
def mtx(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("m") / "banded.mtx"
    save_matrix(generate("banded", 5000, seed=0, bands=5), p)
    return p


def test_compile_only_writes_an_unverified_kernel(mtx: Path, tmp_path: Path) -> None:
    dia = variants("spmv", "DIA")[0].render()
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=3, out=str(tmp_path / "g"), compile_only=True),
                          policy=FixedSampler([BROKEN, "Sure! Here it is.\n" + dia]))
    assert rep.verified is False and "NOT verified" in rep.verdict
    assert rep.counts == Counts(n=3, compiled=1, correct=0)
    out = tmp_path / "g"
    from sparserl.harness.extract import extract
    from sparserl.kernels.contract import Op

    assert (out / "kernel.cu").read_text() == extract(dia, Op.SPMV).text  # the clean completion, chatter gone
    info = json.loads((out / "launch.json").read_text())
    assert info["format"] == "DIA" and info["sizes"] == {"num_diags": 5}
    assert info["kernel_args"][0] == "int m" and info["launches_for_this_matrix"][0]["kernel"] == "spmv_kernel"
    assert "NOT verified" in (out / "report.md").read_text()


def test_the_search_after_sampling_reads_a_sample_as_the_template_point_it_is(mtx: Path, tmp_path: Path) -> None:
    """Through the real harness (compile-only): a sample that is a template point's kernel with a comment of the
    policy's own enters the search after sampling as that point (its template and parameters in the trace, so the
    search can move from it) and is judged as written. Mutation killed: the samples drawn before the search entered
    as free text (``enter_prior`` with ``text_proposal``: no template in the trace)."""
    from sparserl.kernels.templates import get_template
    from sparserl.matrices import load_matrix
    from sparserl.matrices.card import matrix_card

    card = matrix_card(load_matrix(mtx))
    rows = get_template("spmv", "dia_rows")
    point = {"block": 128, "rpt": 2}
    head, body = rows.render(point, card).split("\n\n", 1)
    sample = head + "\n\n// two rows a thread\n" + body
    out = tmp_path / "g"
    generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, search=2, out=str(out), compile_only=True,
                                   store=str(tmp_path / "store.sqlite")), policy=FixedSampler([sample]))
    lines = [json.loads(x) for x in (out / "search_trace.jsonl").read_text().splitlines()]
    (drawn,) = [x for x in lines if x["provenance"] == "policy-sample"]
    assert drawn["template"] == "dia_rows" and drawn["params"] == point and drawn["id"].startswith("text/")
    assert "two rows a thread" in drawn["text"] and drawn["verdict"] == "no_gpu"
    assert not (tmp_path / "store.sqlite").exists()  # compile-only writes nothing: no store made for it


def test_nothing_usable_without_the_library_is_a_clear_error(mtx: Path, tmp_path: Path) -> None:
    with pytest.raises(SparseRLError, match="no compiling kernel"):
        generate_kernel(GenerateConfig(matrix=str(mtx), samples=2, out=str(tmp_path / "x"), compile_only=True,
                                       library_fallback=False), policy=FixedSampler([BROKEN]))


def test_cpu_fallback_is_the_selectors_library_kernel_labelled_unverified(mtx: Path, tmp_path: Path) -> None:
    """No sample compiles: the user still gets a kernel, the rule-based selector's library
    choice, compiled, labelled as such, with the command that verifies it on a GPU.

    The expected kernel is worked out here from the matrix itself, not by the selector: the
    banded matrix has 5 diagonals, each full but for its ends, and the rule of thumb for a few
    well-filled diagonals is the library's DIA kernel ``spmv/dia_vec4/-/block=128``. Kills: the
    fallback taking the library's first variant (or any other) instead of the selector's pick,
    and a selector that stops choosing DIA for a banded matrix."""
    from sparserl.harness.extract import extract
    from sparserl.kernels.contract import Op
    from sparserl.matrices import load_matrix

    A = load_matrix(mtx)
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    offsets, counts = np.unique(A.indices - rows, return_counts=True)
    assert offsets.tolist() == [-2, -1, 0, 1, 2] and counts.min() >= A.shape[0] - 2  # 5 well-filled diagonals
    expected = get_variant("spmv/dia_vec4/-/block=128")
    assert expected.id != variants("spmv")[0].id, "the library's first variant is another kernel"

    out = tmp_path / "lib"
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=2, out=str(out), compile_only=True),
                          policy=FixedSampler([BROKEN]))
    assert (out / "kernel.cu").read_text() == extract(expected.render(), Op.SPMV).text
    assert rep.source.startswith("library kernel: the rule-based format selector's choice")
    assert "no sampled kernel compiled" in rep.source and rep.model_used and not rep.verified
    assert rep.best.compiled and rep.best.error_kind is ErrorKind.NO_GPU
    assert rep.counts == Counts(n=2, compiled=0, correct=0)
    verify = f"sparserl check-kernel {out / 'kernel.cu'} {mtx}"
    assert any(verify in n for n in rep.notes)
    md = (out / "report.md").read_text()
    assert "NOT verified" in md and "speedup" not in md and verify in md


def test_no_trained_model_is_a_library_kernel_and_says_how_to_train(mtx: Path, tmp_path: Path) -> None:
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), model=str(tmp_path / "no-model"), samples=3,
                                         out=str(tmp_path / "n"), compile_only=True))
    assert not rep.model_used and rep.counts.n == 0
    assert rep.source.startswith("library kernel") and "no model was used" in rep.source
    assert any("no model was used" in n and "sparserl demo" in n for n in rep.notes)
    assert (tmp_path / "n" / "kernel.cu").read_text().startswith("FORMAT:")
    with pytest.raises(SparseRLError, match="no model at .*--no-library-fallback"):
        generate_kernel(GenerateConfig(matrix=str(mtx), model=str(tmp_path / "no-model"), out=str(tmp_path / "m"),
                                       compile_only=True, library_fallback=False))


@pytest.mark.parametrize("bad, needle", [({"temperature": 0.0}, "temperature must be > 0"),
                                          ({"temperature": -1.0}, "temperature must be > 0"),
                                          ({"k": 8}, "leave --k out"), ({"op": "spmm"}, "--k K")])
def test_bad_values_are_refused(mtx: Path, bad: dict, needle: str) -> None:
    with pytest.raises(SparseRLError, match=needle):
        GenerateConfig(matrix=str(mtx), **bad)


def test_generate_command_on_a_cpu_without_a_model(cli, mtx: Path, tmp_path: Path, monkeypatch) -> None:
    """The README's `sparserl generate A.mtx` on a fresh CPU machine: a note that it falls back
    to compile-only, a note that no model was used, a labelled kernel, exit status 0. A --model given
    that holds no model is an error (it was the library's kernel in silence, with a note to pass --model)."""
    from sparserl.devices import NO_GPU_NOTE, visible_gpus
    from tests.conftest import one_line_error

    if visible_gpus():
        pytest.skip("a GPU is visible: no fallback to see")
    monkeypatch.chdir(tmp_path)  # a fresh folder: no runs/ with a trained policy in it
    res = cli("generate", mtx, "--out", tmp_path / "g")
    assert res.rc == 0, res.err
    assert f"note: {NO_GPU_NOTE}" in res.err and "no model was used" in res.out and "NOT verified" in res.out
    assert (tmp_path / "g" / "kernel.cu").exists()
    one_line_error(cli("generate", mtx, "--temperature", "0"), "temperature must be > 0")
    one_line_error(cli("generate", mtx, "--model", tmp_path / "none"), "--model", "no such folder", "leave --model out")
    (tmp_path / "run" / "checkpoint").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint" / "policy.json").write_text("{}")
    one_line_error(cli("generate", mtx, "--model", tmp_path / "run"), "no model there",
                   f"did you mean {tmp_path / 'run' / 'checkpoint'}?")
    one_line_error(cli("generate", mtx, "--device", "tpu"), "--device must be auto, cpu or cuda[:N]")
    one_line_error(cli("generate", mtx, "--op", "spmm", "--k", str(2**31)), "--k must be at most 2147483647")
    one_line_error(cli("generate", mtx, "--k", "4"), "leave --k out")


def test_needs_a_gpu_unless_compile_only(mtx: Path, tmp_path: Path) -> None:
    from sparserl.devices import visible_gpus

    if visible_gpus():
        pytest.skip("a GPU is visible")
    with pytest.raises(SparseRLError, match="no GPU"):
        generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, out=str(tmp_path / "y")),
                        policy=FixedSampler([BROKEN]))


@pytest.mark.gpu
def test_verified_best_kernel_and_load_kernel(mtx: Path, tmp_path: Path) -> None:
    import cupy as cp
    import torch

    import sparserl
    from sparserl.matrices import load_matrix

    csr = get_variant("spmv/csr_scalar/-/block=128").render()
    dia = variants("spmv", "DIA")[0].render()
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=4, out=str(tmp_path / "g")),
                          policy=FixedSampler([BROKEN, csr, dia]))
    assert rep.verified and rep.counts.correct == 2 and rep.source == "written by the model"
    assert rep.best.format == "DIA", "the faster of the two correct kernels is returned"
    kern = sparserl.load_kernel(tmp_path / "g")
    A = load_matrix(mtx)
    kern.plan(A)
    x = np.random.default_rng(0).standard_normal(A.shape[1]).astype(np.float32)
    ref = A.astype(np.float64) @ x.astype(np.float64)
    np.testing.assert_allclose(cp.asnumpy(kern(cp.asarray(x))), ref, rtol=1e-4, atol=1e-4)
    yt = kern(torch.as_tensor(x, device="cuda"))
    assert isinstance(yt, torch.Tensor) and yt.is_cuda
    np.testing.assert_allclose(yt.cpu().numpy(), ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(SparseRLError, match="shape"):
        kern(cp.zeros(3, dtype=cp.float32))
    shifted = cp.asarray(np.r_[np.float32(0), x])[1:]  # a view 4 bytes off its allocation: copied to an aligned x
    assert shifted.data.ptr % 256 == 4
    np.testing.assert_allclose(cp.asnumpy(kern(shifted)), ref, rtol=1e-4, atol=1e-4)
    # new values on the same structure: planned; another structure: refused, unless asked for
    B = A.copy()
    B.data = np.random.default_rng(1).standard_normal(B.nnz).astype(B.dtype)
    kern.plan(B)
    np.testing.assert_allclose(cp.asnumpy(kern(cp.asarray(x))), B.astype(np.float64) @ x.astype(np.float64),
                               rtol=1e-4, atol=1e-4)
    other = generate("banded", 5000, seed=0, bands=3)
    with pytest.raises(SparseRLError, match="verified on another matrix structure"):
        kern.plan(other)
    kern.plan(other, other_structure=True)


@pytest.mark.gpu
def test_library_fallback_when_no_sample_is_correct(mtx: Path, tmp_path: Path) -> None:
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=2, out=str(tmp_path / "f")),
                          policy=FixedSampler([BROKEN]))
    # verified: timed in full, or stopped early as far slower than cuSPARSE (slow) when nothing is faster
    assert rep.source.startswith("library") and rep.verified and rep.best.ok


@pytest.mark.gpu
def test_no_trained_model_on_a_gpu_returns_the_best_verified_library_kernel(mtx: Path, tmp_path: Path) -> None:
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), model=str(tmp_path / "no-model"), out=str(tmp_path / "n")))
    assert rep.verified and not rep.model_used and rep.best.ok
    assert rep.source == "library kernel: the fastest verified library variant (no model was used)"
    # the second look (--retime 3 by default): the kernel handed back is the lowest median of fresh evaluations
    # among the fastest, and the verdict's speedup is that median's
    look = rep.second_look
    assert look is not None and look.passes == 3 and len(look.times_us) == 3 and all(t > 0 for t in look.times_us)
    assert look.median_us == sorted(look.times_us)[1] and look.first_us == rep.best.timings["cold"].median_us
    assert look.speedup == pytest.approx(rep.best.baseline["cold"].median_us / look.median_us)
    assert (f"{look.speedup:.2f}x" in rep.verdict) and look.line() in (tmp_path / "n" / "report.md").read_text()
    firsts = [r.speedup for r in rep.runners_up if r.speedup is not None]
    if look.changed:  # another kernel was the fastest by the first timings
        assert firsts and max(firsts) >= rep.best.speedup, (look, rep.runners_up)
    else:
        assert all(s <= rep.best.speedup for s in firsts), (look, rep.runners_up)
    again = generate_kernel(GenerateConfig(matrix=str(mtx), model=str(tmp_path / "no-model"), out=str(tmp_path / "r0"),
                                           retime=0))
    assert again.second_look is None and "second look" not in (tmp_path / "r0" / "report.md").read_text()


def test_fill_facts_hands_back_the_sample_with_the_cards_facts_and_says_so(tmp_path: Path) -> None:
    """A sample that is ``csr_adaptive_spec`` for another skewed draw's long rows, asked for this one (as many long
    rows, other ones): with ``--fill-facts`` the kernel handed back is the template at the sample's numbers for this
    card, labelled as the model's with the card's facts, and a note counts the samples so written; without it, the
    sample as written. Mutations killed: the flag not reaching the proposer, every sample labelled filled (the
    broken one is not), the label or the note left out."""
    from sparserl.harness.extract import extract
    from sparserl.kernels.contract import Op
    from sparserl.kernels.templates import get_template
    from sparserl.matrices.card import matrix_card

    skewed = [generate("skewed", 6000, seed=s, long_len=2000, long_fraction=0.002) for s in (1, 2)]
    mtx = tmp_path / "skewed.mtx"
    save_matrix(skewed[0], mtx)
    spec = get_template("spmv", "csr_adaptive_spec")  # it spells its facts: the long rows in a constant table
    point = {"rpw": 32, "items": 8, "long_len": 256, "seg": 4096, "block": 128}
    sample = spec.render(point, matrix_card(skewed[1]))
    for flag in (True, False):
        out = tmp_path / str(flag)
        rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=2, out=str(out), compile_only=True,
                                             fill_facts=flag), policy=FixedSampler([BROKEN, sample]))
        want = spec.render(point, matrix_card(skewed[0])) if flag else sample
        assert (out / "kernel.cu").read_text() == extract(want, Op.SPMV).text and (want != sample) is flag
        assert rep.source == ("written by the model, its block of facts from the matrix card (--fill-facts)"
                              if flag else "written by the model")
        assert any("1 of 2 samples had their block of specialised facts" in n for n in rep.notes) is flag


def test_the_commands_fill_facts_unless_told_not_to(cli, mtx: Path, monkeypatch) -> None:
    """``generate`` and ``search`` write the card's facts by default and not with ``--no-fill-facts``. Kills the
    default left off in either command, and the negative flag dropped."""
    from sparserl.cli import generate as gen_cli
    from sparserl.cli import search as search_cli
    from sparserl.errors import SparseRLError

    seen = []

    def record(cfg, *args, **kw):
        seen.append(cfg.fill_facts)
        raise SparseRLError("recorded")

    monkeypatch.setattr(gen_cli, "generate_kernel", record)
    monkeypatch.setattr(search_cli, "search_matrix", record)
    for command in ("generate", "search"):
        assert cli(command, mtx).rc != 0 and cli(command, mtx, "--no-fill-facts").rc != 0
    assert seen == [True, False, True, False]


def test_a_kernel_naming_its_matrixs_facts_is_saved_with_their_definitions(mtx: Path, tmp_path: Path) -> None:
    """A sample that names ``MATRIX_DIA_RUNS`` is judged with the definition the harness writes, and the kernel.cu
    handed back holds it (a saved kernel stands alone). Kills the saved text left without the definition."""
    from sparserl.matrices.card import matrix_card
    from sparserl.matrices.io import load_matrix
    from tests.harness.test_matrix_facts import named_dia

    card = matrix_card(load_matrix(mtx))
    rep = generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, out=str(tmp_path / "g"), compile_only=True),
                          policy=FixedSampler([named_dia(card)]))
    saved = (tmp_path / "g" / "kernel.cu").read_text()
    assert rep.source == "written by the model" and rep.best.compiled
    assert "__device__ constexpr int MATRIX_DIA_RUNS[] = {-2, 2};" in saved, saved[:400]


def test_a_folder_names_its_matrix_and_text_and_the_loader_checks_both(mtx: Path, tmp_path: Path, caplog) -> None:
    """launch.json and report.json name the structure the kernel was verified on and launch.json the text's hash;
    the loader's checks (CPU parts): another structure is refused, new values on this one are not; an edited
    kernel, a compile-only folder and another GPU architecture are each a warning. Kills: the fingerprint or the
    hash left out of launch.json, the structure check left out or comparing values too, an edited kernel loaded
    without being asked to (a write interrupted between the folder's files leaves one), the warnings' tests."""
    import hashlib
    import logging

    from sparserl.loader import _provenance_warnings, check_structure, check_text
    from sparserl.matrices import load_matrix
    from sparserl.matrices.card import structure_fingerprint

    dia = variants("spmv", "DIA")[0].render()
    generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, out=str(tmp_path / "g"), compile_only=True),
                    policy=FixedSampler([dia]))
    out = tmp_path / "g"
    info = json.loads((out / "launch.json").read_text())
    A = load_matrix(mtx)
    assert info["fingerprint"] == structure_fingerprint(A) == json.loads((out / "report.json").read_text())["fingerprint"]
    text = (out / "kernel.cu").read_text()
    assert info["kernel_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    B = A.copy()
    B.data = B.data * 2
    check_structure(info, B)  # the same structure, new values
    with pytest.raises(SparseRLError, match=r"verified on another matrix structure \(5000 x 5000"):
        check_structure(info, generate("banded", 5000, seed=0, bands=3))
    with caplog.at_level(logging.WARNING, logger="sparserl.loader"):
        check_structure(info, generate("banded", 5000, seed=0, bands=3), other_structure=True)
        check_structure({}, A)
    assert "unverified" in caplog.text and "does not name the matrix" in caplog.text
    warned = _provenance_warnings(out, "sm_90")
    assert len(warned) == 1 and "never run on a GPU" in warned[0]
    check_text(out, info, text)
    with pytest.raises(SparseRLError, match="not the kernel its launch.json was written for"):
        check_text(out, info, text + "\n// mine")
    with caplog.at_level(logging.WARNING, logger="sparserl.loader"):
        check_text(out, info, text + "\n// mine", edited=True)
    assert "loaded as asked, unverified" in caplog.text
    report = json.loads((out / "report.json").read_text())
    report["verified"], report["best"]["arch"] = True, "sm_90"
    (out / "report.json").write_text(json.dumps(report))
    assert _provenance_warnings(out, "sm_90") == []
    assert "verified and timed on sm_90, and this GPU is sm_80" in _provenance_warnings(out, "sm_80")[0]


def test_an_interrupted_write_leaves_the_folder_as_it_was(mtx: Path, tmp_path: Path, monkeypatch) -> None:
    """The report's files are made first and each put in place whole: an interrupt while launch.json is made
    (the host conversion) leaves the earlier kernel and its launch.json together, and no partial file. Kills:
    kernel.cu written before launch.json is made (another matrix's kernel beside the earlier launch.json)."""
    import sparserl.request.report as report

    csr = get_variant("spmv/csr_scalar/-/block=128").render()
    out = tmp_path / "g"
    generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, out=str(out), compile_only=True),
                    policy=FixedSampler([csr]))
    before = {f.name: f.read_text() for f in out.iterdir()}

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "launch_info", interrupted)
    with pytest.raises(KeyboardInterrupt):
        generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, out=str(out), compile_only=True),
                        policy=FixedSampler([variants("spmv", "DIA")[0].render()]))
    assert {f.name: f.read_text() for f in out.iterdir()} == before
    # interrupted between two renames: the new launch.json beside the earlier kernel.cu, which the loader refuses
    monkeypatch.undo()
    import os

    from sparserl.loader import check_text

    real, calls = os.replace, []

    def replace_once(a, b):
        calls.append(b)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real(a, b)

    monkeypatch.setattr(report.os, "replace", replace_once)
    with pytest.raises(KeyboardInterrupt):
        generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, out=str(out), compile_only=True),
                        policy=FixedSampler([variants("spmv", "DIA")[0].render()]))
    assert (out / "kernel.cu").read_text() == before["kernel.cu"] and not list(out.glob(".*.tmp"))
    with pytest.raises(SparseRLError, match="not the kernel its launch.json was written for"):
        check_text(out, json.loads((out / "launch.json").read_text()), (out / "kernel.cu").read_text())


def test_an_output_folder_that_cannot_be_written_fails_before_the_work(mtx: Path, tmp_path: Path) -> None:
    """--out naming a file fails at once, before a sample is drawn. Kills: the folder first made at the end."""
    (tmp_path / "file").write_text("")

    class Never(FixedSampler):
        def generate(self, samples, **kw):
            raise AssertionError("sampled before the output folder was checked")

    for out in (tmp_path / "file", tmp_path / "file" / "sub"):  # a file, or a folder under one: said in words
        with pytest.raises(SparseRLError, match=f"--out {out}: {tmp_path / 'file'} is a file, not a folder"):
            generate_kernel(GenerateConfig(matrix=str(mtx), samples=1, out=str(out), compile_only=True),
                            policy=Never([]))


def test_replacing_another_matrix_s_kernel_says_so(tmp_path: Path, caplog) -> None:
    """Two matrices whose files share a name share the default folder: the second run's report replaces the
    first's, with a warning naming both structures; a run again on the same matrix says nothing. Kills: the
    warning left out, or given for the same matrix."""
    import logging

    for sub, bands in (("a", 5), ("b", 3)):
        (tmp_path / sub).mkdir()
        save_matrix(generate("banded", 3000, seed=0, bands=bands), tmp_path / sub / "A.mtx")
    csr = get_variant("spmv/csr_scalar/-/block=128").render()
    cfg = lambda sub: GenerateConfig(matrix=str(tmp_path / sub / "A.mtx"), samples=1,  # noqa: E731
                                     out=str(tmp_path / "out"), compile_only=True)
    with caplog.at_level(logging.WARNING, logger="sparserl.request.report"):
        generate_kernel(cfg("a"), policy=FixedSampler([csr]))
        generate_kernel(cfg("a"), policy=FixedSampler([csr]))
        assert "held the kernel of another matrix" not in caplog.text
        generate_kernel(cfg("b"), policy=FixedSampler([csr]))
    assert "held the kernel of another matrix" in caplog.text
