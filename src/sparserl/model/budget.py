"""How many new tokens a completion may take: never fewer than the longest library kernel needs.

A policy that imitates the kernel library must be able to finish every library kernel, in its own
tokens (the digit-splitting tokenizer of a small model and a user's Qwen3 tokenizer count the same
text differently). :func:`completion_budget` turns a stage's ``max_new_tokens`` (``None``: as many
as the longest library kernel of either op needs, plus :data:`MARGIN`, rounded up to a multiple of
:data:`ROUND`) into the number the decoder gets; a smaller number given on purpose is kept, with a
warning naming the library kernels it cuts short.
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
                      lengths: dict[str, int] | None = None) -> int:
    """The decoder's ``max_new_tokens`` for a stage that asked for ``requested`` (see the module
    docstring). ``lengths``: :func:`library_token_lengths` when already computed."""
    lengths = lengths if lengths is not None else library_token_lengths(tokenizer)
    longest = max(lengths.values())
    if requested is None:
        return -(-(longest + 1 + MARGIN) // ROUND) * ROUND
    if requested <= longest:
        cut = sorted((n, i) for i, n in lengths.items() if n >= requested)
        log.warning("max_new_tokens %d cuts %d library kernel(s) short (the longest, %s, is %d tokens): a sample "
                    "cannot finish them", requested, len(cut), cut[-1][1], longest)
    return requested
