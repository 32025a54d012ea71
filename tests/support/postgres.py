"""A throwaway PostgreSQL cluster for tests: `initdb` in a temporary directory, `postgres` on a free loopback port
(trust authentication, no socket outside the directory), stopped and removed by the fixture's finalizer.

The binaries come from the distribution's package (`postgresql`: /usr/lib/postgresql/N/bin) or PATH. PostgreSQL
refuses to run as root, so as root the cluster runs as the `postgres` user the package creates (or `nobody`).
Tests that need it skip with the reason when the binaries, the driver (psycopg) or such a user are missing.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.procs import free_port


def _bindir() -> Path | None:
    """The directory of `initdb` and `pg_ctl`: the newest /usr/lib/postgresql/N/bin, else PATH's."""
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]) if
                  d.split("/")[-2].isdigit() else 0)
    for d in reversed(dirs):
        if os.access(f"{d}/initdb", os.X_OK) and os.access(f"{d}/pg_ctl", os.X_OK):
            return Path(d)
    initdb = shutil.which("initdb")
    return Path(os.path.realpath(initdb)).parent if initdb else None


def unavailable() -> str | None:
    """Why no cluster can be started here (None when one can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg (the PostgreSQL driver, gpubot[postgres]) is not installed"
    if _bindir() is None:
        return "PostgreSQL is not installed (apt-get install postgresql)"
    if os.geteuid() == 0 and _run_as() is None:
        return "running as root and there is no `postgres` or `nobody` user to run PostgreSQL as"
    return None


def _run_as() -> pwd.struct_passwd | None:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    return None


@dataclass
class PostgresCluster:
    """A running cluster; `new_database()` gives each test a database of its own."""

    root: Path
    port: int
    user: pwd.struct_passwd | None
    bindir: Path
    databases: list[str] = field(default_factory=list)

    def url(self, database: str = "postgres") -> str:
        """SQLAlchemy URL of `database` (psycopg 3, TCP on loopback, the superuser `gpubot`)."""
        return f"postgresql+psycopg://gpubot@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """Create an empty database and return its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=gpubot dbname=postgres",
                             autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        self.databases.append(name)
        return self.url(name)

    def _as_owner(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        def demote() -> None:
            if self.user is not None:
                os.setgid(self.user.pw_gid)
                os.setuid(self.user.pw_uid)
        return subprocess.run(argv, preexec_fn=demote if self.user else None, capture_output=True, text=True,
                              timeout=120, **kw)

    def restart(self) -> None:
        """Stop the server (fast shutdown: every connection is cut) and start it again on the same port."""
        self._ctl("stop", "-m", "fast")
        self._ctl("start")

    def _ctl(self, *args: str) -> None:
        data = self.root / "data"
        r = self._as_owner([str(self.bindir / "pg_ctl"), "-D", str(data), "-w", "-t", "60", "-l",
                            str(self.root / "server.log"), *args])
        if r.returncode != 0:
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed: {r.stdout}{r.stderr}"
                               f"{(self.root / 'server.log').read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        """Stop the server (immediate) and remove its directory."""
        self._as_owner([str(self.bindir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate", "-w",
                        "stop"])
        shutil.rmtree(self.root, ignore_errors=True)


def start_cluster() -> PostgresCluster:
    """initdb + start on a free loopback port. Raises RuntimeError with the server's log when it fails."""
    bindir = _bindir()
    assert bindir is not None
    user = _run_as() if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="gpubot-pg-"))
    if user is not None:
        os.chown(root, user.pw_uid, user.pw_gid)
    cluster = PostgresCluster(root=root, port=free_port(), user=user, bindir=bindir)
    r = cluster._as_owner([str(bindir / "initdb"), "-D", str(root / "data"), "-U", "gpubot", "-A", "trust",
                           "-E", "UTF8", "--no-sync"])
    if r.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"initdb failed: {r.stdout}{r.stderr}")
    with open(root / "data" / "postgresql.conf", "a") as f:
        f.write(f"\nlisten_addresses = '127.0.0.1'\nport = {cluster.port}\nunix_socket_directories = '{root}'\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n")
    for _ in range(3):  # the free port may be taken between free_port() and the server's bind
        try:
            cluster._ctl("start")
            return cluster
        except RuntimeError:
            cluster.port = free_port()
            with open(root / "data" / "postgresql.conf", "a") as f:
                f.write(f"\nport = {cluster.port}\n")
    cluster._ctl("start")
    return cluster
