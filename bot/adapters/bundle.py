"""Read a case bundle directory from disk into an `Observation` (`read_bundle`): the bundle's file I/O.

It reads the files named in `bot.core.bundle.BUNDLE_FILES` (`case.md` and `expected.json` hold the answer and
are NEVER read) and parses observed.json; a missing file means UNKNOWN. Turning the texts into an Observation is
the pure `bot.core.bundle.observation_from_texts`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from bot.core.bundle import BUNDLE_FILES, STACK_DIR, NodeBundles, node_bundles, observation_from_files
from bot.core.diagnose import Observation, Verdict, diagnose
from bot.core.ranks import NODE_DIR_PREFIX, RANKS_FILE, SCONTROL_FILE, weigh_bundle

__all__ = ["BundleError", "NodeBundles", "read_bundle", "read_nodes"]

#: At most this many `node-NAME/` folders are read (a launch across nodes has at most 1024 nodes).
_MAX_NODES = 64

_MAX_FILE_BYTES = 2 * 1024 * 1024  # a bigger file is read from its end (logs) or its start (others)
_MAX_STACK_FILES = 64


class BundleError(Exception):
    """The bundle directory is missing or unreadable; the message says which and why."""


def _read_text(path: Path, from_end: bool) -> str:
    """The file's text (at most 2 MiB; a log keeps its end). Opened without blocking (a FIFO cannot hang the
    reader); raises OSError for anything that is not a regular file (a FIFO, a device such as /dev/zero, a
    directory), also behind a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file")
    size = st.st_size
    with os.fdopen(fd, "rb") as f:
        if size > _MAX_FILE_BYTES:
            if from_end:
                f.seek(size - _MAX_FILE_BYTES)
            data = f.read(_MAX_FILE_BYTES)
            if from_end:  # the window starts inside a line (ended by LF, or CR alone): its start (a secret's
                # name?) is gone, so is the line
                ends = [i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0]
                data = data[min(ends) + 1:] if ends else b""
        else:
            data = f.read(_MAX_FILE_BYTES)
    return data.decode("utf-8", errors="replace")


def read_bundle(directory: str | Path) -> Observation:
    """Read the evidence files and observed.json of one bundle directory into an Observation.

    Raises BundleError when the directory does not exist, is not a directory, holds none of the bundle files,
    or a file in it cannot be read.
    Files over 2 MiB are cut (a log keeps its end). A malformed observed.json is not fatal: it is ignored and
    a note says so; a missing one leaves the facts to what the files' times and contents tell (with a note).
    `py-spy/*.json` (at most 64) are the ranks' stack dumps.
    """
    files, mtimes = _bundle_files(directory)
    return observation_from_files(files, mtimes)


def _bundle_files(directory: str | Path) -> tuple[dict[str, str], dict[str, float]]:
    """(relative path -> text, relative path -> mtime) of one bundle directory's files (read_bundle's rules).
    Raises BundleError."""
    root = Path(directory)
    if not root.exists():
        raise BundleError(f"{directory}: no such directory")
    if not root.is_dir():
        raise BundleError(f"{directory}: not a directory")
    try:
        names = {p.name for p in root.iterdir()}
    except OSError as e:
        raise BundleError(f"{directory}: cannot list: {e.strerror or e}") from e
    if not names & {*BUNDLE_FILES, STACK_DIR}:
        raise BundleError(f"{directory}: no bundle files here (expected some of: {', '.join(BUNDLE_FILES)}); "
                          "see tests/fixtures/cases/README.md for the format")
    paths = [root / name for name in BUNDLE_FILES if name in names]
    stack_dir = root / STACK_DIR
    stack_paths: list[Path] = []
    try:
        if STACK_DIR in names and stack_dir.is_dir() and not stack_dir.is_symlink():
            stack_paths = [p for p in sorted(stack_dir.glob("*.json")) if p.is_file() and not p.is_symlink()]
    except OSError as e:
        raise BundleError(f"{stack_dir}: cannot list: {e.strerror or e}") from e
    files: dict[str, str] = {}
    mtimes: dict[str, float] = {}
    for path in paths:
        rel = path.relative_to(root).as_posix()
        try:
            files[rel] = _read_text(path, from_end=rel == "server.log")
            mtimes[rel] = path.stat().st_mtime
        except OSError as e:
            raise BundleError(f"{path}: cannot read: {e.strerror or e}") from e
    for path in stack_paths[:_MAX_STACK_FILES]:  # a rank's dump that cannot be read is left out, not fatal
        try:
            files[path.relative_to(root).as_posix()] = _read_text(path, from_end=False)
        except OSError:
            continue
    return files, mtimes


def read_nodes(directory: str | Path) -> NodeBundles:
    """The ranks of a bundle of a launch across nodes (bot.core.bundle.node_bundles): its `node-NAME/` folders (at
    most 64, each read as a bundle of its own; one that cannot be read is left out), `ranks.txt` and
    `scontrol.txt`. A bundle of one host has none of them (an empty NodeBundles). Never raises for a directory
    read_bundle accepted."""
    root = Path(directory)
    files: dict[str, str] = {}
    mtimes: dict[str, float] = {}
    try:
        folders = sorted(p for p in root.iterdir() if p.name.startswith(NODE_DIR_PREFIX) and p.is_dir()
                         and not p.is_symlink())[:_MAX_NODES]
    except OSError:
        return NodeBundles()
    for folder in folders:
        try:
            got, times = _bundle_files(folder)
        except BundleError:
            continue
        files.update({f"{folder.name}/{rel}": text for rel, text in got.items()})
        mtimes.update({f"{folder.name}/{rel}": t for rel, t in times.items()})
    for name in (RANKS_FILE, SCONTROL_FILE):
        path = root / name
        try:
            if path.is_file() and not path.is_symlink():
                files[name] = _read_text(path, from_end=False)
        except OSError:
            continue
    return node_bundles(files, mtimes)


def diagnose_bundle(directory: str | Path) -> Verdict:
    """The verdict `gpubot diagnose DIR` gives: the bundle read (read_bundle), diagnosed, then weighed with its other
    nodes' folders and Slurm's word (bot.core.ranks.weigh_bundle) for a launch across nodes. Raises BundleError for
    a directory that is no bundle."""
    observation = read_bundle(directory)
    verdict = diagnose(observation)
    nodes = read_nodes(directory)
    if nodes:
        verdict = weigh_bundle(verdict, observation, nodes.rank0, nodes.ranks, nodes.scontrol)
    return verdict
