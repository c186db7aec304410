"""How many new tokens a completion may take: never fewer than the longest kernel the policy knows needs.

A policy that imitates the kernel library must be able to finish every library kernel, in its own
tokens (the digit-splitting tokenizer of a small model and a user's Qwen3 tokenizer count the same
text differently); a policy fine-tuned on longer kernels (specialised ones: ``csr_adaptive_spec`` is
3.8k-4.5k of the base model's tokens at 100k rows, against the library's longest 2.9k) must be able to
finish those too: ``taught`` is the longest completion it was fine-tuned on (``Policy.taught_tokens``).
:func:`completion_budget` turns a stage's ``max_new_tokens`` (``None``: as many as the longer of the
two needs, plus :data:`MARGIN`, rounded up to a multiple of :data:`ROUND`) into the number the
decoder gets; a smaller number given on purpose is kept, with a warning naming what it cuts short.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

MARGIN = 64
"""Tokens beyond the longest library kernel (room for an end token and a sample's own variations)."""
ROUND = 128
"""The automatic budget is a multiple of this."""


def library_token_lengths(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """Every library variant's rendering (both ops; SpMM at k = 32), in ``tokenizer``'s tokens, by id."""
    from sparserl.kernels.contract import Op
    from sparserl.kernels.library import variants

    out: dict[str, int] = {}
    for op, k in ((Op.SPMV, None), (Op.SPMM, 32)):
        for v in variants(op, None, k):
            out[v.id] = len(tokenizer(v.render(), add_special_tokens=False)["input_ids"])
    return out


def completion_budget(tokenizer: PreTrainedTokenizerBase, requested: int | None,
                      lengths: dict[str, int] | None = None, taught: int = 0, warn: bool = True) -> int:
    """The decoder's ``max_new_tokens`` for a stage that asked for ``requested`` (see the module
    docstring). ``lengths``: :func:`library_token_lengths` when already computed; ``taught``: the longest
    completion the policy was fine-tuned on, in its tokens (0: none known); ``warn``: name what a smaller
    budget cuts short (a caller that asks again with the same number says it once)."""
    lengths = lengths if lengths is not None else library_token_lengths(tokenizer)
    longest = max(max(lengths.values()), taught)
    if requested is None:
        return -(-(longest + 1 + MARGIN) // ROUND) * ROUND
    if requested <= longest and warn:
        cut = sorted((n, i) for i, n in lengths.items() if n >= requested)
        what = [f"{len(cut)} library kernel(s) (the longest, {cut[-1][1]}, is {cut[-1][0]} tokens)"] if cut else []
        what += [f"the longest kernel it was fine-tuned on ({taught} tokens)"] if taught >= requested else []
        log.warning("max_new_tokens %d cuts %s short: a sample cannot finish them", requested, " and ".join(what))
    return requested


def longest_completion(tokenizer: PreTrainedTokenizerBase, texts, limit: int | None = None) -> tuple[int, int]:
    """(the longest of ``texts``, completions a policy is fine-tuned on, in ``tokenizer``'s tokens, and how
    many distinct texts are longer than ``limit``, which the longest leaves out): each distinct text counted
    once; 0 when there is none. ``limit`` is the model's positions: a completion past them can never be
    sampled whole, and a budget that long would only make runaway samples cost more."""
    lengths = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in set(texts)]
    kept = [n for n in lengths if limit is None or n <= limit]
    return max(kept, default=0), len(lengths) - len(kept)
