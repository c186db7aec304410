"""A real PostgreSQL server for the tests: a temporary cluster made with the server's own
``initdb``, on a free port, password-authenticated over TCP, stopped at the end of the session.

The binaries are Debian's (``apt-get install postgresql``: ``/usr/lib/postgresql/*/bin``) or any
``initdb``/``pg_ctl`` on the PATH; without them the tests that need a server are skipped, saying
so. PostgreSQL refuses to run as root: as root the cluster is made and run as the ``postgres``
user the package creates. ``$SPARSERL_TEST_POSTGRES`` (a superuser's URL) uses a server already
running instead.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from sparserl.farm.local_cluster import free_port

USER = "sparserl"
PASSWORD = "farm-test-secret"


def server_binaries() -> Path | None:
    """The folder of initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4])
                   if p.split("/")[4].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb and shutil.which("pg_ctl") else None


@dataclass
class PgServer:
    """A running server: ``url(db)`` names one of its databases as the superuser."""

    host: str
    port: int
    user: str
    password: str
    data: Path | None = None
    bindir: Path | None = None
    owner: str | None = None

    def url(self, db: str = "postgres", password: str | None = None) -> str:
        return f"postgresql://{self.user}:{password or self.password}@{self.host}:{self.port}/{db}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def drop_database(self, url: str) -> None:
        """Drop the database of ``url`` at once, its connections cut (a database that vanishes)."""
        import psycopg

        name = urlsplit(url).path.lstrip("/")
        with psycopg.connect(self.url(), autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def _as_owner(self):
        if self.owner is None:
            return None
        pw = pwd.getpwnam(self.owner)

        def demote() -> None:
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
        return demote

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bindir / args[0]), *args[1:]], capture_output=True, text=True, timeout=120,
                              preexec_fn=self._as_owner(), cwd="/")

    @classmethod
    def start(cls) -> PgServer:
        bindir = server_binaries()
        if bindir is None:
            pytest.skip("PostgreSQL server binaries not found (initdb, pg_ctl): on Debian, apt-get install postgresql")
        owner = None
        if os.geteuid() == 0:  # initdb and postgres refuse root
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                pytest.skip("running as root without a 'postgres' user to run a PostgreSQL server as")
            owner = "postgres"
        root = Path(tempfile.mkdtemp(prefix="sparserl-pg-"))
        root.chmod(0o755)
        data, sock = root / "data", root / "sock"
        pwfile = root / "pw"
        pwfile.write_text(PASSWORD + "\n")
        sock.mkdir()
        if owner is not None:
            pw = pwd.getpwnam(owner)
            for p in (root, sock, pwfile):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        srv = cls("127.0.0.1", free_port(), USER, PASSWORD, data, bindir, owner)
        out = srv._run("initdb", "-D", str(data), "-U", USER, f"--pwfile={pwfile}", "--auth-local=trust",
                       "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        if out.returncode != 0:
            shutil.rmtree(root, ignore_errors=True)
            pytest.fail(f"initdb failed: {out.stderr[-1500:]}")
        opts = (f"-p {srv.port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB")
        out = srv._run("pg_ctl", "-D", str(data), "-o", opts, "-l", str(root / "log"), "-w", "-t", "60", "start")
        if out.returncode != 0:
            log = (root / "log").read_text()[-1500:] if (root / "log").exists() else ""
            shutil.rmtree(root, ignore_errors=True)
            pytest.fail(f"PostgreSQL did not start: {out.stderr[-800:]} {log}")
        return srv

    def stop(self) -> None:
        if self.data is None:
            return
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.data.parent, ignore_errors=True)


def _from_env(url: str) -> PgServer:
    p = urlsplit(url)
    return PgServer(p.hostname or "127.0.0.1", p.port or 5432, p.username or "postgres", p.password or "")


@pytest.fixture(scope="session")
def postgres_server():
    """One PostgreSQL server for the whole test session (see the module docstring)."""
    pytest.importorskip("psycopg", reason="the postgresql store needs psycopg: pip install -e '.[farm]'")
    url = os.environ.get("SPARSERL_TEST_POSTGRES")
    if url:
        yield _from_env(url)
        return
    srv = PgServer.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def pg_url(postgres_server) -> str:
    """The URL of a fresh database on the session's server."""
    url = postgres_server.new_database()
    yield url
    postgres_server.drop_database(url)


def without_password(url: str) -> str:
    p = urlsplit(url)
    return urlunsplit(p._replace(netloc=p.netloc.split("@", 1)[1] if "@" in p.netloc else p.netloc))
