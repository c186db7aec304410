"""The best-known store: the fastest verified kernel per (matrix structure, op, k, GPU architecture).

A search (and ``generate --search``, RL's ``relative_best`` reward, the farm) writes every
*verified* candidate here as soon as its result arrives, so an interrupted search loses nothing it
had verified; only kernels the harness verified and timed on a GPU ever enter. Compile-only
results never do.

Two databases take the same schema (:mod:`.store_backends`): one SQLite file, the embedded default
(``--store PATH``), and a PostgreSQL server that several hosts share (``--store
postgresql://user@host/dbname``). Plain tables and explicit types (INTEGER, REAL, TEXT;
timestamps as ISO-8601 UTC text; JSON as text); ``id`` is SQLite's ``INTEGER PRIMARY KEY`` and
PostgreSQL's identity column, REAL is PostgreSQL's DOUBLE PRECISION.

Concurrent writers never lose or duplicate a best kernel: the best row is written by one
``INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE excluded.time_us < best.time_us`` statement,
which both databases apply atomically against the row as it stands (on SQLite the write lock is
besides taken before anything is read, ``BEGIN IMMEDIATE``). Each verified result carries a
``uid`` (unique), so writing it again (a retry after a lost connection, a farm's journal replayed
on ``--resume``) changes nothing.

A kernel found wrong later (the second look before a kernel is handed back evaluates it again, on fresh
inputs: :mod:`sparserl.request.second_look`) is retracted (:meth:`BestStore.retract`): its results on that
matrix go under every key, the best is chosen again where it was the best, and it is remembered as found wrong
there, so that a later search that times it correct once more (a racy kernel) does not record it again and
nothing offers it for that matrix again (the search's seeds, ``tune``'s lookup; the search does not propose its
text, whitespace aside, again: ``found_wrong_texts``). On PostgreSQL a retraction holds its matrix alone while a
recording for the matrix shares it (an advisory lock), and every transaction runs at READ COMMITTED whatever the
server's default (one that waited for the lock sees what its holder committed): a result recorded meanwhile is
either seen and removed, or refused.

Tables (``SCHEMA_VERSION`` 4; version 1 is created first and migrated, see :data:`MIGRATIONS`):

* ``schema_version(version)``: one row. A store written by a newer SparseRL is refused in one line.
* ``matrices``: one row per structure fingerprint: name, shape, nnz, the matrix card (JSON),
  up to :data:`COORDS` sampled nonzero coordinates (JSON, as the SFT data carries them) and the
  file it was loaded from, so ``export`` can rebuild the model's prompt; and the structure
  features (:class:`~sparserl.matrices.features.MatrixFeatures`, JSON), which the cost model
  learns from beside the card (NULL for a matrix recorded before schema 3).
* ``kernels``: completion texts by SHA-256, with their format, template and candidate id.
* ``results``: every verified candidate's times (kernel, cuSPARSE, speedup, roofline), regime,
  harness version, GPU and the host it ran on, provenance (how the search proposed it, its
  parent, the model), run, and its ``uid``.
* ``best``: per (fingerprint, op, k, arch, regime, harness_version), the fastest result. A new
  result replaces it only when strictly faster: in time on the same GPU model, in speedup over
  cuSPARSE timed beside it on another GPU of the architecture (an H200's 10 us and an H100's 12 us
  are not one scale); times under another harness version or regime
  are never compared (they are other keys: two farms of different harness versions on one store
  keep apart). ``k`` is 0 for SpMV (a key column is never NULL).
* ``runs``: one row per search: when, what, its configuration, how it ended.
* ``found_wrong``: per (fingerprint, op, k, kernel), that the kernel was found wrong on the matrix after it was
  verified: when it was first found wrong, under which architecture, regime and harness version it had been
  verified, and why (the failed evaluation's verdict). Its results on the matrix are gone and no result of it
  is recorded there again. No key refers to another table: a kernel the store never held, on a matrix it
  never recorded, is remembered as well (the text stays in ``kernels`` where the store held it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

from sparserl.errors import SparseRLError
from sparserl.search.store_backends import (
    BUSY_TIMEOUT_S,  # noqa: F401 (re-exported: how long a writer waits)
    StoreError,
    StoreUnavailable,
    is_url,
    open_backend,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 4
"""Version of the tables below; a store with a larger version was written by a newer SparseRL."""

COORDS = 1024
"""Sampled nonzero coordinates kept per matrix (the SFT data's default ``coords``)."""

STORE_FILE = "best_known.sqlite"
"""File name of the default store under the harness cache root."""


def harness_version() -> str:
    """The harness version this process records results under (``sparserl.harness.result.HARNESS_VERSION``)."""
    from sparserl.harness.result import HARNESS_VERSION

    return str(HARNESS_VERSION)


def store_label(spec: str | os.PathLike[str] | None) -> str:
    """How messages name a store: its path, or its URL without the password."""
    from sparserl.search.store_backends import redact

    if spec is None:
        return str(default_store_path())
    return redact(str(spec)) if isinstance(spec, str) and is_url(spec) else str(spec)


def default_store_path() -> Path:
    """``<harness cache root>/best_known.sqlite`` (root: $SPARSERL_CACHE_DIR or ~/.cache/sparserl)."""
    from sparserl.harness.evaluator import HarnessConfig

    return HarnessConfig().root / STORE_FILE


def kernel_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS matrices (
    fingerprint TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    rows {bigint} NOT NULL,
    cols {bigint} NOT NULL,
    nnz {bigint} NOT NULL,
    card_json TEXT NOT NULL,
    coords_json TEXT,
    source_path TEXT,
    added_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS kernels (
    kernel_sha TEXT PRIMARY KEY,
    text TEXT NOT NULL,
    format TEXT,
    template TEXT,
    candidate_id TEXT
);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    op TEXT NOT NULL,
    k INTEGER NOT NULL,
    started_at TEXT NOT NULL,
    finished_at TEXT,
    status TEXT NOT NULL,
    config_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    id {id},
    fingerprint TEXT NOT NULL REFERENCES matrices(fingerprint),
    op TEXT NOT NULL,
    k INTEGER NOT NULL,
    arch TEXT NOT NULL,
    gpu TEXT,
    regime TEXT NOT NULL,
    harness_version TEXT NOT NULL,
    kernel_sha TEXT NOT NULL REFERENCES kernels(kernel_sha),
    time_us {real} NOT NULL,
    cusparse_us {real} NOT NULL,
    speedup {real} NOT NULL,
    roofline {real},
    provenance TEXT NOT NULL,
    parent_id TEXT,
    model TEXT,
    run_id TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_by_key ON results (fingerprint, op, k, arch);
CREATE TABLE IF NOT EXISTS best (
    fingerprint TEXT NOT NULL REFERENCES matrices(fingerprint),
    op TEXT NOT NULL,
    k INTEGER NOT NULL,
    arch TEXT NOT NULL,
    regime TEXT NOT NULL,
    harness_version TEXT NOT NULL,
    result_id {bigint} NOT NULL REFERENCES results(id),
    kernel_sha TEXT NOT NULL REFERENCES kernels(kernel_sha),
    time_us {real} NOT NULL,
    cusparse_us {real} NOT NULL,
    speedup {real} NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (fingerprint, op, k, arch, regime, harness_version)
);
"""
"""The first version of the tables (``{id}``, ``{bigint}``, ``{real}``: the backend's types); a new
store is made at version 1 and brought up to date by :data:`MIGRATIONS`, as an old store is."""

MIGRATIONS: dict[int, tuple[str, ...]] = {
    2: ("ALTER TABLE results ADD COLUMN host TEXT",
        "ALTER TABLE results ADD COLUMN uid TEXT",
        "CREATE UNIQUE INDEX IF NOT EXISTS results_by_uid ON results (uid)"),
    3: ("ALTER TABLE matrices ADD COLUMN features_json TEXT",),
    4: ("CREATE TABLE IF NOT EXISTS found_wrong (fingerprint TEXT NOT NULL, op TEXT NOT NULL, k INTEGER NOT NULL, "
        "kernel_sha TEXT NOT NULL, arch TEXT NOT NULL, regime TEXT NOT NULL, "
        "harness_version TEXT NOT NULL, reason TEXT NOT NULL, found_at TEXT NOT NULL, "
        "PRIMARY KEY (fingerprint, op, k, kernel_sha))",),
}
"""Statements that take a store from version N-1 to N, run in order in one transaction under the
migration lock. 2: the host a result was measured on (farms span machines), and a unique id per
verified result so writing it twice (a retry, a replayed journal) records it once. 3: the
matrix's structure features (nullable: rows recorded earlier keep NULL until a search records the
matrix again), which the cost model learns from. 4: the kernels found wrong on a matrix after they were
verified (``found_wrong``), which ``retract`` writes and ``record`` refuses to record again."""

_TABLES = ("schema_version", "matrices", "kernels", "runs", "results", "best", "found_wrong")
"""The store's tables: a database without ``schema_version`` that holds one of them is no new store (refused
rather than taken over), and ``counts`` counts their rows."""


class Recorded(str, Enum):
    """What :meth:`BestStore.record_outcome` did with a verified result."""

    BEST = "best"
    """Written, and now the best for its key."""
    WRITTEN = "written"
    """Written; the best for its key stays faster."""
    SEEN = "seen"
    """Not written: a result with its ``uid`` is in the store already (a retry, a replayed journal)."""
    REFUSED = "refused"
    """Not written: the kernel was found wrong on this matrix before (:meth:`BestStore.retract`)."""

    @property
    def written(self) -> bool:
        return self in (Recorded.BEST, Recorded.WRITTEN)


@dataclass(frozen=True)
class VerifiedKernel:
    """One verified, timed candidate on one matrix: what :meth:`BestStore.record` writes."""

    fingerprint: str
    op: str
    k: int | None
    arch: str
    gpu: str | None
    regime: str
    text: str
    """The completion (FORMAT/LAUNCH header + kernel), as extracted by the harness."""
    time_us: float
    cusparse_us: float
    speedup: float
    roofline: float | None
    format: str | None
    template: str | None
    candidate_id: str
    provenance: str
    """How the search proposed it: seed, mutation, random, policy-sample, policy-refine ..."""
    parent_id: str | None
    model: str | None
    run_id: str
    harness_version: str
    host: str | None = field(default_factory=socket.gethostname)
    """The machine that measured it (the GPU's host)."""
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    """This result's unique id: recording it again changes nothing."""

    def __post_init__(self) -> None:
        if not (self.time_us > 0 and self.cusparse_us > 0 and self.speedup > 0):
            raise ValueError(f"a verified kernel needs positive times, got {self.time_us}, {self.cusparse_us}")


@dataclass(frozen=True)
class BestRow:
    """One row of the ``best`` table joined with its kernel, result and matrix."""

    fingerprint: str
    name: str
    rows: int
    cols: int
    nnz: int
    op: str
    k: int | None
    arch: str
    gpu: str | None
    regime: str
    harness_version: str
    time_us: float
    cusparse_us: float
    speedup: float
    roofline: float | None
    format: str | None
    template: str | None
    candidate_id: str | None
    provenance: str
    parent_id: str | None
    model: str | None
    run_id: str
    updated_at: str
    kernel_sha: str
    text: str


@dataclass(frozen=True)
class ResultRow:
    """One verified result (the ``results`` table)."""

    id: int
    fingerprint: str
    op: str
    k: int | None
    arch: str
    regime: str
    harness_version: str
    time_us: float
    cusparse_us: float
    speedup: float
    candidate_id: str | None
    format: str | None
    provenance: str
    run_id: str
    created_at: str
    kernel_sha: str
    parent_id: str | None = None
    """The candidate id of the kernel this one was derived from (a mutation's or a refinement's parent)."""
    host: str | None = None
    """The machine that measured it (None: written before stores kept it)."""
    roofline: float | None = None
    """Its fraction of the memory roofline, where the harness computed one."""
    template: str | None = None
    """The template whose point the kernel is (for free text, the one the search read it as), if any."""
    gpu: str | None = None
    """The GPU model that measured it (times of two models of one architecture are not one scale)."""


@dataclass(frozen=True)
class MatrixRow:
    """One row of the ``matrices`` table."""

    fingerprint: str
    name: str
    rows: int
    cols: int
    nnz: int
    card: dict
    coords: tuple[list[int], list[int]] | None
    source_path: str | None
    features: dict | None = None
    """The structure features (``MatrixFeatures.to_dict()``); None for a matrix recorded before schema 3."""


def _k(k: int | None) -> int:
    return int(k) if k else 0


def _unk(k: int) -> int | None:
    return k or None


_MATRIX = "fingerprint = ? AND op = ? AND k = ?"
"""SQL condition: one matrix (fingerprint, op, k) of a table's rows."""


def _matrix_lock(fingerprint: str, op: str, k: int) -> str:
    """The key of a matrix's lock (:meth:`~.store_backends.PostgresBackend.key_lock`)."""
    return f"{fingerprint}/{op}/{k}"


def _filters(table: str, fingerprint: str | None, op: str | None, k: int | None, arch: str | None,
             regime: str | None, harness_version: str | None) -> tuple[list[str], list]:
    """SQL conditions and their arguments for the filters given, on ``table``'s columns
    (``fingerprint``: the fingerprint or a prefix of it, taken literally; ``k``: None matches any), and
    always: no kernel found wrong on its matrix (``retract`` deletes such rows; this keeps out any left by
    hand or by a retraction of an earlier version, from every reader: export, improve, RL, the cost model)."""
    where: list[str] = [f"NOT EXISTS (SELECT 1 FROM found_wrong fw WHERE fw.fingerprint = {table}.fingerprint "
                        f"AND fw.op = {table}.op AND fw.k = {table}.k AND fw.kernel_sha = {table}.kernel_sha)"]
    args: list = []
    for col, val in (("op", op), ("arch", arch), ("regime", regime), ("harness_version", harness_version)):
        if val is not None:
            where.append(f"{table}.{col} = ?")
            args.append(val)
    if fingerprint is not None:
        where.append(f"substr({table}.fingerprint, 1, CAST(? AS INTEGER)) = ?")
        args += [len(fingerprint), fingerprint]
    if k is not None:
        where.append(f"{table}.k = ?")
        args.append(_k(k))
    return where, args


class BestStore:
    """The best-known store (see the module docstring) in an SQLite file or a PostgreSQL database.

    ``BestStore(path)`` opens (or makes) an SQLite file; ``BestStore("postgresql://...")`` a
    server's database. One connection per instance; use one instance per thread or process. Every
    failure comes out as a one-line :class:`~.store_backends.StoreError` (a database that cannot
    be reached: :class:`~.store_backends.StoreUnavailable`); on PostgreSQL a lost connection is
    opened again once and the statement retried (every write is idempotent)."""

    def __init__(self, spec: str | os.PathLike[str]):
        self.db = open_backend(spec)
        self._refused: set[tuple] = set()
        """Kernels found wrong whose results ``record`` refused, by (fingerprint, op, k, sha): said once each."""
        self.path = self.db.where
        """Where the store is, as messages name it (a file path, or the URL without its password)."""
        try:
            self._setup()
        except self.db.errors as exc:
            self.db.close()
            if self.db.name == "sqlite":
                raise SparseRLError(f"{self.path}: not a SparseRL best-known store ({exc})") from None
            raise self._error("cannot set up", exc) from None
        except BaseException:
            self.db.close()
            raise

    @property
    def conn(self):
        """The backend's connection (SQLite's ``sqlite3.Connection``, psycopg's ``Connection``)."""
        return self.db.conn

    @property
    def backend(self) -> str:
        """'sqlite' or 'postgresql'."""
        return self.db.name

    # -- setup -------------------------------------------------------------------------------

    def _setup(self) -> None:
        found = self._schema_version()
        if found is not None and found > SCHEMA_VERSION:
            raise SparseRLError(self._newer(found))
        self.db.prepare()
        if found == SCHEMA_VERSION:
            return
        with self.db.migration_lock():
            found = self._schema_version()  # again, under the lock: another process may have made it
            if found is None:
                ours = {"schema_version", *_TABLES}
                existing = self.db.tables()
                strangers = existing if self.db.name == "sqlite" else existing & ours
                if strangers:
                    what = "an SQLite file" if self.db.name == "sqlite" else "a database"
                    raise SparseRLError(f"{self.path}: {what} that is not a SparseRL best-known store "
                                        f"(tables {sorted(strangers)})")
                ddl = SCHEMA_V1.format(**self.db.types)
                for stmt in filter(str.strip, ddl.split(";")):  # not executescript: it would commit
                    self.db.execute(stmt)
                self.db.execute("INSERT INTO schema_version (version) VALUES (?)", (1,))
                found = created = 1  # a new store: made at version 1 and brought up to date, nothing to report
            else:
                created = 0
            if found > SCHEMA_VERSION:
                raise SparseRLError(self._newer(found))
            for version in range(found + 1, SCHEMA_VERSION + 1):
                for stmt in MIGRATIONS[version]:
                    self.db.execute(stmt)
                self.db.execute("UPDATE schema_version SET version = ?", (version,))
                if not created:
                    log.info("%s: best-known store schema %d -> %d", self.path, version - 1, version)

    def _newer(self, found: int) -> str:
        return (f"{self.path} was written by a newer SparseRL (store schema {found}; this one reads up to "
                f"{SCHEMA_VERSION}): upgrade sparserl or give another --store")

    def _schema_version(self) -> int | None:
        if "schema_version" not in self.db.tables():  # asked first: a failed statement would end a transaction
            return None
        row = self.db.execute("SELECT MAX(version) AS v FROM schema_version").fetchone()
        return int(row["v"]) if row and row["v"] is not None else None

    def _error(self, what: str, exc: BaseException) -> StoreError:
        from sparserl.search.store_backends import _first_line

        cls = StoreUnavailable if self.db.lost(exc) else StoreError
        return cls(f"best-known store {self.path}: {what}: {_first_line(exc)}")

    def _run(self, what: str, fn):
        """``fn()`` with the backend's errors as one line; a lost PostgreSQL connection is opened
        again once and ``fn`` run again (every write here is idempotent)."""
        for attempt in (0, 1):
            try:
                return fn()
            except self.db.errors as exc:
                if attempt == 0 and self.db.lost(exc):
                    log.warning("%s: the connection was lost (%s); connecting again", self.path,
                                str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
                    try:
                        self.db.reconnect()
                    except StoreError as again:
                        raise StoreUnavailable(f"{again} (the connection was lost while {what})") from None
                    continue
                raise self._error(what, exc) from None
        raise AssertionError("unreachable")

    def transaction(self):
        """``with store.transaction():`` one write transaction (on SQLite, the write lock taken at once)."""
        return self.db.transaction()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> BestStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- writes ------------------------------------------------------------------------------

    def add_matrix(self, card, name: str, source_path: str | None = None,
                   coords: tuple[list[int], list[int]] | None = None, features=None) -> None:
        """Remember a matrix (its card, sampled coordinates and structure features) under its
        fingerprint; a known fingerprint keeps its first name and fills in coordinates, features
        or a path it lacked."""
        args = (card.fingerprint, name, card.rows, card.cols, card.nnz, json.dumps(card.to_dict()),
                json.dumps([list(map(int, coords[0])), list(map(int, coords[1]))]) if coords is not None else None,
                source_path, _now(), json.dumps(features.to_dict()) if features is not None else None)

        def write():
            with self.transaction():
                self.db.execute(
                    "INSERT INTO matrices (fingerprint, name, rows, cols, nnz, card_json, coords_json, source_path, "
                    "added_at, features_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (fingerprint) DO "
                    "UPDATE SET coords_json = COALESCE(matrices.coords_json, excluded.coords_json), "
                    "features_json = COALESCE(matrices.features_json, excluded.features_json), "
                    "source_path = COALESCE(excluded.source_path, matrices.source_path)", args)
        self._run("writing a matrix", write)

    def start_run(self, run_id: str, fingerprint: str, op: str, k: int | None, config: dict) -> None:
        args = (run_id, fingerprint, op, _k(k), _now(), json.dumps(config, default=str))

        def write():
            with self.transaction():
                self.db.execute("INSERT INTO runs (run_id, fingerprint, op, k, started_at, status, config_json) "
                                "VALUES (?, ?, ?, ?, ?, 'running', ?) ON CONFLICT (run_id) DO NOTHING", args)
        self._run("starting a run", write)

    def finish_run(self, run_id: str, status: str) -> None:
        def write():
            with self.transaction():
                self.db.execute("UPDATE runs SET finished_at = ?, status = ? WHERE run_id = ?",
                                (_now(), status, run_id))
        self._run("finishing a run", write)

    def record(self, v: VerifiedKernel) -> bool:
        """Write one verified result; returns True when it became the best for its key (strictly
        faster than the best under the same harness version and regime, or the first; against a best
        from another GPU model of the architecture, by speedup over cuSPARSE). :meth:`record_outcome`
        tells the other outcomes apart."""
        return self.record_outcome(v) is Recorded.BEST

    def record_outcome(self, v: VerifiedKernel) -> Recorded:
        """Write one verified result and say what became of it (:class:`Recorded`). A result whose ``uid``
        is in the store already is not written again (``SEEN``), nor is one of a kernel found wrong on its
        matrix (:meth:`retract`; ``REFUSED``, and said once at INFO): the check and the write are one transaction,
        which on PostgreSQL shares the matrix's lock with other recordings and waits for a retraction."""
        sha = kernel_sha(v.text)
        matrix = (v.fingerprint, v.op, _k(v.k))
        key = (*matrix, v.arch, v.regime, v.harness_version)

        def write() -> bool | None:
            with self.transaction():
                db = self.db
                db.key_lock(_matrix_lock(*matrix), shared=True)
                if db.execute(f"SELECT 1 FROM found_wrong WHERE {_MATRIX} AND kernel_sha = ?",
                              (*matrix, sha)).fetchone() is not None:
                    return None
                db.execute("INSERT INTO kernels (kernel_sha, text, format, template, candidate_id) "
                           "VALUES (?, ?, ?, ?, ?) ON CONFLICT (kernel_sha) DO NOTHING",
                           (sha, v.text, v.format, v.template, v.candidate_id))
                row = db.execute(
                    "INSERT INTO results (fingerprint, op, k, arch, gpu, regime, harness_version, kernel_sha, "
                    "time_us, cusparse_us, speedup, roofline, provenance, parent_id, model, run_id, created_at, host, "
                    "uid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (uid) DO NOTHING RETURNING id",
                    (v.fingerprint, v.op, _k(v.k), v.arch, v.gpu, v.regime, v.harness_version, sha, v.time_us,
                     v.cusparse_us, v.speedup, v.roofline, v.provenance, v.parent_id, v.model, v.run_id, _now(),
                     v.host, v.uid)).fetchone()
                if row is None:  # recorded before (a retry, a replayed journal)
                    return Recorded.SEEN
                won = db.execute(
                    "INSERT INTO best (fingerprint, op, k, arch, regime, harness_version, result_id, kernel_sha, "
                    "time_us, cusparse_us, speedup, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (fingerprint, op, k, arch, regime, harness_version) DO UPDATE SET "
                    "result_id = excluded.result_id, kernel_sha = excluded.kernel_sha, time_us = excluded.time_us, "
                    "cusparse_us = excluded.cusparse_us, speedup = excluded.speedup, "
                    "updated_at = excluded.updated_at WHERE CASE WHEN COALESCE((SELECT gpu FROM results WHERE "
                    "results.id = best.result_id), '') = ? THEN excluded.time_us < best.time_us "
                    "ELSE excluded.speedup > best.speedup END RETURNING result_id",
                    (*key, row["id"], sha, v.time_us, v.cusparse_us, v.speedup, _now(), v.gpu or "")).fetchone()
                return Recorded.BEST if won is not None else Recorded.WRITTEN
        outcome = self._run("recording a verified kernel", write)
        if outcome is None:
            if (*matrix, sha) not in self._refused:
                self._refused.add((*matrix, sha))
                log.info("%s: kernel %s (%s) was found wrong on matrix %s %s before: its results there are not "
                         "recorded", self.path, sha[:12], v.candidate_id, v.fingerprint[:12],
                         f"{v.op} k={v.k}" if v.k else v.op)
            return Recorded.REFUSED
        return outcome

    def retract(self, fingerprint: str, op: str, k: int | None, arch: str, regime: str, harness_version: str,
                text: str, reason: str = "found wrong when evaluated again") -> int:
        """Kernel ``text``, verified on a matrix (``fingerprint``, ``op``, ``k``) under ``arch``, ``regime`` and
        ``harness_version``, was found wrong there by a later evaluation (the second look before a kernel is
        handed back, :mod:`sparserl.request.second_look`): remember that (``found_wrong``: when, that key, and
        ``reason``, the first finding kept), and remove its verified results on the matrix under every
        architecture, regime and harness version. In each key it was the best of, the best is chosen again among
        the results left: the fastest where they all come from one GPU model, else the largest speedup over
        cuSPARSE (``record``'s rule, applied to all of them), or the key has none. Returns how many results
        went. Its results on other matrices stay; :meth:`record` refuses its results on this matrix from now on.

        Safe beside other writers: one transaction, which on PostgreSQL holds the matrix alone (a recording for
        it waits, or is waited for and its result seen here); besides, the best rows go first, results that
        another writer has made the best since are kept (its row points at them), and a best is put back only
        where none has been written meanwhile."""
        sha = kernel_sha(text)
        matrix = (fingerprint, op, _k(k))
        in_key = f"{_MATRIX} AND arch = ? AND regime = ? AND harness_version = ?"

        def write() -> int:
            with self.transaction():
                db = self.db
                db.key_lock(_matrix_lock(*matrix))
                db.execute("INSERT INTO kernels (kernel_sha, text) VALUES (?, ?) ON CONFLICT (kernel_sha) DO NOTHING",
                           (sha, text))  # kept, so that a search can tell the text when it is proposed again
                db.execute("INSERT INTO found_wrong (fingerprint, op, k, kernel_sha, arch, regime, harness_version, "
                           "reason, found_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                           "ON CONFLICT (fingerprint, op, k, kernel_sha) DO NOTHING",
                           (*matrix, sha, arch, regime, harness_version, " ".join(reason.split())[:300], _now()))
                was_best = db.execute(f"DELETE FROM best WHERE {_MATRIX} AND kernel_sha = ? "
                                      f"RETURNING arch, regime, harness_version", (*matrix, sha)).fetchall()
                gone = db.execute(f"DELETE FROM results WHERE {_MATRIX} AND kernel_sha = ? AND id NOT IN "
                                  f"(SELECT result_id FROM best WHERE {_MATRIX}) RETURNING id",
                                  (*matrix, sha, *matrix)).fetchall()
                for b in was_best:
                    key = (*matrix, b["arch"], b["regime"], b["harness_version"])
                    rows = db.execute(f"SELECT id, kernel_sha, time_us, cusparse_us, speedup, gpu FROM results "
                                      f"WHERE {in_key} AND kernel_sha NOT IN "
                                      f"(SELECT kernel_sha FROM found_wrong WHERE {_MATRIX}) ORDER BY id",
                                      (*key, *matrix)).fetchall()
                    if rows:
                        one_gpu = len({r["gpu"] or "" for r in rows}) == 1
                        r = (min(rows, key=lambda r: r["time_us"]) if one_gpu
                             else max(rows, key=lambda r: r["speedup"]))
                        db.execute("INSERT INTO best (fingerprint, op, k, arch, regime, harness_version, result_id, "
                                   "kernel_sha, time_us, cusparse_us, speedup, updated_at) "
                                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                                   "ON CONFLICT (fingerprint, op, k, arch, regime, harness_version) DO NOTHING",
                                   (*key, r["id"], r["kernel_sha"], r["time_us"], r["cusparse_us"], r["speedup"],
                                    _now()))
                return len(gone)
        return self._run("retracting a kernel", write)

    # -- reads -------------------------------------------------------------------------------

    def _rows(self, what: str, sql: str, args=()) -> list:
        return self._run(what, lambda: self.db.execute(sql, args).fetchall())

    def best(self, fingerprint: str | None = None, op: str | None = None, k: int | None = None,
             arch: str | None = None, regime: str | None = None,
             harness_version: str | None = None) -> list[BestRow]:
        """Best rows matching the filters given (``k``: None matches any), fastest first per matrix."""
        where, args = _filters("b", fingerprint, op, k, arch, regime, harness_version)
        sql = ("SELECT b.*, m.name, m.rows, m.cols, m.nnz, r.gpu, r.roofline, r.provenance, r.parent_id, r.model, "
               "r.run_id, kn.format, kn.template, kn.candidate_id, kn.text FROM best b "
               "JOIN matrices m ON m.fingerprint = b.fingerprint JOIN results r ON r.id = b.result_id "
               "JOIN kernels kn ON kn.kernel_sha = b.kernel_sha"
               + (" WHERE " + " AND ".join(where) if where else ""))
        rows = [BestRow(
            fingerprint=r["fingerprint"], name=r["name"], rows=r["rows"], cols=r["cols"], nnz=r["nnz"], op=r["op"],
            k=_unk(r["k"]), arch=r["arch"], gpu=r["gpu"], regime=r["regime"], harness_version=r["harness_version"],
            time_us=r["time_us"], cusparse_us=r["cusparse_us"], speedup=r["speedup"], roofline=r["roofline"],
            format=r["format"], template=r["template"], candidate_id=r["candidate_id"], provenance=r["provenance"],
            parent_id=r["parent_id"], model=r["model"], run_id=r["run_id"], updated_at=r["updated_at"],
            kernel_sha=r["kernel_sha"], text=r["text"]) for r in self._rows("reading best kernels", sql, args)]
        # sorted here, not by the database: PostgreSQL orders text by its locale, SQLite by code point
        rows.sort(key=lambda r: (r.name, r.op, r.k or 0, r.arch, r.time_us, r.regime, r.harness_version))
        return rows

    def results(self, fingerprint: str | None = None, op: str | None = None, k: int | None = None,
                arch: str | None = None, regime: str | None = None,
                harness_version: str | None = None) -> list[ResultRow]:
        """Every verified result matching the filters (``fingerprint``: the fingerprint or a prefix), fastest first."""
        where, args = _filters("r", fingerprint, op, k, arch, regime, harness_version)
        sql = ("SELECT r.*, kn.candidate_id, kn.format, kn.template FROM results r "
               "JOIN kernels kn ON kn.kernel_sha = r.kernel_sha"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.time_us, r.id")
        return [ResultRow(id=r["id"], fingerprint=r["fingerprint"], op=r["op"], k=_unk(r["k"]), arch=r["arch"],
                          regime=r["regime"], harness_version=r["harness_version"], time_us=r["time_us"],
                          cusparse_us=r["cusparse_us"], speedup=r["speedup"], candidate_id=r["candidate_id"],
                          format=r["format"], provenance=r["provenance"], run_id=r["run_id"],
                          created_at=r["created_at"], kernel_sha=r["kernel_sha"], parent_id=r["parent_id"],
                          host=r["host"], roofline=r["roofline"], template=r["template"], gpu=r["gpu"])
                for r in self._rows("reading results", sql, args)]

    def kernel_text(self, sha: str) -> str:
        rows = self._rows("reading a kernel", "SELECT text FROM kernels WHERE kernel_sha = ?", (sha,))
        if not rows:
            raise SparseRLError(f"no kernel {sha[:12]} in {self.path}")
        return rows[0]["text"]

    def matrix(self, fingerprint: str) -> MatrixRow | None:
        rows = self._rows("reading a matrix", "SELECT * FROM matrices WHERE fingerprint = ?", (fingerprint,))
        if not rows:
            return None
        r = rows[0]
        coords = json.loads(r["coords_json"]) if r["coords_json"] else None
        return MatrixRow(r["fingerprint"], r["name"], r["rows"], r["cols"], r["nnz"], json.loads(r["card_json"]),
                         (coords[0], coords[1]) if coords else None, r["source_path"],
                         json.loads(r["features_json"]) if r["features_json"] else None)

    def found_wrong_texts(self, fingerprint: str, op: str, k: int | None) -> list[str]:
        """The texts of the kernels found wrong on this matrix (:meth:`retract`, which keeps each text): none of
        them is offered or proposed for it again, nor recorded for it."""
        rows = self._rows("reading kernels found wrong",
                          "SELECT k2.text FROM found_wrong f JOIN kernels k2 ON k2.kernel_sha = f.kernel_sha "
                          "WHERE f.fingerprint = ? AND f.op = ? AND f.k = ?", (fingerprint, op, _k(k)))
        return [r["text"] for r in rows]

    def has_uids(self, uids: list[str]) -> set[str]:
        """Which of ``uids`` are recorded results."""
        out: set[str] = set()
        for i in range(0, len(uids), 500):
            chunk = uids[i:i + 500]
            sql = f"SELECT uid FROM results WHERE uid IN ({', '.join('?' * len(chunk))})"
            out |= {r["uid"] for r in self._rows("reading results", sql, chunk)}
        return out

    def counts(self) -> dict[str, int]:
        """Rows per table."""
        return {t: int(self._rows("counting rows", f"SELECT COUNT(*) AS n FROM {t}")[0]["n"]) for t in _TABLES}


def open_store(spec: str | os.PathLike[str] | None) -> BestStore:
    """The store at ``spec`` (a file path, or a ``postgresql://`` URL), or the default one
    (:func:`default_store_path`)."""
    return BestStore(spec if spec is not None else default_store_path())


def store_exists(spec: str | os.PathLike[str] | None) -> bool:
    """Whether :func:`open_store` would open a store that is there already (a ``postgresql://`` URL always counts:
    the server says), rather than make a new file."""
    if spec is not None and is_url(spec):
        return True
    return Path(spec if spec is not None else default_store_path()).exists()


def describe(row: BestRow | Any) -> str:
    """One line: speedup, times and what the kernel is."""
    what = row.candidate_id or row.template or "free text"
    return (f"{row.speedup:.2f}x ({row.time_us:.2f} us vs cuSPARSE {row.cusparse_us:.2f} us, {row.regime}) "
            f"{what} [{row.provenance}]")
