"""The database's schema version: Alembic migrations (bot/adapters/store/alembic/versions), checked at every
start and run by `gpubot db upgrade`.

A database at the newest revision (the `alembic_version` table Alembic keeps) costs one SELECT at start and no
Alembic import. An empty database gets the models' tables and is stamped with the newest revision, as Alembic's
cookbook builds an up-to-date database from scratch (tests/unit/test_migrations.py checks that this equals running
every migration, and equals an upgraded database of gpubot 0.1.0). Anything else (a database made before
migrations, or at an older revision) is upgraded by Alembic. Two bots that start at once on one PostgreSQL
database take turns through an advisory lock, so neither creates a table the other is creating.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table, inspect, select
from sqlalchemy.engine import Connection, Engine

#: Alembic's script directory (env.py, versions/); a revision's file is named `<revision>_<slug>.py`.
SCRIPTS = Path(__file__).with_name("alembic")
#: The newest revision: the schema of this release's models (a test checks it is Alembic's head).
HEAD = "0006"
#: PostgreSQL advisory lock key taken while a schema is created or upgraded ("gpub" in ASCII).
SCHEMA_LOCK_KEY = 0x67707562

_VERSION = Table("alembic_version", MetaData(), Column("version_num", String(32), nullable=False),
                 PrimaryKeyConstraint("version_num", name="alembic_version_pkc"))


class SchemaError(Exception):
    """The database's schema cannot be used by this gpubot: made by a newer release, or an upgrade failed."""


def known_revisions() -> frozenset[str]:
    """Revisions this release has scripts for (from the file names, without importing Alembic)."""
    return frozenset(p.name.split("_", 1)[0] for p in (SCRIPTS / "versions").glob("*_*.py"))


def current_revision(conn: Connection) -> str | None:
    """The revision recorded in the database, or None for a database without a version table (empty, or made
    before migrations). Raises sqlalchemy errors."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(select(_VERSION.c.version_num)).scalar()


def ensure_schema(engine: Engine, metadata: MetaData) -> tuple[str | None, str] | None:
    """Check the schema at start and bring it to HEAD. Returns None when it was already there, else
    (revision before, HEAD). Raises SchemaError (a newer release's database; an upgrade Alembic refused) and
    sqlalchemy errors."""
    with engine.connect() as conn:
        if current_revision(conn) == HEAD:
            return None
    return upgrade(engine, metadata)


def upgrade(engine: Engine, metadata: MetaData | None = None) -> tuple[str | None, str]:
    """Bring the database to HEAD, under the schema lock. Returns (revision before, HEAD); the revision before is
    None for an empty database or one made before migrations. Raises SchemaError and sqlalchemy errors."""
    with engine.connect() as conn, _schema_lock(conn):
        before = current_revision(conn)
        if before == HEAD:
            return before, HEAD
        if before is not None and before not in known_revisions():
            raise SchemaError(f"the database is at schema revision {before!r}, which this gpubot does not know "
                              f"(its newest is {HEAD!r}): it was made by a newer gpubot; run that one")
        if before is None and metadata is not None and not inspect(conn).get_table_names():
            metadata.create_all(conn)  # the models are HEAD's schema (tested against the migrations)
            _VERSION.create(conn)
            conn.execute(_VERSION.insert().values(version_num=HEAD))
            conn.commit()
        else:
            conn.commit()
            _run_alembic(conn)
    return before, HEAD


def _run_alembic(conn: Connection) -> None:
    """`alembic upgrade head` on `conn` (SQLite's foreign keys off meanwhile: batch mode copies tables)."""
    from alembic import command
    from alembic.config import Config
    from alembic.util import CommandError

    sqlite = conn.dialect.name == "sqlite"
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    cfg.attributes["connection"] = conn
    if sqlite:
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        conn.commit()
    try:
        command.upgrade(cfg, "head")
        conn.commit()
    except CommandError as e:
        raise SchemaError(f"the schema upgrade failed: {e}") from e
    finally:
        if sqlite:
            conn.rollback()
            conn.exec_driver_sql("PRAGMA foreign_keys=ON")
            conn.commit()


@contextlib.contextmanager
def _schema_lock(conn: Connection) -> Iterator[None]:
    """PostgreSQL: a session advisory lock, so that one bot at a time creates or upgrades the schema (the other
    waits, then finds it done). Other databases: nothing (SQLite has one bot per file: bot.adapters.statelock)."""
    if conn.dialect.name != "postgresql":
        yield
        return
    conn.exec_driver_sql(f"SELECT pg_advisory_lock({SCHEMA_LOCK_KEY})")
    conn.commit()
    try:
        yield
    finally:
        conn.rollback()
        conn.exec_driver_sql(f"SELECT pg_advisory_unlock({SCHEMA_LOCK_KEY})")
        conn.commit()
