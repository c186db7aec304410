"""Policy proposals for a search: sampling, and refining the best kernel so far.

Sampling is the policy's ordinary prompt (matrix soft tokens + the task line). Refining shows
the policy a previous kernel with what the harness measured (time against cuSPARSE, or the
error) and asks for a faster correct one, as multi-turn kernel-writing systems do (Kevin-32B:
each turn sees the previous kernel's compile error or time). :func:`refinement_prompt` builds
that prompt and is a pure function of its inputs; :class:`PolicyProposer` runs the policy
(``sparserl.model.policy.Policy.generate``, the sampling path ``generate`` uses) with it.

The shipped policies were not trained on refinement prompts; until the self-improvement work
teaches them, their refinements are samples conditioned on a longer prompt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Protocol

from sparserl.harness.result import ErrorKind, EvalResult
from sparserl.kernels.contract import Op

log = logging.getLogger(__name__)


def task_line(op: Op, k: int | None, shape: tuple[int, int], nnz: int) -> str:
    what = "SpMV y = A x" if op is Op.SPMV else f"SpMM Y = A X with k = {k}"
    return f"{what} for the {shape[0]} x {shape[1]} sparse matrix above ({nnz} nonzeros)."


def describe_outcome(result: EvalResult) -> str:
    """One line on what the harness measured for a kernel (its time, or why it failed)."""
    if result.ok:
        t = result.timings.get(result.regime)
        base = result.baseline.get(result.regime)
        if t is None or base is None:
            return "correct (no time recorded)."
        line = (f"correct; {t.median_us:.2f} us against cuSPARSE's {base.median_us:.2f} us "
                f"({base.median_us / t.median_us:.2f}x), {result.regime} L2")
        if result.roofline is not None:
            line += f", {result.roofline:.2f} of the memory roofline"
        return line + "."
    if result.error_kind is ErrorKind.NO_GPU:
        return "compiled; not run (no GPU), so its speed is unknown."
    msg = " ".join(result.message.split())[:300]
    return f"{result.error_kind.value}" + (f": {msg}" if msg else "") + "."


def refinement_prompt(op: Op, k: int | None, shape: tuple[int, int], nnz: int, card: str | None,
                      previous: str, result: EvalResult) -> str:
    """The text prompt that shows a previous kernel and its measured outcome and asks for a faster one.

    Pure: the same inputs give the same text. ``card``: the matrix card's text
    (:meth:`MatrixCard.render`), or None to leave it out."""
    faster = "a faster correct kernel" if result.ok else "a correct kernel"
    lines = [task_line(op, k, shape, nnz)]
    if card:
        lines += ["Matrix card:", card.strip()]
    lines += ["Previous kernel:", previous.strip(), "Measured: " + describe_outcome(result),
              f"Write {faster}:"]
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
    ``generate(samples, max_new_tokens=, temperature=, seed=)`` and ``config.encoding``)."""

    BATCH = 16
    """Completions generated together (as ``generate`` does)."""

    def __init__(self, policy, A, op: Op, k: int | None, card_text: str | None, name: str,
                 temperature: float = 1.0, max_new_tokens: int = 1536, seed: int = 0, lease=None):
        """``card_text``: the matrix card's prompt text (:meth:`MatrixCard.prompt`, the text every
        prompt carries), shown in refinements, and in samples when the policy's prompt has a card.
        ``lease``: a context manager factory taking the model's device (``Evaluator.gpu_lease``),
        held while the model generates so the harness does not time kernels meanwhile."""
        from sparserl.model.policy import make_sample

        self.policy, self.op, self.k, self.card_text, self.name = policy, op, k, card_text, name
        self.shape, self.nnz = (int(A.shape[0]), int(A.shape[1])), int(A.nnz)
        self.temperature, self.max_new_tokens, self.seed = temperature, max_new_tokens, seed
        self.lease = lease
        self.base = make_sample(A, policy.config, op, k, card=card_text)
        if self.card_text is None:
            self.card_text = self.base.card  # the card the samples carry, shown in refinements too
        self.calls = 0

    def _generate(self, samples: list) -> list[str]:
        device = getattr(self.policy, "device", "cpu")
        held = self.lease(device) if self.lease is not None else contextlib.nullcontext()
        out: list[str] = []
        with held:
            for i in range(0, len(samples), self.BATCH):
                out += self.policy.generate(samples[i:i + self.BATCH], max_new_tokens=self.max_new_tokens,
                                            temperature=self.temperature, seed=self.seed + 7919 * self.calls + i)
        self.calls += 1
        return out

    def sample(self, n: int) -> list[str]:
        return self._generate([self.base] * n)

    def refine(self, previous: str, result: EvalResult, n: int) -> list[str]:
        prompt = refinement_prompt(self.op, self.k, self.shape, self.nnz, self.card_text, previous, result)
        return self._generate([dataclasses.replace(self.base, prompt=prompt)] * n)
