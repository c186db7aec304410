"""What a policy's prompt needs of many matrices, computed in threads before the GPU waits on it.

A matrix's card, structure features and encoder input are CPU work of 0.1-6 s for a matrix of a
million rows on one core, depending on its structure (numpy and scipy, which release the GIL for
most of it; benchmarks/prompt_prep.py measures it). Computed lazily, the first time a
sample asks for them, they sit on the critical path while the GPU idles: an evaluation's
generation, an SFT run's first steps. :func:`warm_contexts` does that work up front, spread over
the machine's cores (:func:`sparserl.parallel.parallel_map`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sparserl.parallel import parallel_map

if TYPE_CHECKING:
    from sparserl.model.policy import PolicyConfig
    from sparserl.request.context import MatrixContext

log = logging.getLogger(__name__)


def warm_context(ctx: MatrixContext, configs: Iterable[PolicyConfig] = ()) -> MatrixContext:
    """Compute ``ctx``'s card and features, its prompt card, and its encoder input for each of
    ``configs`` (the policies that will sample it), kept in the context; returns it."""
    ctx.prompt_card  # noqa: B018 (computed once and kept in the context; the features come with it)
    for enc in {repr(c.encoding): c.encoding for c in configs}.values():
        ctx.encoder_input(enc)
    return ctx


def warm_contexts(contexts: Iterable[MatrixContext], configs: Iterable[PolicyConfig] = (),
                  workers: int | None = None) -> float:
    """:func:`warm_context` of each context, in threads; returns the seconds it took. Each context is
    one thread's task: give distinct matrices (contexts from one :meth:`MatrixContext.with_op` share
    what they compute, and two threads would then make it twice)."""
    contexts, configs = list(contexts), list(configs)
    t0 = time.perf_counter()
    parallel_map(lambda ctx: warm_context(ctx, configs), contexts, workers)
    seconds = time.perf_counter() - t0
    log.info("cards and inputs of %d matrices in %.1f s", len(contexts), seconds)
    return seconds
