"""The best-known store: the fastest verified kernel per (matrix structure, op, k, GPU architecture).

A search (and ``generate --search``) writes every *verified* candidate here as soon as its
result arrives, so an interrupted search loses nothing it had verified; only kernels the
harness verified and timed on a GPU ever enter. Compile-only results never do.

Embedded default: one SQLite file (stdlib :mod:`sqlite3`), in WAL mode so readers do not block
the writer, every write in a ``BEGIN IMMEDIATE`` transaction (the write lock is taken before
the current best is read, so two searches writing at once cannot both "win" the same key), and
a busy timeout so concurrent writers wait for each other instead of failing. The schema uses
plain tables and explicit types (INTEGER, REAL, TEXT; timestamps as ISO-8601 UTC text; JSON as
text) so a server database could take it unchanged, ``id INTEGER PRIMARY KEY`` becoming an
identity column.

Tables (``SCHEMA_VERSION`` 2):

* ``schema_version(version)``: one row. A store written by a newer SparseRL is refused.
* ``matrices``: one row per structure fingerprint: name, shape, nnz, the matrix card (JSON),
  up to :data:`COORDS` sampled nonzero coordinates (JSON, as the SFT data carries them) and the
  file it was loaded from, so ``export`` can rebuild the model's prompt; and the structure
  features (:class:`~sparserl.matrices.features.MatrixFeatures`, JSON), which the cost model
  learns from beside the card.
* ``kernels``: completion texts by SHA-256, with their format, template and candidate id.
* ``results``: every verified candidate's times (kernel, cuSPARSE, speedup, roofline), regime,
  harness version, GPU, provenance (how the search proposed it, its parent, the model) and run.
* ``best``: per (fingerprint, op, k, arch, regime, harness_version), the fastest result. A new
  result replaces it only when strictly faster; times under another harness version or regime
  are never compared (they are other keys). ``k`` is 0 for SpMV (a key column is never NULL).
* ``runs``: one row per search: when, what, its configuration, how it ended.

Migrations run on open, under the write lock, one version at a time: version 1 to 2 adds the
nullable ``matrices.features_json`` column (rows written before it keep NULL until a search
records the matrix again). Nothing is rewritten or dropped, so a migrated store keeps every
result; only an older SparseRL then refuses it as newer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from sparserl.errors import SparseRLError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 2
"""Version of the tables below; a store with a larger version was written by a newer SparseRL."""

COORDS = 1024
"""Sampled nonzero coordinates kept per matrix (the SFT data's default ``coords``)."""

BUSY_TIMEOUT_S = 60.0
"""How long a writer waits for another process's transaction before giving up."""

STORE_FILE = "best_known.sqlite"
"""File name of the default store under the harness cache root."""


def harness_version() -> str:
    """The harness version this process records results under (``sparserl.harness.result.HARNESS_VERSION``)."""
    from sparserl.harness.result import HARNESS_VERSION

    return str(HARNESS_VERSION)


def default_store_path() -> Path:
    """``<harness cache root>/best_known.sqlite`` (root: $SPARSERL_CACHE_DIR or ~/.cache/sparserl)."""
    from sparserl.harness.evaluator import HarnessConfig

    return HarnessConfig().root / STORE_FILE


def kernel_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS matrices (
    fingerprint TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    rows INTEGER NOT NULL,
    cols INTEGER NOT NULL,
    nnz INTEGER NOT NULL,
    card_json TEXT NOT NULL,
    coords_json TEXT,
    source_path TEXT,
    added_at TEXT NOT NULL,
    features_json TEXT
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
    id INTEGER PRIMARY KEY,
    fingerprint TEXT NOT NULL REFERENCES matrices(fingerprint),
    op TEXT NOT NULL,
    k INTEGER NOT NULL,
    arch TEXT NOT NULL,
    gpu TEXT,
    regime TEXT NOT NULL,
    harness_version TEXT NOT NULL,
    kernel_sha TEXT NOT NULL REFERENCES kernels(kernel_sha),
    time_us REAL NOT NULL,
    cusparse_us REAL NOT NULL,
    speedup REAL NOT NULL,
    roofline REAL,
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
    result_id INTEGER NOT NULL REFERENCES results(id),
    kernel_sha TEXT NOT NULL REFERENCES kernels(kernel_sha),
    time_us REAL NOT NULL,
    cusparse_us REAL NOT NULL,
    speedup REAL NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (fingerprint, op, k, arch, regime, harness_version)
);
"""

_TABLES = ("schema_version", "matrices", "kernels", "runs", "results", "best")


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
    """The structure features (``MatrixFeatures.to_dict()``); None for a matrix recorded before schema 2."""


def _k(k: int | None) -> int:
    return int(k) if k else 0


def _unk(k: int) -> int | None:
    return k or None


def _filters(table: str, fingerprint: str | None, op: str | None, k: int | None, arch: str | None,
             regime: str | None, harness_version: str | None) -> tuple[list[str], list]:
    """SQL conditions and their arguments for the filters given, on ``table``'s columns
    (``fingerprint``: the fingerprint or a prefix of it, taken literally; ``k``: None matches any)."""
    where: list[str] = []
    args: list = []
    for col, val in (("op", op), ("arch", arch), ("regime", regime), ("harness_version", harness_version)):
        if val is not None:
            where.append(f"{table}.{col} = ?")
            args.append(val)
    if fingerprint is not None:
        where.append(f"substr({table}.fingerprint, 1, ?) = ?")
        args += [len(fingerprint), fingerprint]
    if k is not None:
        where.append(f"{table}.k = ?")
        args.append(_k(k))
    return where, args


class BestStore:
    """The best-known store in one SQLite file (see the module docstring).

    One connection per instance; use one instance per thread or process."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if self.path.exists() and not self.path.is_file():
            raise SparseRLError(f"{self.path}: the best-known store must be a file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        try:
            self._setup()
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise SparseRLError(f"{self.path}: not a SparseRL best-known store ({exc})") from None
        except BaseException:
            self.conn.close()
            raise

    # -- setup -------------------------------------------------------------------------------

    def _setup(self) -> None:
        c = self.conn
        c.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        c.execute("PRAGMA foreign_keys = ON")
        found = self._schema_version()
        if found is not None and found > SCHEMA_VERSION:
            raise SparseRLError(f"{self.path} was written by a newer SparseRL (store schema {found}; this one reads "
                                f"up to {SCHEMA_VERSION}): upgrade sparserl or give another --store")
        self._wal()
        if found == SCHEMA_VERSION:
            return
        with self.transaction():
            found = self._schema_version()  # again, under the write lock: another process may have made it
            if found is None:
                existing = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if existing:
                    raise SparseRLError(f"{self.path}: an SQLite file that is not a SparseRL best-known store "
                                        f"(tables {sorted(existing)})")
                for stmt in filter(str.strip, _SCHEMA.split(";")):  # not executescript: it would commit
                    c.execute(stmt)
                c.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            elif found > SCHEMA_VERSION:
                raise SparseRLError(f"{self.path} was written by a newer SparseRL (store schema {found})")
            else:
                for version in range(found, SCHEMA_VERSION):
                    _MIGRATIONS[version](c)
                    log.info("%s: best-known store migrated from schema %d to %d", self.path, version, version + 1)
                c.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION,))

    def _schema_version(self) -> int | None:
        try:
            row = self.conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise
        return int(row[0]) if row and row[0] is not None else None

    def _wal(self) -> None:
        """WAL mode (persistent in the file). Switching needs a moment alone with the file,
        which the busy handler does not always wait for: retry for the busy timeout."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                mode = self.conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if mode.lower() != "wal":
                    log.warning("%s: SQLite refused WAL mode (%s); concurrent searches will wait longer",
                                self.path, mode)
                self.conn.execute("PRAGMA synchronous = NORMAL")  # WAL + NORMAL: a killed process loses no commit
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def transaction(self):
        """``with store.transaction():`` one write transaction, the write lock taken at once."""
        return _Transaction(self.conn)

    def close(self) -> None:
        self.conn.close()

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
        with self.transaction():
            self.conn.execute(
                "INSERT INTO matrices (fingerprint, name, rows, cols, nnz, card_json, coords_json, source_path, "
                "added_at, features_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (fingerprint) DO UPDATE "
                "SET coords_json = COALESCE(matrices.coords_json, excluded.coords_json), "
                "features_json = COALESCE(matrices.features_json, excluded.features_json), "
                "source_path = COALESCE(excluded.source_path, matrices.source_path)",
                (card.fingerprint, name, card.rows, card.cols, card.nnz, json.dumps(card.to_dict()),
                 json.dumps([list(map(int, coords[0])), list(map(int, coords[1]))]) if coords is not None else None,
                 source_path, _now(), json.dumps(features.to_dict()) if features is not None else None))

    def start_run(self, run_id: str, fingerprint: str, op: str, k: int | None, config: dict) -> None:
        with self.transaction():
            self.conn.execute("INSERT INTO runs (run_id, fingerprint, op, k, started_at, status, config_json) "
                              "VALUES (?, ?, ?, ?, ?, 'running', ?)",
                              (run_id, fingerprint, op, _k(k), _now(), json.dumps(config, default=str)))

    def finish_run(self, run_id: str, status: str) -> None:
        with self.transaction():
            self.conn.execute("UPDATE runs SET finished_at = ?, status = ? WHERE run_id = ?", (_now(), status, run_id))

    def record(self, v: VerifiedKernel) -> bool:
        """Write one verified result; returns True when it became the best for its key (strictly
        faster than the best under the same harness version and regime, or the first)."""
        sha = kernel_sha(v.text)
        with self.transaction():
            c = self.conn
            c.execute("INSERT INTO kernels (kernel_sha, text, format, template, candidate_id) VALUES (?, ?, ?, ?, ?) "
                      "ON CONFLICT (kernel_sha) DO NOTHING", (sha, v.text, v.format, v.template, v.candidate_id))
            cur = c.execute(
                "INSERT INTO results (fingerprint, op, k, arch, gpu, regime, harness_version, kernel_sha, time_us, "
                "cusparse_us, speedup, roofline, provenance, parent_id, model, run_id, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (v.fingerprint, v.op, _k(v.k), v.arch, v.gpu, v.regime, v.harness_version, sha, v.time_us,
                 v.cusparse_us, v.speedup, v.roofline, v.provenance, v.parent_id, v.model, v.run_id, _now()))
            rid = cur.lastrowid
            key = (v.fingerprint, v.op, _k(v.k), v.arch, v.regime, v.harness_version)
            old = c.execute("SELECT time_us FROM best WHERE fingerprint = ? AND op = ? AND k = ? AND arch = ? "
                            "AND regime = ? AND harness_version = ?", key).fetchone()
            if old is not None and not v.time_us < old["time_us"]:
                return False
            c.execute("INSERT INTO best (fingerprint, op, k, arch, regime, harness_version, result_id, kernel_sha, "
                      "time_us, cusparse_us, speedup, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                      "ON CONFLICT (fingerprint, op, k, arch, regime, harness_version) DO UPDATE SET "
                      "result_id = excluded.result_id, kernel_sha = excluded.kernel_sha, time_us = excluded.time_us, "
                      "cusparse_us = excluded.cusparse_us, speedup = excluded.speedup, "
                      "updated_at = excluded.updated_at",
                      (*key, rid, sha, v.time_us, v.cusparse_us, v.speedup, _now()))
            return True

    # -- reads -------------------------------------------------------------------------------

    def best(self, fingerprint: str | None = None, op: str | None = None, k: int | None = None,
             arch: str | None = None, regime: str | None = None,
             harness_version: str | None = None) -> list[BestRow]:
        """Best rows matching the filters given (``k``: None matches any), fastest first per matrix."""
        where, args = _filters("b", fingerprint, op, k, arch, regime, harness_version)
        sql = ("SELECT b.*, m.name, m.rows, m.cols, m.nnz, r.gpu, r.roofline, r.provenance, r.parent_id, r.model, "
               "r.run_id, kn.format, kn.template, kn.candidate_id, kn.text FROM best b "
               "JOIN matrices m ON m.fingerprint = b.fingerprint JOIN results r ON r.id = b.result_id "
               "JOIN kernels kn ON kn.kernel_sha = b.kernel_sha"
               + (" WHERE " + " AND ".join(where) if where else "")
               + " ORDER BY m.name, b.op, b.k, b.arch, b.time_us")
        return [BestRow(
            fingerprint=r["fingerprint"], name=r["name"], rows=r["rows"], cols=r["cols"], nnz=r["nnz"], op=r["op"],
            k=_unk(r["k"]), arch=r["arch"], gpu=r["gpu"], regime=r["regime"], harness_version=r["harness_version"],
            time_us=r["time_us"], cusparse_us=r["cusparse_us"], speedup=r["speedup"], roofline=r["roofline"],
            format=r["format"], template=r["template"], candidate_id=r["candidate_id"], provenance=r["provenance"],
            parent_id=r["parent_id"], model=r["model"], run_id=r["run_id"], updated_at=r["updated_at"],
            kernel_sha=r["kernel_sha"], text=r["text"]) for r in self.conn.execute(sql, args)]

    def results(self, fingerprint: str | None = None, op: str | None = None, k: int | None = None,
                arch: str | None = None, regime: str | None = None,
                harness_version: str | None = None) -> list[ResultRow]:
        """Every verified result matching the filters (``fingerprint``: the fingerprint or a prefix), fastest first."""
        where, args = _filters("r", fingerprint, op, k, arch, regime, harness_version)
        sql = ("SELECT r.*, kn.candidate_id, kn.format FROM results r JOIN kernels kn ON kn.kernel_sha = r.kernel_sha"
               + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY r.time_us")
        return [ResultRow(id=r["id"], fingerprint=r["fingerprint"], op=r["op"], k=_unk(r["k"]), arch=r["arch"],
                          regime=r["regime"], harness_version=r["harness_version"], time_us=r["time_us"],
                          cusparse_us=r["cusparse_us"], speedup=r["speedup"], candidate_id=r["candidate_id"],
                          format=r["format"], provenance=r["provenance"], run_id=r["run_id"],
                          created_at=r["created_at"], kernel_sha=r["kernel_sha"], parent_id=r["parent_id"])
                for r in self.conn.execute(sql, args)]

    def kernel_text(self, sha: str) -> str:
        row = self.conn.execute("SELECT text FROM kernels WHERE kernel_sha = ?", (sha,)).fetchone()
        if row is None:
            raise SparseRLError(f"no kernel {sha[:12]} in {self.path}")
        return row["text"]

    def matrix(self, fingerprint: str) -> MatrixRow | None:
        r = self.conn.execute("SELECT * FROM matrices WHERE fingerprint = ?", (fingerprint,)).fetchone()
        if r is None:
            return None
        coords = json.loads(r["coords_json"]) if r["coords_json"] else None
        return MatrixRow(r["fingerprint"], r["name"], r["rows"], r["cols"], r["nnz"], json.loads(r["card_json"]),
                         (coords[0], coords[1]) if coords else None, r["source_path"],
                         json.loads(r["features_json"]) if r["features_json"] else None)

    def counts(self) -> dict[str, int]:
        """Rows per table."""
        return {t: int(self.conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in _TABLES}


def _add_features_column(c: sqlite3.Connection) -> None:
    """Schema 1 to 2: ``matrices.features_json`` (nullable: earlier rows have no features)."""
    c.execute("ALTER TABLE matrices ADD COLUMN features_json TEXT")


_MIGRATIONS = {1: _add_features_column}
"""Per schema version, the step that takes a store from it to the next (run in one transaction)."""


class _Transaction:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        else:
            self.conn.execute("ROLLBACK")


def open_store(path: str | os.PathLike[str] | None) -> BestStore:
    """The store at ``path``, or the default one (:func:`default_store_path`)."""
    return BestStore(path if path is not None else default_store_path())


def describe(row: BestRow | Any) -> str:
    """One line: speedup, times and what the kernel is."""
    what = row.candidate_id or row.template or "free text"
    return (f"{row.speedup:.2f}x ({row.time_us:.2f} us vs cuSPARSE {row.cusparse_us:.2f} us, {row.regime}) "
            f"{what} [{row.provenance}]")
