"""The schema's versions (issue 26): Alembic migrations on SQLite and PostgreSQL, the upgrade of a database made
by gpubot 0.1.0 (before migrations) or older, the check at start, and two bots creating one schema at once."""

from __future__ import annotations

import functools
import importlib.util
import sqlite3
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from bot.adapters.store import DatabaseUnavailable, Store, migrate
from bot.adapters.store.db import Base
from tests.support.procs import wait_until

FIXTURES = Path(__file__).parent.parent / "fixtures" / "db"


def _baseline():
    spec = importlib.util.spec_from_file_location("gpubot_baseline", migrate.SCRIPTS / "versions" / "0001_baseline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def schema_of(url: str) -> dict:
    """Every table's columns (type, NOT NULL, server default), indexes, primary key and foreign keys."""
    engine = sa.create_engine(url)
    try:
        insp = sa.inspect(engine)
        out = {}
        for t in sorted(insp.get_table_names()):
            out[t] = {
                "columns": {c["name"]: (str(c["type"]), c["nullable"], c.get("default")) for c in insp.get_columns(t)},
                "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"])) for i in
                                  insp.get_indexes(t)),
                "pk": insp.get_pk_constraint(t)["constrained_columns"],
                "fks": sorted((tuple(f["constrained_columns"]), f["referred_table"], tuple(f["referred_columns"]))
                              for f in insp.get_foreign_keys(t)),
            }
        return out
    finally:
        engine.dispose()


def revision_of(url: str) -> str | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return migrate.current_revision(c)
    finally:
        engine.dispose()


def second_url(db_url: str, request) -> str:
    """Another empty database of the same kind as `db_url`."""
    if db_url.startswith("sqlite"):
        return db_url.replace("gpubot.db", "other.db")
    return request.getfixturevalue("postgres_cluster").new_database()


#: Columns that gpubot releases before 0.1.0 added with `ALTER TABLE ... ADD COLUMN` (nullable, with a DEFAULT).
LATER_COLUMNS = {"launches": {"tag": "''", "unit": None, "sealed_secrets": None},
                 "outbox": {"needs_lookup": "0", "user_id": None}}


def make_older(url: str, *, upgraded_by_old_release: bool) -> None:
    """A database of a release older than 0.1.0: without LATER_COLUMNS (and so without ix_launches_tag), one row
    per table; `upgraded_by_old_release` then adds them the way 0.1.0's start did (nullable, with a DEFAULT)."""
    base = _baseline()._tables()
    old = sa.MetaData()
    for t in base.sorted_tables:
        copy = t.to_metadata(old)
        for name in LATER_COLUMNS.get(t.name, {}):
            copy.indexes = {i for i in copy.indexes if name not in i.columns}
            copy._columns.remove(copy.c[name])
    engine = sa.create_engine(url)
    with engine.begin() as c:
        old.create_all(c)
        c.execute(old.tables["launches"].insert().values(host="gpu-host-1", variant="base", params_json="{}",
                                                          command="sleep 1", gpus_json="[0]", state="running",
                                                          created_by="U1", created_at=1.0))
        c.execute(old.tables["outbox"].insert().values(channel="C1", kind="post", text="hello", key="k",
                                                        state="pending", attempts=0, next_at=0.0, created_at=1.0))
        if upgraded_by_old_release:
            for table, cols in LATER_COLUMNS.items():
                for name, default in cols.items():
                    col = base.tables[table].c[name]
                    ddl = col.type.compile(dialect=engine.dialect)
                    clause = f" DEFAULT {default}" if default else ""
                    c.exec_driver_sql(f'ALTER TABLE "{table}" ADD COLUMN "{name}" {ddl}{clause}')
    engine.dispose()


def test_head_is_alembics_head_and_every_script_is_named_by_its_revision():
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(migrate.SCRIPTS))
    scripts = ScriptDirectory.from_config(cfg)
    assert scripts.get_heads() == [migrate.HEAD]
    assert {s.revision for s in scripts.walk_revisions()} == migrate.known_revisions()
    for s in scripts.walk_revisions():
        assert Path(s.path).name.startswith(f"{s.revision}_"), s.path


def test_a_fresh_database_from_the_models_equals_one_built_by_every_migration(db_url, request):
    Store(db_url).close()
    by_migrations = second_url(db_url, request)
    engine = sa.create_engine(by_migrations)
    assert migrate.upgrade(engine) == (None, migrate.HEAD)  # no metadata: Alembic runs every script
    engine.dispose()
    assert schema_of(db_url) == schema_of(by_migrations)
    assert revision_of(db_url) == revision_of(by_migrations) == migrate.HEAD
    assert set(schema_of(db_url)) == {t.name for t in Base.metadata.sorted_tables} | {"alembic_version"}


def test_a_database_of_gpubot_0_1_0_upgrades_to_the_fresh_schema_and_keeps_its_rows(tmp_path):
    legacy = tmp_path / "legacy.db"
    with sqlite3.connect(legacy) as c:  # made by gpubot 0.1.0 (tests/fixtures/db: its dump, with one row each)
        c.executescript((FIXTURES / "release-0.1.0.sqlite.sql").read_text())
    assert revision_of(f"sqlite:///{legacy}") is None
    store = Store(f"sqlite:///{legacy}")
    la = store.launches.get(1)
    assert (la.host, la.tag, la.unit_manager, la.gpus) == ("gpu-host-1", "gpubot-1-abc", "cgroup", [0, 1])
    assert store.outbox.get(1).text == "torch#1 ready"
    assert [e.action for e in store.events.list(launch_id=1)] == ["launch"]
    store.close()
    Store(f"sqlite:///{tmp_path}/fresh.db").close()
    assert schema_of(f"sqlite:///{legacy}") == schema_of(f"sqlite:///{tmp_path}/fresh.db")
    assert revision_of(f"sqlite:///{legacy}") == migrate.HEAD


@pytest.mark.parametrize("upgraded_by_old_release", [False, True], ids=["never-upgraded", "upgraded-by-0.1.0"])
def test_an_older_database_gets_its_missing_columns_not_null_and_index(db_url, request, upgraded_by_old_release):
    make_older(db_url, upgraded_by_old_release=upgraded_by_old_release)
    before = schema_of(db_url)
    assert "ix_launches_tag" not in {i[0] for i in before["launches"]["indexes"]}
    if upgraded_by_old_release:
        assert before["launches"]["columns"]["tag"][1] is True  # the old way left it nullable
    store = Store(db_url)
    la = store.launches.get(1)
    assert (la.host, la.tag) == ("gpu-host-1", "")  # the empty cell filled with the column's default
    store.close()
    fresh = second_url(db_url, request)
    Store(fresh).close()
    assert schema_of(db_url) == schema_of(fresh)


def test_a_database_of_a_newer_release_is_refused_with_what_to_do(db_url):
    Store(db_url).close()
    engine = sa.create_engine(db_url)
    with engine.begin() as c:
        c.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    engine.dispose()
    with pytest.raises(DatabaseUnavailable, match="newer gpubot"):
        Store(db_url)
    assert revision_of(db_url) == "9999"  # left as it was


def start_together(url: str, n: int = 2) -> tuple[list[Store], list[BaseException]]:
    """`n` Stores opened on `url` by `n` threads released at the same moment."""
    barrier, errors, stores = threading.Barrier(n), [], []

    def start() -> None:
        barrier.wait()
        try:
            stores.append(Store(url))
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=start) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return stores, errors


def settled(leaders: list, tries: list[list[int]]) -> bool:
    """One of `leaders` leads, and every other tried twice (a heartbeat apart) and was refused both times."""
    return any(le.leading for le in leaders) and all(
        t[0] >= 2 for t, le in zip(tries, leaders, strict=True) if not le.leading)


@pytest.mark.timeout(240)  # ten databases, each with two bots settling a heartbeat apart: ~40 s on a loaded machine
async def test_two_bots_starting_at_once_on_an_empty_postgresql_database_both_come_up_and_one_leads(
        postgres_cluster):
    from bot.adapters.leader import leadership_for
    from tests.integration.test_leadership import Hooks, counting, running

    for _ in range(10):
        url = postgres_cluster.new_database()
        stores, errors = start_together(url)
        assert not errors and len(stores) == 2, errors
        assert revision_of(url) == migrate.HEAD
        leaders = [leadership_for(s.db.engine) for s in stores]
        tries = [counting(leader) for leader in leaders]
        try:
            async with running(leaders[0], Hooks()), running(leaders[1], Hooks()):
                await wait_until(functools.partial(settled, leaders, tries), 30, what="the two bots to settle")
                assert sum(le.leading for le in leaders) == 1
        finally:
            for s in stores:
                s.close()


def test_the_first_call_after_a_postgresql_restart_succeeds(postgres_cluster):
    store = Store(postgres_cluster.new_database())
    store.events.add(user_id="U1", action="status", args={}, result="ok", detail=None,
                     launch_id=None, host=None, channel=None)  # a pooled connection
    postgres_cluster.restart()  # cuts it
    store.events.add(user_id="U1", action="status", args={"again": 1}, result="ok", detail=None,
                     launch_id=None, host=None, channel=None)
    assert [e.args for e in store.events.list(action="status")] in ([{}, {"again": 1}], [{"again": 1}, {}])
    store.close()


def test_db_upgrade_reads_config_and_database_from_the_environment(tmp_path, db_url):
    from click.testing import CliRunner

    from bot.cli import main

    config = tmp_path / "c.yaml"
    config.write_text(f"state_dir: {tmp_path}/state\n")
    env = {"GPUBOT_CONFIG": str(config), "GPUBOT_DATABASE_URL": db_url}
    first = CliRunner().invoke(main, ["db", "upgrade"], env=env)
    assert first.exit_code == 0, first.output
    assert f"-> {migrate.HEAD}" in first.output and "gpubot.db" not in first.output.replace(db_url, "") \
        and not (tmp_path / "state" / "gpubot.db").exists()  # the environment's database, not state_dir's
    assert revision_of(db_url) == migrate.HEAD
    again = CliRunner().invoke(main, ["db", "upgrade"], env=env)
    assert again.exit_code == 0 and f"already at schema revision {migrate.HEAD}" in again.output
    engine = sa.create_engine(db_url)
    with engine.begin() as c:
        c.exec_driver_sql("UPDATE alembic_version SET version_num = '9999'")
    engine.dispose()
    newer = CliRunner().invoke(main, ["db", "upgrade"], env=env)
    assert newer.exit_code == 2 and "newer gpubot" in newer.output
