"""The two databases the best-known store runs on: one SQLite file, or a PostgreSQL server.

:class:`~sparserl.search.store.BestStore` speaks one SQL to both (``?`` placeholders, ``ON
CONFLICT ... DO UPDATE ... WHERE``, ``RETURNING``); a backend supplies what differs:

* connecting, and what a failure to connect says (one line, the password never shown);
* the column types of the schema (``{id}``, ``{bigint}``, ``{real}`` in the DDL);
* a write transaction whose lock is taken at once (SQLite ``BEGIN IMMEDIATE``), the lock
  that serialises schema changes (SQLite: the same; PostgreSQL: an advisory lock), and a lock on
  one matrix that a retraction holds alone and a recording shares (SQLite: the write transaction's
  own lock already; PostgreSQL: an advisory lock of the transaction);
* which of its exceptions mean "the database is gone" (worth one reconnect) and which
  mean anything else went wrong.

PostgreSQL goes through psycopg 3, not SQLAlchemy: the store is two dozen hand-written statements
that already run on both databases, so an SQL toolkit would add a layer without removing any of
the differences that matter here (upsert with a condition, identity columns, advisory locks);
psycopg is the driver SQLAlchemy would use underneath anyway, it ships binary wheels (no
compiler, no libpq to install), and its exception classes tell a lost connection from a bad
statement. It is imported only when a ``postgresql://`` store is opened (the ``farm`` extra).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sqlite3
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from sparserl.errors import SparseRLError

log = logging.getLogger(__name__)

BUSY_TIMEOUT_S = 60.0
"""How long a writer waits for another process's transaction before giving up."""

CONNECT_TIMEOUT_S = 10
"""Seconds to wait for a PostgreSQL server to answer a connection."""

URL_SCHEMES = ("postgresql", "postgres")
"""Store URL schemes understood (anything else with ``://`` is refused)."""

MIGRATION_LOCK = 0x5350_5253  # "SPRS": the advisory lock key that serialises schema changes on PostgreSQL
KEY_LOCKS = 0x5350_4b59  # "SPKY": the first of the two keys of a matrix's advisory lock on PostgreSQL (its own key space)


class StoreError(SparseRLError):
    """The store failed (a statement, a lost connection): one line, nothing half-written."""


class StoreUnavailable(StoreError):
    """The store's database cannot be reached (now or any more)."""


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***`` (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def is_url(spec: str | os.PathLike[str]) -> bool:
    """Whether ``spec`` names a server (``scheme://...``) rather than a file."""
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", os.fspath(spec)) is not None


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split("\n")[0].split()) or type(exc).__name__
    return text[:300]


class SQLiteBackend:
    """One SQLite file: WAL mode (readers never block the writer), ``BEGIN IMMEDIATE`` writes
    (the write lock taken before the current best is read), a busy timeout for concurrent writers."""

    name = "sqlite"
    types = {"id": "INTEGER PRIMARY KEY", "bigint": "INTEGER", "real": "REAL"}

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.where = str(self.path)
        if self.path.exists() and not self.path.is_file():
            raise SparseRLError(f"{self.path}: the best-known store must be a file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                    check_same_thread=False)
        self.conn.row_factory = sqlite3.Row
        try:
            self.conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self.conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            self.conn.close()
            raise SparseRLError(f"{self.path}: not a SparseRL best-known store ({exc})") from None

    def execute(self, sql: str, args=()):
        return self.conn.execute(sql, args)

    def transaction(self):
        return _SQLiteTransaction(self.conn)

    def migration_lock(self):
        """The transaction schema changes run in (``BEGIN IMMEDIATE`` holds the file's write lock)."""
        return self.transaction()

    def key_lock(self, key: str, shared: bool = False) -> None:
        """Nothing to take: the write transaction (``BEGIN IMMEDIATE``) already holds the file alone."""

    def tables(self) -> set[str]:
        return {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def prepare(self) -> None:
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

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        return (sqlite3.Error,)

    def lost(self, exc: BaseException) -> bool:
        return False  # a file does not go away between statements; a disk error is not cured by reopening

    def reconnect(self) -> None:
        raise AssertionError("SQLite stores are never reconnected")

    def close(self) -> None:
        self.conn.close()


class _SQLiteTransaction:
    def __init__(self, conn: sqlite3.Connection):
        self.conn = conn

    def __enter__(self):
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.conn.execute("COMMIT")
        else:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute("ROLLBACK")


class PostgresBackend:
    """A PostgreSQL database (``postgresql://user:password@host:port/dbname``, libpq's URL: any of its
    parameters, ``?sslmode=require`` or ``?options=-csearch_path%3Dteam_a`` for a schema of one's own,
    may follow). Each statement outside a transaction commits by itself; ``record`` runs in one
    transaction whose best-row upsert is a single ``INSERT ... ON CONFLICT DO UPDATE ... WHERE
    faster`` statement, which PostgreSQL makes atomic against concurrent writers of the same key."""

    name = "postgresql"
    types = {"id": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY", "bigint": "BIGINT",
             "real": "DOUBLE PRECISION"}

    def __init__(self, url: str):
        self.url = url
        self.where = redact(url)
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise SparseRLError("a postgresql:// store needs psycopg: pip install 'sparserl[farm]' "
                                "(or psycopg[binary])") from None
        self.conn = self._connect()

    def _connect(self):
        import psycopg
        from psycopg.rows import dict_row

        try:
            conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row, connect_timeout=CONNECT_TIMEOUT_S)
            # Whatever the server's or role's default: a transaction that waited for a matrix's lock (key_lock)
            # must see what the holder committed, which a snapshot taken at its first statement would not.
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            return conn
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"cannot open the best-known store {self.where}: {_first_line(exc)}") from None
        except psycopg.ProgrammingError as exc:  # a URL libpq cannot parse
            raise SparseRLError(f"not a usable PostgreSQL URL {self.where}: {_first_line(exc)}") from None

    def execute(self, sql: str, args=()):
        return self.conn.execute(sql.replace("?", "%s"), tuple(args))

    def transaction(self):
        return self.conn.transaction()

    @contextlib.contextmanager
    def migration_lock(self):
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            yield self.conn

    def key_lock(self, key: str, shared: bool = False) -> None:
        """Lock ``key`` (a matrix's) until the transaction ends: alone, or ``shared`` with others that share it.
        Taken first in a transaction (nothing else locked yet, so no two writers wait on each other); keys
        are hashed to 32 bits, and two that collide only wait for each other."""
        h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big", signed=True)
        fn = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
        self.conn.execute(f"SELECT {fn}(%s, %s)", (KEY_LOCKS, h))

    def tables(self) -> set[str]:
        rows = self.conn.execute("SELECT table_name FROM information_schema.tables "
                                 "WHERE table_schema = current_schema()").fetchall()
        return {r["table_name"] for r in rows}

    def prepare(self) -> None:
        pass

    @property
    def errors(self) -> tuple[type[BaseException], ...]:
        import psycopg

        return (psycopg.Error,)

    def lost(self, exc: BaseException) -> bool:
        import psycopg

        return isinstance(exc, psycopg.OperationalError) or self.conn.closed

    def reconnect(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()
        self.conn = self._connect()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.conn.close()


def open_backend(spec: str | Path):
    """The backend of a store spec: a ``postgresql://`` URL, or a file path (SQLite)."""
    text = str(spec)
    if isinstance(spec, str) and is_url(text):
        scheme = text.split("://", 1)[0].lower()
        if scheme not in URL_SCHEMES:
            raise SparseRLError(f"unsupported best-known store URL scheme {scheme!r} in {redact(text)}: give a file "
                                "path (SQLite) or postgresql://user@host/dbname")
        return PostgresBackend(text)
    return SQLiteBackend(spec)
