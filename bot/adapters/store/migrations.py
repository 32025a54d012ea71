"""Schema migrations: bring a database made by an older gpubot up to date (additive changes only)."""

from __future__ import annotations

from sqlalchemy import MetaData, inspect
from sqlalchemy.engine import Engine


def add_missing_columns(engine: Engine, metadata: MetaData) -> list[str]:
    """Add every column `metadata` declares that the database's tables lack (every new column is nullable or
    has a scalar default). Returns `table.column` for each column added. Raises sqlalchemy errors."""
    insp = inspect(engine)
    added: list[str] = []
    with engine.begin() as conn:
        for table in metadata.sorted_tables:
            have = {c["name"] for c in insp.get_columns(table.name)}
            for col in table.columns:
                if col.name in have:
                    continue
                ddl_type = col.type.compile(dialect=engine.dialect)
                default = col.default.arg if col.default is not None and not callable(col.default.arg) else None
                clause = f" DEFAULT {default!r}" if isinstance(default, (str, int, float)) else ""
                conn.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{col.name}" {ddl_type}{clause}')
                added.append(f"{table.name}.{col.name}")
    return added
