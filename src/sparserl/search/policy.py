"""The policy's proposals for a kernel request: samples (``generate``'s, and a search's), and
refinements of the best kernel so far (a search's).

Sampling is the policy's ordinary prompt (matrix soft tokens + the task line). Refining shows
the policy a previous kernel with what the harness measured (time against cuSPARSE, or the
error) and asks for a faster correct one, as multi-turn kernel-writing systems do (Kevin-32B:
each turn sees the previous kernel's compile error or time). :func:`refinement_prompt` builds
that prompt and is a pure function of its inputs; :class:`PolicyProposer` runs the policy
(``sparserl.model.policy.Policy.generate``) on the request's matrix with either prompt.

A policy trained only on the data build's pairs has never seen a refinement prompt: its
refinements are samples conditioned on a longer prompt until ``sparserl improve`` teaches it from
the kernels its refinements found.

With ``fill_facts``, a proposal that is a specialised template's kernel right in all but its block of
facts (the row lengths and long rows of ``csr_adaptive_spec``, the template that spells them) gets the
matrix card's facts in that block (:func:`sparserl.eval.library_match.fill_facts`); the harness judges it
like any other. It is for ``generate`` and the search's proposals, never for what a policy is scored or
trained on as its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Protocol

from sparserl.eval.library_match import fill_facts
from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.kernels.contract import Op
from sparserl.progress import progress
from sparserl.request.context import MatrixContext

log = logging.getLogger(__name__)


MAX_PREVIOUS_CHARS = 6000
"""The longest previous kernel shown in a refinement prompt (longer text is cut: a garbled
completion of the whole token budget would otherwise double the next prompt)."""


def task_line(op: Op, k: int | None, shape: tuple[int, int], nnz: int) -> str:
    what = "SpMV y = A x" if op is Op.SPMV else f"SpMM Y = A X with k = {k}"
    return f"{what} for the {shape[0]} x {shape[1]} sparse matrix above ({nnz} nonzeros)."


def describe_timing(kernel_us: float, cusparse_us: float, regime: str, roofline: float | None = None) -> str:
    """The outcome line of a correct kernel timed at ``kernel_us`` beside cuSPARSE's ``cusparse_us``."""
    line = (f"correct; {kernel_us:.2f} us against cuSPARSE's {cusparse_us:.2f} us "
            f"({cusparse_us / kernel_us:.2f}x), {regime} L2")
    if roofline is not None:
        line += f", {roofline:.2f} of the memory roofline"
    return line + "."


def describe_outcome(result: EvalResult) -> str:
    """One line on what the harness measured for a kernel (its time, or why it failed)."""
    if result.ok:
        t = result.timings.get(result.regime)
        base = result.baseline.get(result.regime)
        if t is None or base is None:
            return "correct (no time recorded)."
        return describe_timing(t.median_us, base.median_us, result.regime, result.roofline)
    if result.error_kind is ErrorKind.NO_GPU:
        return "compiled; not run (no GPU), so its speed is unknown."
    msg = " ".join(result.message.split())[:300]
    return f"{result.error_kind.value}" + (f": {msg}" if msg else "") + "."


def refinement_prompt(op: Op, k: int | None, shape: tuple[int, int], nnz: int, card: str | None,
                      previous: str, result: EvalResult) -> str:
    """The text prompt that shows a previous kernel and its measured outcome and asks for a faster one.

    Pure: the same inputs give the same text. ``card``: the matrix card's text
    (:meth:`MatrixCard.render`), or None to leave it out."""
    return refinement_text(op, k, shape, nnz, card, previous, describe_outcome(result), result.ok)


def refinement_text(op: Op, k: int | None, shape: tuple[int, int], nnz: int, card: str | None, previous: str,
                    outcome: str, correct: bool) -> str:
    """:func:`refinement_prompt` from the outcome's line (:func:`describe_outcome`,
    :func:`describe_timing`) and whether the previous kernel was correct. Pure."""
    faster = "a faster correct kernel" if correct else "a correct kernel"
    lines = [task_line(op, k, shape, nnz)]
    if card:
        lines += ["Matrix card:", card.strip()]
    lines += ["Previous kernel:", previous.strip(), "Measured: " + outcome, f"Write {faster}:"]
    return "\n".join(lines) + "\n"


class Proposer(Protocol):
    """What a search asks of a policy."""

    name: str
    """The model's name (recorded as provenance)."""

    def sample(self, n: int) -> list[str]:
        """``n`` completions for the matrix from the ordinary prompt."""

    def refine(self, previous: str, result: EvalResult, n: int) -> list[str]:
        """``n`` completions shown ``previous`` and its ``result``."""


class PolicyProposer:
    """A :class:`Proposer` over a :class:`sparserl.model.policy.Policy` (or anything with its
    ``generate(samples, max_new_tokens=, temperature=, seed=)`` and ``config.encoding``), for one
    request's matrix."""

    BATCH = 16
    """Completions generated together."""

    def __init__(self, policy, ctx: MatrixContext, name: str, temperature: float = 1.0, max_new_tokens: int | None = None,
                 seed: int = 0, lease=None, header_grammar: bool = False, fill_facts: bool = False):
        """``ctx``: the request's matrix; its card (:attr:`MatrixContext.prompt_card`) is shown in
        samples and refinements when the policy's prompt has a card.
        ``header_grammar``: sample each header within the contract's grammar (the policy's
        ``generate`` is then asked for it by name).
        ``lease``: a context manager factory taking the model's device (``Evaluator.gpu_lease``),
        held while the model generates so the harness does not time kernels meanwhile.
        ``fill_facts``: write the card's facts into proposals that need only that (see the module);
        :attr:`last_filled` says which of the last call's were so written, :attr:`filled` counts them all."""
        self.policy, self.ctx, self.name = policy, ctx, name
        self.temperature, self.max_new_tokens, self.seed = temperature, max_new_tokens, seed
        self.lease = lease
        self.grammar = {"header_grammar": True} if header_grammar else {}
        self.base = ctx.sample(policy.config)
        self.calls = 0
        self.fill = fill_facts
        self.filled = 0
        """Proposals whose block of facts was written from the card (``fill_facts``), over every call."""
        self.last_filled: tuple[bool, ...] = ()
        """For each text the last call returned, whether its block of facts was written from the card."""

    def _filled(self, texts: list[str]) -> list[str]:
        """``texts`` with the card's facts written in where that is all a text needs (``fill_facts``)."""
        got = [fill_facts(t, self.ctx.op, self.ctx.card) if self.fill else None for t in texts]
        self.last_filled = tuple(f is not None for f in got)
        n = sum(self.last_filled)
        self.filled += n
        if n:
            log.info("%d of %d proposals had their block of facts written from the card", n, len(texts))
        return [t if f is None else f for t, f in zip(texts, got)]

    def _generate(self, samples: list, show: bool = False) -> list[str]:
        device = getattr(self.policy, "device", "cpu")
        held = self.lease(device) if self.lease is not None else contextlib.nullcontext()
        out: list[str] = []
        with held, progress(show) as bar:
            task = bar.add_task("sampling kernels", total=len(samples))
            for i in range(0, len(samples), self.BATCH):
                out += self.policy.generate(samples[i:i + self.BATCH], max_new_tokens=self.max_new_tokens,
                                            temperature=self.temperature, seed=self.seed + 7919 * self.calls + i,
                                            **self.grammar)
                bar.update(task, advance=len(samples[i:i + self.BATCH]))
        self.calls += 1
        return self._filled(out)

    def sample(self, n: int, show: bool = False) -> list[str]:
        """``n`` completions from the ordinary prompt; ``show``: with a progress display (not inside
        a search, which shows its own)."""
        return self._generate([self.base] * n, show)

    def refine(self, previous: str, result: EvalResult, n: int) -> list[str]:
        """``n`` completions shown ``previous`` (cut at :data:`MAX_PREVIOUS_CHARS`) and its outcome,
        with the card when the policy's prompt carries one: the prompt RL's refinement turns and SFT's
        refinement rows show."""
        ctx = self.ctx
        prompt = refinement_prompt(ctx.op, ctx.k, ctx.shape, ctx.nnz, self.base.card, previous[:MAX_PREVIOUS_CHARS],
                                   result)
        return self._generate([dataclasses.replace(self.base, prompt=prompt)] * n)
