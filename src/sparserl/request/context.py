"""One matrix of a kernel request, summarised once and passed down.

Everything a layer needs to know about the matrix a kernel is asked for rides on one
:class:`MatrixContext`: the matrix, its name and file, the operation (``op``, and ``k`` for SpMM,
None for SpMV whatever was given), and, computed the first time they are asked for and kept, its
structure features, its matrix card, its encoder input (per encoding), its registration with a
harness evaluator, and whether a storage format converts it. ``generate``, ``search``, the search
loop, the policy's proposals and ``evaluate`` read these from the context instead of computing
them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import scipy.sparse as sp

from sparserl.formats import accepts
from sparserl.harness.extract import Extracted, extract
from sparserl.kernels.contract import Op
from sparserl.matrices import load_matrix
from sparserl.matrices.card import MatrixCard, card_and_features
from sparserl.matrices.features import MatrixFeatures

if TYPE_CHECKING:
    from sparserl.encoding import EncodingConfig, MatrixInput
    from sparserl.harness.evaluator import MatrixRef
    from sparserl.model.policy import PolicyConfig, Sample


def matrix_name(path: str | Path) -> str:
    """A matrix file's name without its extensions (``A.mtx.gz`` -> ``A``)."""
    return Path(path).name.split(".")[0]


@dataclass(eq=False)
class MatrixContext:
    """A matrix, the operation asked of it, and what is known about it (see the module docstring)."""

    A: sp.csr_array
    """The matrix (canonical CSR)."""
    name: str
    """Its name, for reports, logs and the harness."""
    op: Op
    """The operation asked for."""
    k: int | None = None
    """SpMM columns (always None for SpMV)."""
    path: str | None = None
    """The file it was read from (None: made in memory)."""
    _shared: dict[str, Any] = field(default_factory=dict, repr=False)
    """What is computed once per matrix and shared with :meth:`with_op`'s contexts: features, card,
    encoder inputs, registrations, format checks."""

    def __post_init__(self) -> None:
        self.op = Op(self.op)
        if self.op is not Op.SPMM:
            self.k = None

    @classmethod
    def load(cls, path: str | Path, op: Op | str = Op.SPMV, k: int | None = None) -> MatrixContext:
        """The context of the matrix in file ``path`` (.mtx, .mtx.gz or .npz)."""
        return cls(load_matrix(path), matrix_name(path), Op(op), k, str(path))

    @classmethod
    def reuse_or_load(cls, given: MatrixContext | None, path: str | Path, op: Op | str = Op.SPMV,
                      k: int | None = None) -> MatrixContext:
        """``given`` asked for ``op`` (what it computed kept) when it is the context of the file
        ``path``, loaded already by a caller that runs several jobs on one matrix; else ``path``
        loaded. A context of another file is refused rather than used in its place. The context keeps
        its registrations by evaluator (:meth:`ref`, by the evaluator's id): share it among evaluators
        that stay open together, as the guided-search benchmark's three arms do."""
        if given is None:
            return cls.load(path, op, k)
        if given.path is None or Path(given.path).resolve() != Path(path).resolve():
            raise ValueError(f"the context given is of {given.path or 'a matrix made in memory'}, not of {path}")
        return given.with_op(op, k)

    def with_op(self, op: Op | str, k: int | None = None) -> MatrixContext:
        """The same matrix asked for another operation (what was computed about it is shared)."""
        return replace(self, op=Op(op), k=k, _shared=self._shared)

    # -- what the matrix is -----------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.A.shape[0]), int(self.A.shape[1])

    @property
    def nnz(self) -> int:
        return int(self.A.nnz)

    def _once(self, key: str, make):
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    @property
    def features(self) -> MatrixFeatures:
        """The structure features (:func:`~sparserl.matrices.compute_features`), computed with the card."""
        return self._once("card_and_features", lambda: card_and_features(self.A))[1]

    @property
    def card(self) -> MatrixCard:
        """The matrix card (:func:`~sparserl.matrices.card.matrix_card`)."""
        return self._once("card_and_features", lambda: card_and_features(self.A))[0]

    @property
    def prompt_card(self) -> str:
        """The card as every prompt carries it (:meth:`MatrixCard.prompt`)."""
        return self._once("prompt_card", self.card.prompt)

    # -- what the policy sees ----------------------------------------------------------------

    def encoder_input(self, encoding: EncodingConfig) -> MatrixInput:
        """The encoder's input for ``encoding`` (sampled coordinates and the summary; needs torch)."""
        from sparserl.encoding import MatrixInput  # torch

        return self._once(f"input:{encoding!r}", lambda: MatrixInput.from_matrix(self.A, encoding, self.features))

    def sample(self, config: PolicyConfig, prompt: str | None = None) -> Sample:
        """The policy's input for this request (:func:`~sparserl.model.policy.make_sample`), its card
        when the policy's prompt carries one; ``prompt``: a caller's own text prompt instead of the
        task line (a refinement)."""
        from sparserl.model.policy import Sample, uses_card  # torch

        return Sample(self.encoder_input(config.encoding), self.op, self.k, self.nnz, prompt=prompt,
                      card=self.prompt_card if uses_card(config) else None)

    # -- what the harness does with it ---------------------------------------------------------

    def ref(self, evaluator) -> MatrixRef:
        """The matrix registered with ``evaluator`` (once per evaluator)."""
        return self._once(f"ref:{id(evaluator)}", lambda: evaluator.register(self.A, self.name))

    def accepts(self, fmt: str, params: dict | None = None) -> bool:
        """Whether storage format ``fmt`` with ``params`` converts the matrix within its limits
        (checked on the host, once per format and parameters)."""
        params = dict(params or {})
        return self._once(f"accepts:{fmt}:{sorted(params.items())}", lambda: accepts(self.A, fmt, params))

    def converts(self, text: str) -> bool:
        """Whether a completion's FORMAT line converts the matrix (False when it has none)."""
        ex = extract(text, self.op)
        return isinstance(ex, Extracted) and self.accepts(ex.header.format, ex.header.params)
