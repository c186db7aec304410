"""The refinement prompt (a pure function) and the policy proposer's use of it."""

from __future__ import annotations

import pytest

from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.kernels.contract import Op
from sparserl.kernels.library import variants
from sparserl.matrices import generate
from sparserl.matrices.card import matrix_card
from sparserl.search.policy import describe_outcome, refinement_prompt
from tests.search.doubles import timed_result

KERNEL = variants("spmv", "CSR")[0].render()


def test_prompt_shows_the_kernel_its_time_and_asks_for_a_faster_one() -> None:
    card = matrix_card(generate("banded", 500, seed=0, bands=3)).render()
    res = timed_result("spmv", None, "m", 25.0, cusparse_us=50.0)
    p = refinement_prompt(Op.SPMV, None, (500, 500), 1498, card, KERNEL, res)
    assert p.startswith("SpMV y = A x for the 500 x 500 sparse matrix above (1498 nonzeros).\nMatrix card:\n" + card)
    assert "Previous kernel:\n" + KERNEL.strip() + "\nMeasured: correct; 25.00 us against cuSPARSE's 50.00 us " \
        "(2.00x), cold L2, 0.50 of the memory roofline.\nWrite a faster correct kernel:\n" in p
    assert p.endswith("Write a faster correct kernel:\n")
    assert p == refinement_prompt(Op.SPMV, None, (500, 500), 1498, card, KERNEL, res), "pure"


def test_prompt_for_a_failed_kernel_names_the_error_and_asks_for_a_correct_one() -> None:
    bad = EvalResult.failure("spmm", 8, "m", ErrorKind.COMPILE, "error: identifier \"foo\"\n  is undefined")
    p = refinement_prompt(Op.SPMM, 8, (10, 20), 30, None, KERNEL, bad)
    assert p.startswith("SpMM Y = A X with k = 8 for the 10 x 20 sparse matrix above (30 nonzeros).\nPrevious kernel:")
    assert "Matrix card" not in p
    assert "Measured: compile_error: error: identifier \"foo\" is undefined.\nWrite a correct kernel:\n" in p
    assert describe_outcome(EvalResult.failure("spmv", None, "m", ErrorKind.NO_GPU, "x", compiled=True)) == \
        "compiled; not run (no GPU), so its speed is unknown."


def test_the_policy_sees_the_prompt_a_sample_carries() -> None:
    pytest.importorskip("torch")
    from sparserl.encoding import EncodingConfig, MatrixInput
    from sparserl.model.policy import Sample, prompt_text

    A = generate("banded", 100, seed=0, bands=3)
    s = Sample(MatrixInput.from_matrix(A, EncodingConfig(max_nnz=8)), Op.SPMV, None, int(A.nnz))
    assert prompt_text(s, True).startswith("SpMV y = A x for the 100 x 100")
    from dataclasses import replace

    assert prompt_text(replace(s, prompt="REFINE THIS\n"), True) == "REFINE THIS\n"
    assert prompt_text(replace(s, prompt="REFINE THIS\n"), False) == "REFINE THIS\n"


def _recording_policy():
    """Stands in for Policy.generate only: records the samples and keywords it is given."""
    from sparserl.encoding import EncodingConfig
    from sparserl.model.policy import PolicyConfig

    class RecordingPolicy:
        config = PolicyConfig(encoding=EncodingConfig(max_nnz=8))
        device = "cpu"

        def __init__(self):
            self.calls = []

        def generate(self, samples, **kw):
            self.calls.append((samples, kw))
            return [f"text {i}" for i in range(len(samples))]

    return RecordingPolicy()


def test_policy_proposer_refines_through_the_policys_sampling_path() -> None:
    pytest.importorskip("torch")
    from sparserl.request.context import MatrixContext
    from sparserl.search.policy import PolicyProposer

    A = generate("banded", 100, seed=0, bands=3)
    pol = _recording_policy()
    leases = []

    def lease(device):
        import contextlib

        leases.append(device)
        return contextlib.nullcontext()

    ctx = MatrixContext(A, "m", Op.SPMV)
    pp = PolicyProposer(pol, ctx, name="m", temperature=0.7, max_new_tokens=99, seed=5, lease=lease)
    assert pp.sample(20) == [f"text {i}" for i in range(16)] + [f"text {i}" for i in range(4)]
    assert [len(c[0]) for c in pol.calls] == [16, 4] and pol.calls[0][0][0].prompt is None
    assert pol.calls[0][0][0].card == ctx.prompt_card, "the samples carry the request's card"
    res = timed_result("spmv", None, "m", 25.0)
    pp.refine(KERNEL, res, 2)
    samples, kw = pol.calls[-1]
    assert samples[0].prompt == refinement_prompt(Op.SPMV, None, (100, 100), int(A.nnz), ctx.prompt_card, KERNEL, res)
    assert kw["temperature"] == 0.7 and kw["max_new_tokens"] == 99
    assert leases == ["cpu", "cpu"], "the GPU is held against the harness's timing while the model writes"


def test_a_policy_without_the_card_is_refined_without_it_and_long_kernels_are_cut() -> None:
    """The refinement prompt RL's turns and SFT's refinement rows show: the card only when the
    policy's prompt carries one, and the previous kernel cut at MAX_PREVIOUS_CHARS.
    Mutations killed: the request's card always shown, the previous kernel never cut."""
    pytest.importorskip("torch")
    from sparserl.encoding import EncodingConfig
    from sparserl.model.policy import PolicyConfig
    from sparserl.request.context import MatrixContext
    from sparserl.search.policy import MAX_PREVIOUS_CHARS, PolicyProposer

    class NoCardPolicyDouble:
        config = PolicyConfig(encoding=EncodingConfig(max_nnz=8), card=False)
        device = "cpu"
        seen: list = []

        def generate(self, samples, **kw):
            self.seen += samples
            return ["t"] * len(samples)

    A = generate("banded", 100, seed=0, bands=3)
    pol = NoCardPolicyDouble()
    ctx = MatrixContext(A, "m", Op.SPMV)
    pp = PolicyProposer(pol, ctx, name="m", temperature=0.7, max_new_tokens=9, seed=5)
    long = "FORMAT: CSR\n" + "x" * (2 * MAX_PREVIOUS_CHARS)
    res = timed_result("spmv", None, "m", 25.0)
    pp.refine(long, res, 1)
    prompt = pol.seen[-1].prompt
    assert prompt == refinement_prompt(Op.SPMV, None, (100, 100), int(A.nnz), None, long[:MAX_PREVIOUS_CHARS], res)
    assert "Matrix card" not in prompt and long[:MAX_PREVIOUS_CHARS + 1] not in prompt


def test_the_header_grammar_reaches_the_policy_from_generate_and_search() -> None:
    """``GenerateConfig.header_grammar`` goes into its search job, and a job's proposer asks the
    policy's ``generate`` for it by name; without it nothing is asked (a stand-in policy whose
    ``generate`` does not know the keyword keeps working). Mutations killed: the flag dropped
    between the config and the job, or between the job and the proposer."""
    pytest.importorskip("torch")
    from sparserl.generate import GenerateConfig
    from sparserl.request.context import MatrixContext
    from sparserl.search.run import open_proposer

    class Ev:
        gpu_lease = None

    ctx = MatrixContext(generate("banded", 100, seed=0, bands=3), "m", Op.SPMV)
    for flag in (True, False):
        job = GenerateConfig(matrix="m.mtx", header_grammar=flag).search_job("model")
        assert job.header_grammar is flag
        pol = _recording_policy()
        open_proposer(job, ctx, Ev(), pol).sample(2)
        kw = pol.calls[-1][1]
        assert kw.get("header_grammar", False) is flag and ("header_grammar" in kw) is flag


def test_fill_facts_writes_the_cards_facts_into_proposals_and_says_which() -> None:
    """With ``fill_facts``, a proposal that is ``csr_adaptive_spec`` for another skewed draw's long rows comes back with
    this matrix's (the template at the proposal's own numbers for this card), and ``last_filled`` marks it; a proposal
    with this card's facts already and one that is no template's are returned as written, and so is everything
    without ``fill_facts``. Refinements are filled too. Mutations killed: the flag ignored (always or never
    filling), ``last_filled`` marking every text or the wrong one, the flag dropped between the job and the
    proposer, the fill counted on the unfilled texts."""
    pytest.importorskip("torch")
    from sparserl.kernels.templates import get_template
    from sparserl.request.context import MatrixContext
    from sparserl.search.loop import FILLED_NOTE, _fill_notes
    from sparserl.search.run import SearchJob, open_proposer

    spec = get_template("spmv", "csr_adaptive_spec")  # it spells its facts: the long rows in a constant table
    ctx = MatrixContext(generate("skewed", 6000, seed=1, long_len=2000, long_fraction=0.002), "m", Op.SPMV)
    other = matrix_card(generate("skewed", 6000, seed=2, long_len=2000, long_fraction=0.002))
    point = {"rpw": 32, "items": 8, "long_len": 256, "seg": 4096, "block": 128}
    wrong, right = (spec.render(point, c) for c in (other, ctx.card))
    assert wrong != right

    class Ev:
        gpu_lease = None

    class FixedPolicy:
        config = _recording_policy().config
        device = "cpu"

        def generate(self, samples, **kw):
            return [(wrong, right, "text")[i % 3] for i in range(len(samples))]

    for flag in (True, False):
        pp = open_proposer(SearchJob(matrix="m.mtx", fill_facts=flag), ctx, Ev(), FixedPolicy())
        got = pp.sample(3)
        if flag:
            assert got == [right, right, "text"] and pp.last_filled == (True, False, False) and pp.filled == 1
            assert _fill_notes(pp, 3) == [FILLED_NOTE, "", ""], "the search's trace says which were filled"
            assert pp.refine(KERNEL, timed_result("spmv", None, "m", 25.0), 1) == [right]
            assert pp.last_filled == (True,) and pp.filled == 2
        else:
            assert got == [wrong, right, "text"] and pp.last_filled == (False, False, False) and pp.filled == 0
