"""Read a case bundle directory from disk into an `Observation` (`read_bundle`): the bundle's file I/O.

It reads the files named in `bot.core.bundle.BUNDLE_FILES` (`case.md` and `expected.json` hold the answer and
are NEVER read) and parses observed.json; a missing file means UNKNOWN. Turning the texts into an Observation is
the pure `bot.core.bundle.observation_from_texts`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bot.core.bundle import BUNDLE_FILES, observation_from_texts
from bot.core.diagnose import Observation

__all__ = ["BundleError", "read_bundle"]

_MAX_FILE_BYTES = 2 * 1024 * 1024  # a bigger file is read from its end (logs) or its start (others)


class BundleError(Exception):
    """The bundle directory is missing or unreadable; the message says which and why."""


def _read_text(path: Path, from_end: bool) -> str:
    size = path.stat().st_size
    with path.open("rb") as f:
        if size > _MAX_FILE_BYTES:
            if from_end:
                f.seek(size - _MAX_FILE_BYTES)
            data = f.read(_MAX_FILE_BYTES)
            if from_end:  # the window starts inside a line: its start (a secret's name?) is gone, so is the line
                data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
        else:
            data = f.read()
    return data.decode("utf-8", errors="replace")


def read_bundle(directory: str | Path) -> Observation:
    """Read the evidence files and observed.json of one bundle directory into an Observation.

    Raises BundleError when the directory does not exist, is not a directory, holds none of the bundle files,
    or a file in it cannot be read.
    Files over 2 MiB are cut (a log keeps its end). A malformed observed.json is not fatal: it is ignored and
    a note says so.
    """
    root = Path(directory)
    if not root.exists():
        raise BundleError(f"{directory}: no such directory")
    if not root.is_dir():
        raise BundleError(f"{directory}: not a directory")
    texts: dict[str, str] = {}
    observed: Any = None
    bad_json = False
    try:
        names = {p.name for p in root.iterdir()}
    except OSError as e:
        raise BundleError(f"{directory}: cannot list: {e.strerror or e}") from e
    if not names & set(BUNDLE_FILES):
        raise BundleError(f"{directory}: no bundle files here (expected some of: {', '.join(BUNDLE_FILES)}); "
                          "see tests/fixtures/cases/README.md for the format")
    for name in BUNDLE_FILES:
        if name not in names:
            continue
        path = root / name
        try:
            text = _read_text(path, from_end=name == "server.log")
        except OSError as e:
            raise BundleError(f"{path}: cannot read: {e.strerror or e}") from e
        if name == "observed.json":
            try:
                observed = json.loads(text) if text.strip() else {}
            except ValueError:
                bad_json = True
        else:
            texts[name] = text
    obs = observation_from_texts(texts, observed)
    if bad_json:
        obs.notes.append("observed.json is not valid JSON; ignored")
    return obs
