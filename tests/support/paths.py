"""Paths to the real captures and case bundles copied into the repo, and small readers for them."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures"
H200 = FIXTURES / "h200"
CASES = FIXTURES / "cases"


def read(path: Path) -> str:
    """The file's text (UTF-8)."""
    return path.read_text(encoding="utf-8")


def case_dir(prefix: str) -> Path:
    """The bundle directory whose name starts with `prefix-` (e.g. "00")."""
    (directory,) = CASES.glob(f"{prefix}-*")
    return directory


def case_file(prefix: str, name: str) -> str:
    """The text of file `name` in the bundle `prefix-*`."""
    return read(case_dir(prefix) / name)
