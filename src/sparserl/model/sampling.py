"""Drawing tokens from a decoder's logits: temperature, top-k and top-p, with the drawn tokens'
log-probabilities.

Sampling is the Gumbel-max trick on the filtered logits (equivalent to drawing from the softmax),
so it needs nothing but ``torch.rand`` and stays capturable in a CUDA graph. Every decode engine
(:mod:`sparserl.model.decode`, :mod:`sparserl.model.bucketed`) draws through :func:`sample_with_logp`.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Logits (B, V) with everything outside the top-k and the top-p nucleus set to -inf.

    Same rule as ``transformers``' warpers: top-k first, then the smallest set of tokens whose
    probability mass reaches ``top_p`` (the most likely token is always kept).
    """
    neg = torch.finfo(logits.dtype).min
    if top_k and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, neg)
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= 1.0 - top_p
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, neg)
    return logits


def sample_tokens(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """One token per row of ``logits`` (B, V): argmax at temperature 0, else a softmax draw."""
    return sample_with_logp(logits, temperature, top_k, top_p)[0]


def sample_with_logp(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0,
                     constraint=None, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token (B,), its log-probability (B,) under the distribution it was drawn from) for logits (B, V).

    The distribution is ``softmax(filter(logits / temperature))``, in float32: the sampler's own
    log-probabilities, which the learner's must match. At temperature 0 (argmax) the
    log-probability is the unscaled, unfiltered softmax's (the masked one's under a constraint).

    ``constraint``: a :class:`sparserl.model.header_grammar.HeaderConstraint`; the tokens it forbids
    are masked out first (the distribution is then the masked one's), and its states move by the
    drawn tokens. ``rows``: the constraint's rows these logits belong to (None: all, in order)."""
    logits = logits.float()
    if constraint is not None:
        logits = constraint.mask(logits, rows)
    if temperature <= 0:
        tok = logits.argmax(dim=-1)
    else:
        logits = filter_logits(logits / temperature, top_k, top_p)
        u = torch.rand_like(logits).clamp_(1e-12, 1.0 - 1e-7)
        tok = (logits - torch.log(-torch.log(u))).argmax(dim=-1)
    if constraint is not None:
        constraint.advance(tok, rows)
    return tok, torch.log_softmax(logits, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
