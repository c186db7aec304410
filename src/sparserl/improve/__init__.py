"""``sparserl improve``: expert iteration, the best-known store as the teacher.

    sparserl improve --rounds 2          # on a GPU; --resume continues a killed run

Each round searches training matrices with the current policy proposing, collects the verified
kernels within a few percent of each matrix's best known, fine-tunes on them and validates;
the round's checkpoint is kept (``best/``) only when validation improves.

* :mod:`.config`: :class:`ImproveConfig`, the knobs that bound a round;
* :mod:`.loop`: the round loop, its phases and its resumable state;
* :mod:`.table`: the per-round metrics and ``rounds.md``.
"""

from sparserl.improve.config import ImproveConfig

__all__ = ["ImproveConfig", "improve"]


def improve(*args, **kwargs):
    """:func:`sparserl.improve.loop.improve` (imported when called: it needs torch)."""
    from sparserl.improve.loop import improve as run

    return run(*args, **kwargs)
