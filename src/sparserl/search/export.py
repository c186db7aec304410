"""Export the best-known store as SFT pairs: the teacher of expert iteration.

Rows are the SFT data's rows (:class:`sparserl.data.rows.SFTRow`): the paper's fields
``rows, cols, shape, format, code`` (``rows``/``cols``: the matrix's sampled nonzero coordinates,
``code``: the verified completion, starting with ``FORMAT:``) plus ``op, k, nnz, family, split,
variant, times, card`` (``card``: the matrix card's facts, :meth:`MatrixCard.to_dict`) and, when
the matrix file the search read still exists, ``matrix`` (its path). ``sparserl sft --data
FILE.jsonl`` trains on the file as it is: the trainer reads the matrix from ``matrix`` when that
file exists, else rebuilds the prompt from ``rows``/``cols``/``shape`` and ``card``.
Extra fields say where a row came from: ``fingerprint, arch, harness_version, provenance``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sparserl.data.rows import KernelTimes, Refinement, SFTRow, TeacherOrigin, write_rows
from sparserl.data.targets import taught_length
from sparserl.errors import SparseRLError
from sparserl.matrices.card import MatrixCard
from sparserl.search.store import BestStore, MatrixRow, ResultRow

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportFilter:
    """Which verified kernels an export takes."""

    op: str | None = None
    """Only this op (None: both)."""
    arch: str | None = None
    """Only this GPU architecture (sm_90 ...; None: every one)."""
    regime: str | None = None
    """Only results timed in this regime (None: every one)."""
    harness_version: str | None = None
    """Only results under this harness version (None: every one)."""
    min_speedup: float = 0.0
    """Only kernels at least this fast against cuSPARSE."""
    per_matrix: int = 1
    """The fastest this many distinct kernels per (matrix, op, k, arch, regime, harness version)."""
    within: float | None = None
    """Only kernels at most this fraction slower than the best known for their matrix (the fastest
    verified result with the same op, k, arch, regime and harness version): 0.05 keeps kernels
    within 5% of the best. None: no such limit. Expert iteration's teacher set."""
    fingerprints: frozenset[str] | None = None
    """Only these matrices (structure fingerprints); None: every matrix in the store."""
    seen_only: bool = False
    """Only kernels that bake in no structure fact the policy's prompt card leaves out (a
    template's ``unseen``: a long-row table the card does not prove complete, diagonal offsets too
    many to list), judged from their candidate id (:func:`unseen_facts`) or, for free text, from
    who wrote it (:func:`free_text_unseen`). What cannot be judged is left out and counted. Expert
    iteration's teacher: the policy sees the prompt's card, not the store's."""
    max_chars: int | None = None
    """Only kernels whose text as the policy is taught it (without comments) has at most this many
    characters; the next fastest within the limit takes a longer one's place (and ``within`` counts
    from the fastest kernel within the limit, as the data build's targets do). None: no limit. The
    policy's held-out samples of the longest kernels (``csr_adaptive`` and its specialised form,
    6.4k-8.8k characters) were correct once in 32."""

    def __post_init__(self) -> None:
        if self.per_matrix < 1:
            raise SparseRLError(f"--per-matrix must be at least 1, got {self.per_matrix}")
        if self.within is not None and not self.within >= 0:
            raise SparseRLError(f"--within must be >= 0 (a fraction: 0.05 is 5%), got {self.within}")
        if self.min_speedup < 0:
            raise SparseRLError("--min-speedup must be >= 0")
        if self.max_chars is not None and self.max_chars < 1:
            raise SparseRLError(f"--max-chars must be at least 1, got {self.max_chars}")
        if self.op not in (None, "spmv", "spmm"):
            raise SparseRLError(f"--op must be spmv or spmm, got {self.op!r}")


def _coords(m: MatrixRow) -> tuple[list[int], list[int]] | None:
    if m.coords is not None:
        return m.coords
    if m.source_path and Path(m.source_path).exists():
        from sparserl.encoding import sample_nonzeros
        from sparserl.matrices import load_matrix
        from sparserl.search.store import COORDS

        r, c = sample_nonzeros(load_matrix(m.source_path), COORDS, 0)
        return r.tolist(), c.tolist()
    return None


UNJUDGED = "cannot be judged: "
"""How :func:`unseen_facts` begins when it could not read what a kernel bakes in (the teacher leaves
such kernels out all the same, and counts them apart as ``unjudged``)."""

MAX_REFINEMENT_CHAIN = 32
"""The most policy refinements followed back to a kernel written from the card alone."""


def unseen_facts(candidate_id: str | None, card: MatrixCard | None, k: int | None = None) -> str | None:
    """What the template point named by ``candidate_id`` bakes in for ``card`` that the prompt's
    card does not show. None only when the filter can vouch for it: a generic template point of
    this version (nothing baked in), or a specialised point whose facts the card shows.

    Fails closed: everything it cannot read comes back as a reason beginning :data:`UNJUDGED` and
    is left out by the teacher: no id, an id that is not exactly this version's id for a point of a
    known template (malformed parameters, a template or point this version does not know, a
    specialised template under a generic id or the reverse), a specialised point without a card or
    not valid for it, and free text (``text/...``, which :func:`export_rows` judges from who wrote
    it instead)."""
    from sparserl.kernels.templates import get_template
    from sparserl.search.space import parse_candidate_id

    if not candidate_id:
        return UNJUDGED + "no candidate id"
    if candidate_id.startswith("text/"):
        return UNJUDGED + "free text (not a template point)"
    parsed = parse_candidate_id(candidate_id)
    if parsed is None:
        return UNJUDGED + f"{candidate_id!r} does not parse as a template point"
    op, name, params = parsed
    try:
        t = get_template(op, name)
    except (SparseRLError, ValueError):  # a template, or an op, this version does not know
        return UNJUDGED + f"{name}: a template this version does not know"
    if not _is_point(t, params):
        return UNJUDGED + f"{candidate_id!r} is not a point of this version's {name}"
    if t.candidate(params).id != candidate_id:  # e.g. a generic template under a /spec id, or the reverse
        return UNJUDGED + f"{candidate_id!r} is not this version's id for that point of {name}"
    if not t.specialised:
        return None
    if card is None:
        return UNJUDGED + f"{name}: no card for its matrix"
    why = t.check(params, card, k)
    if why:
        return UNJUDGED + f"not a valid point here ({why})"
    return t.unseen_facts(params, card, k)


def _is_point(t, params: dict[str, int]) -> bool:
    """Whether ``params`` names exactly one point of ``t``'s space (every parameter, each in its domain)."""
    return set(params) == {p.name for p in t.space} and all(params[p.name] in p.values for p in t.space)


def free_text_unseen(candidate_id: str, authors: dict[str, list[tuple[str, str | None]]], card: MatrixCard | None,
                     k: int | None = None, depth: int = 0) -> str | None:
    """What a free-text kernel (``text/...``) may bake in that the prompt's card does not show,
    judged from who wrote it on this matrix (``authors``: candidate id -> (provenance, parent id)
    of each of its results there). None when one of its results was a policy sample (the policy
    saw the prompt's card and the matrix, nothing else) or a policy refinement of a kernel this
    filter vouches for (the policy saw that kernel besides). Anything else is left out: free text
    met only as a re-run of a known best, a refinement of a kernel that bakes unseen facts or
    cannot be judged, a chain of refinements longer than :data:`MAX_REFINEMENT_CHAIN`."""
    from sparserl.search.space import Provenance

    for provenance, parent in authors.get(candidate_id, ()):
        if provenance == Provenance.POLICY_SAMPLE.value:
            return None
        if provenance == Provenance.POLICY_REFINE.value and parent and depth < MAX_REFINEMENT_CHAIN:
            why = (free_text_unseen(parent, authors, card, k, depth + 1) if parent.startswith("text/")
                   else unseen_facts(parent, card, k))
            if why is None:
                return None
    return UNJUDGED + "free text not written from the prompt's card alone (nor refined from a kernel that was)"


def _card(store: BestStore, fingerprint: str) -> MatrixCard | None:
    m = store.matrix(fingerprint)
    try:
        return MatrixCard.from_dict(m.card) if m is not None else None
    except (TypeError, KeyError, ValueError) as exc:  # a card written by another version
        log.warning("the stored card of %s cannot be read (%s): its specialised kernels are not exported",
                    fingerprint[:12], exc)
        return None


def _authors(store: BestStore, fingerprint: str) -> dict[str, list[tuple[str, str | None]]]:
    """Candidate id -> (provenance, parent id) of each of its results on one matrix."""
    out: dict[str, list[tuple[str, str | None]]] = {}
    for r in store.results(fingerprint=fingerprint):
        if r.fingerprint == fingerprint and r.candidate_id:
            out.setdefault(r.candidate_id, []).append((r.provenance, r.parent_id))
    return out


class _Matrices:
    """The store's matrices and their sampled coordinates, each read once per export."""

    def __init__(self, store: BestStore):
        self.store = store
        self._got: dict[str, tuple[MatrixRow | None, tuple | None]] = {}

    def get(self, fingerprint: str) -> tuple[MatrixRow | None, tuple | None]:
        """(matrix row, its (rows, cols) coordinates), either None when the store cannot give it."""
        if fingerprint not in self._got:
            m = self.store.matrix(fingerprint)
            self._got[fingerprint] = (m, _coords(m) if m is not None else None)
        return self._got[fingerprint]


def _by_matrix(item: tuple) -> tuple:
    """Sort key of a (result key, ...) item: matrix, op, k, then architecture (None first)."""
    return item[0][:3] + (item[0][3] or "",)


def _teacher_row(store: BestStore, m: MatrixRow, xy: tuple, r: ResultRow,
                 refinement: Refinement | None = None) -> SFTRow:
    """The SFT row of the store's verified result ``r`` on matrix ``m`` (coordinates ``xy``)."""
    return SFTRow(
        rows=list(xy[0]), cols=list(xy[1]), shape=(m.rows, m.cols), code=store.kernel_text(r.kernel_sha),
        format=r.format, op=r.op, k=r.k, nnz=m.nnz, family="best_known", split="train", variant=r.candidate_id,
        name=m.name, times=KernelTimes(r.time_us, r.cusparse_us, r.speedup, r.regime), card=m.card,
        origin=TeacherOrigin(r.fingerprint, r.arch, r.harness_version, r.provenance),
        matrix=m.source_path if m.source_path and Path(m.source_path).exists() else None, refinement=refinement)


class _Lengths:
    """:class:`ExportFilter`'s ``max_chars`` rule: each stored kernel's taught length, read once."""

    def __init__(self, store: BestStore, max_chars: int | None):
        self.store, self.max_chars, self.chars = store, max_chars, {}

    def too_long(self, kernel_sha: str) -> bool:
        if self.max_chars is None:
            return False
        if kernel_sha not in self.chars:
            self.chars[kernel_sha] = taught_length(self.store.kernel_text(kernel_sha))
        return self.chars[kernel_sha] > self.max_chars


class _SeenJudge:
    """:class:`ExportFilter`'s ``seen_only`` rule for the results of one store, each verdict made once."""

    def __init__(self, store: BestStore):
        self.store = store
        self.cards: dict[str, MatrixCard | None] = {}
        self.authors: dict[str, dict[str, list[tuple[str, str | None]]]] = {}  # fingerprint -> free_text_unseen's
        self.verdicts: dict[tuple, str | None] = {}  # (fingerprint, k, candidate id) -> why unseen, or None

    def why_unseen(self, r: ResultRow) -> str | None:
        """Why ``r``'s kernel bakes in facts the prompt's card does not show (or cannot be judged), or None."""
        vk = (r.fingerprint, r.k, r.candidate_id)
        if vk not in self.verdicts:
            if r.fingerprint not in self.cards:
                self.cards[r.fingerprint] = _card(self.store, r.fingerprint)
            card = self.cards[r.fingerprint]
            if (r.candidate_id or "").startswith("text/"):
                if r.fingerprint not in self.authors:
                    self.authors[r.fingerprint] = _authors(self.store, r.fingerprint)
                self.verdicts[vk] = free_text_unseen(r.candidate_id, self.authors[r.fingerprint], card, r.k)
            else:
                self.verdicts[vk] = unseen_facts(r.candidate_id, card, r.k)
            if self.verdicts[vk]:
                log.debug("not exported (%s): %s", r.candidate_id, self.verdicts[vk])
        return self.verdicts[vk]


def export_rows(store: BestStore, flt: ExportFilter = ExportFilter()) -> tuple[list[SFTRow], dict]:
    """The SFT rows of the store's kernels that pass ``flt``, and counts of what was skipped
    (``unseen_facts``: distinct kernels ``seen_only`` left out; ``unjudged``: those of them it could
    not read, left out because the filter fails closed)."""
    picked: dict[tuple, list[ResultRow]] = {}
    fastest: dict[tuple, float] = {}
    judge, lengths = _SeenJudge(store), _Lengths(store, flt.max_chars)
    too_long: set[str] = set()  # kernels the length limit left out
    unseen: set[tuple] = set()  # (fingerprint, k, kernel) left out as unseen
    unjudged: set[tuple] = set()  # the part of those the filter could not read
    rows = [r for r in store.results(op=flt.op, arch=flt.arch, regime=flt.regime, harness_version=flt.harness_version)
            if flt.fingerprints is None or r.fingerprint in flt.fingerprints]
    key_of = lambda r: (r.fingerprint, r.op, r.k, r.arch, r.regime, r.harness_version)  # noqa: E731
    models: dict[tuple, set] = {}
    for r in rows:
        models.setdefault(key_of(r), set()).add(r.gpu)
    # times of one GPU model compare as times; across two models of an architecture, relative to the cuSPARSE
    # time measured beside each (an H200's 10 us is not an H100's)
    cost = lambda r: r.time_us if len(models[key_of(r)]) == 1 else 1.0 / r.speedup  # noqa: E731
    rows.sort(key=lambda r: (cost(r), r.id))
    for r in rows:
        key = key_of(r)
        if lengths.too_long(r.kernel_sha):  # before the best known is read: within counts from the fastest taught
            too_long.add(r.kernel_sha)
            continue
        best = fastest.setdefault(key, cost(r))  # fastest first: the first is the best known
        if r.speedup < flt.min_speedup or (flt.within is not None and cost(r) > best * (1 + flt.within)):
            continue
        group = picked.setdefault(key, [])
        if len(group) >= flt.per_matrix or any(g.kernel_sha == r.kernel_sha for g in group):
            continue
        if flt.seen_only:
            why = judge.why_unseen(r)
            if why:
                unseen.add((r.fingerprint, r.k, r.kernel_sha))
                if why.startswith(UNJUDGED):
                    unjudged.add((r.fingerprint, r.k, r.kernel_sha))
                continue
        group.append(r)  # results come fastest first
    rows, seen = [], set()
    skipped = {"no_coordinates": 0, "duplicate": 0, "unseen_facts": len(unseen), "unjudged": len(unjudged),
               "too_long": len(too_long)}
    matrices = _Matrices(store)
    for (fp, op, k, arch, regime, hv), group in sorted(picked.items(), key=_by_matrix):
        m, xy = matrices.get(fp)
        for r in group:
            key = (fp, op, k, r.kernel_sha)
            if key in seen:
                skipped["duplicate"] += 1
                continue
            if m is None or xy is None:
                skipped["no_coordinates"] += 1
                continue
            seen.add(key)
            rows.append(_teacher_row(store, m, xy, r))
    if skipped["no_coordinates"]:
        log.warning("%d kernels skipped: their matrix has no sampled coordinates in the store and its file is gone",
                    skipped["no_coordinates"])
    return rows, skipped


MIN_REFINEMENT_GAIN = 0.02
"""A refinement row's completion is at least this much faster than the kernel it was found from
(2%: beyond the spread of two cold timings of one kernel)."""


def refinement_rows(store: BestStore, flt: ExportFilter = ExportFilter(),
                    min_gain: float = MIN_REFINEMENT_GAIN) -> tuple[list[SFTRow], dict]:
    """Rows that teach a refinement, from the store's search history: a verified kernel whose parent
    (the candidate a search mutated or refined to make it) is verified on the same matrix, op, k,
    architecture, regime and harness version, and at least ``min_gain`` slower. The row's prompt
    shows the parent and its measured time as search and RL show a previous kernel
    (:func:`~sparserl.search.policy.refinement_text`); its completion is the child. Each candidate
    counts with its fastest time; each (parent kernel, child kernel) pair once per matrix, op, k,
    architecture, regime and harness version (their times differ). ``flt``'s op, arch,
    regime, harness version, matrices, ``min_speedup`` and ``seen_only`` apply to the child;
    ``max_chars`` applies to the child; ``per_matrix`` and ``within`` do not. Returns the rows and
    counts of what was skipped."""
    from sparserl.search.policy import MAX_PREVIOUS_CHARS, describe_timing

    by_key: dict[tuple, dict[str, ResultRow]] = {}  # key -> candidate id -> its fastest result
    for r in store.results(op=flt.op, arch=flt.arch, regime=flt.regime, harness_version=flt.harness_version):
        if r.candidate_id and (flt.fingerprints is None or r.fingerprint in flt.fingerprints):
            key = (r.fingerprint, r.op, r.k, r.arch, r.regime, r.harness_version)
            by_key.setdefault(key, {}).setdefault(r.candidate_id, r)  # results come fastest first
    judge, matrices, lengths = _SeenJudge(store), _Matrices(store), _Lengths(store, flt.max_chars)
    rows: list[SFTRow] = []
    skipped = {"not_faster": 0, "slow": 0, "too_long": 0, "unseen_facts": 0, "no_coordinates": 0}
    for key, cands in sorted(by_key.items(), key=_by_matrix):
        pairs = set()
        for r in cands.values():
            parent = cands.get(r.parent_id) if r.parent_id else None
            if parent is None or parent.kernel_sha == r.kernel_sha or (parent.kernel_sha, r.kernel_sha) in pairs:
                continue
            if r.time_us * (1 + min_gain) > parent.time_us:
                skipped["not_faster"] += 1
                continue
            if r.speedup < flt.min_speedup:
                skipped["slow"] += 1
                continue
            if lengths.too_long(r.kernel_sha):
                skipped["too_long"] += 1
                continue
            if flt.seen_only and judge.why_unseen(r):
                skipped["unseen_facts"] += 1
                continue
            m, xy = matrices.get(key[0])
            if m is None or xy is None:
                skipped["no_coordinates"] += 1
                continue
            pairs.add((parent.kernel_sha, r.kernel_sha))
            outcome = describe_timing(parent.time_us, parent.cusparse_us, parent.regime, parent.roofline)
            rows.append(_teacher_row(store, m, xy, r, Refinement(
                store.kernel_text(parent.kernel_sha)[:MAX_PREVIOUS_CHARS], outcome, True, parent.candidate_id)))
    return rows, skipped


def export_sft(store: BestStore, path: str | Path, flt: ExportFilter = ExportFilter(),
               refinements: bool = False) -> dict:
    """Write the rows of :func:`export_rows` to ``path`` (JSONL), and with ``refinements`` those of
    :func:`refinement_rows` after them; returns counts."""
    rows, skipped = export_rows(store, flt)
    if refinements:
        more, skipped_more = refinement_rows(store, flt)
        rows += more
        skipped |= {f"refinement_{k}": v for k, v in skipped_more.items()}
    if not rows:
        raise SparseRLError(f"nothing to export from {store.path}: no verified kernel passes the filters"
                            + (" (the store is empty)" if not store.counts()["results"] else ""))
    write_rows(path, rows)
    return {"rows": len(rows), "refinement_rows": sum(r.refinement is not None for r in rows),
            "matrices": len({r.origin.fingerprint for r in rows}), "skipped": skipped, "path": str(path)}
