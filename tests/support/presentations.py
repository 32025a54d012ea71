"""The same evidence in the layouts users paste it in (issue 44): a presentation changes only how a bundle's lines are
laid out, never what they say, so a diagnosis that reads structure gives the same verdict, phase and quotes on it.

- `wrap80` / `wrap120`: server.log hard-wrapped by an 80- or 120-column terminal (a long line goes on at column 0);
- `compose`: every server.log line under a docker compose prefix (`engine-1  | `);
- `journald`: under a journald / syslog prefix (`Dec 07 10:11:12 gpu-host-1 engine[4242]: `);
- `kubectl`: under `kubectl logs --timestamps` (`2026-12-07T10:11:12.123456789Z `);
- `journald_iso`: under `journalctl -o short-iso` (`2026-12-07T10:11:12+0000 gpu-host-1 engine[4242]: `);
- `srun_label`: under `srun --label`'s task number (`0: `);
- `ansi`: each line's first word coloured (ANSI SGR escapes, as a terminal capture keeps them);
- `crlf`: lines ending in CR LF (a log copied from Windows or a serial console);
- `ps_noheader`: ps.txt without its header row (a `ps ... | grep` paste);
- `tb_cut`: every Python traceback cut before its final exception line (a paste that stopped short): judged on the
  phase and on raising an alarm at all (the exception's type may be gone with its line), not on the quotes.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from bot.adapters.bundle import diagnose_bundle
from tests.support.paths import CASES
from tests.support.split import fourth_set, split, third_set


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _wrap(width: int) -> Callable[[str], str]:
    def wrap(text: str) -> str:
        out: list[str] = []
        for line in _lines(text):
            while len(line) > width:
                out.append(line[:width])
                line = line[width:]
            out.append(line)
        return "\n".join(out)
    return wrap


def _prefix(prefix: str) -> Callable[[str], str]:
    def add(text: str) -> str:
        return "\n".join(prefix + x if x else x for x in _lines(text))
    return add


def _ansi(text: str) -> str:
    return "\n".join(re.sub(r"^(\S+)", "\x1b[32m\\1\x1b[0m", x, count=1) for x in _lines(text))


def _crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


_TB_HEAD = re.compile(r"Traceback \(most recent call last\):\s*$")


def _shared(a: str, b: str) -> int:
    """How many leading characters `a` and `b` have in common."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _tb_cut(text: str) -> str:
    """Drop the final exception line of every Python traceback: the first line after its frames that, less what it
    shares of the prefix the `Traceback` line had (a level, a timestamp, a process label), is not indented and
    starts with a name and a colon."""
    lines = _lines(text)
    drop: set[int] = set()
    for i, line in enumerate(lines):
        m = _TB_HEAD.search(line)
        if m is None:
            continue
        prefix, frames = line[:m.start()], 0
        for j in range(i + 1, min(len(lines), i + 400)):
            rest = lines[j][_shared(prefix, lines[j]):]  # a shorter label on frame lines too
            if rest[:1] in (" ", "\t", "^", "~") or not rest.strip():
                frames += rest.lstrip().startswith("File ")
                continue
            if frames and re.match(r"[A-Za-z_][\w.]*(?::|$)", rest):
                drop.add(j)  # the exception's own line
            break
    return "\n".join(x for k, x in enumerate(lines) if k not in drop)


def _ps_noheader(text: str) -> str:
    lines = _lines(text)
    return "\n".join(lines[1:]) if lines and "PID" in lines[0] else text


#: name -> (the bundle file it changes, how)
PRESENTATIONS: dict[str, tuple[str, Callable[[str], str]]] = {
    "wrap80": ("server.log", _wrap(80)),
    "wrap120": ("server.log", _wrap(120)),
    "compose": ("server.log", _prefix("engine-1  | ")),
    "journald": ("server.log", _prefix("Dec 07 10:11:12 gpu-host-1 engine[4242]: ")),
    "kubectl": ("server.log", _prefix("2026-12-07T10:11:12.123456789Z ")),
    "journald_iso": ("server.log", _prefix("2026-12-07T10:11:12+0000 gpu-host-1 engine[4242]: ")),
    "srun_label": ("server.log", _prefix("0: ")),
    "ansi": ("server.log", _ansi),
    "crlf": ("server.log", _crlf),
    "ps_noheader": ("ps.txt", _ps_noheader),
    "tb_cut": ("server.log", _tb_cut),
}


#: Verdicts that raise no alarm (a control expects one of them).
QUIET = frozenset({"ready", "loading", "exited"})


def rule_writing_bundles() -> list[Path]:
    """The shared and rule-writing case bundles (tests/support/split.py: never a held-out one), by name."""
    every = sorted(p for p in CASES.iterdir() if (p / "expected.json").is_file())
    shared, rules, _held = split(every)
    rules_3, _held_3 = third_set(every)
    return sorted({*shared, *rules, *rules_3, *fourth_set(every)}, key=lambda p: p.name)


def fully_right(bundle: Path, expected: dict, loose: bool = False) -> bool:
    """Whether `gpubot diagnose BUNDLE` gives the expected verdict, phase and quotes. `loose` (a traceback cut
    before its exception line: its type may be gone with it): the phase, and an alarm where one is due (any) or
    the same quiet verdict where not; no quotes. Raises what diagnose_bundle raises (BundleError)."""
    got = diagnose_bundle(bundle)
    if got.phase != expected.get("phase"):
        return False
    if loose:
        return got.verdict == expected["verdict"] or (expected["verdict"] not in QUIET and got.verdict not in QUIET)
    joined = "\n".join(got.evidence)
    return got.verdict == expected["verdict"] and all(q in joined for q in expected["evidence_must_mention"])


def laid_out(bundle: Path, name: str, into: Path) -> Path | None:
    """A copy of `bundle` under `into`, with the file presentation `name` changes laid out its way; None when the
    bundle has no such file or the presentation leaves it as it is."""
    file, how = PRESENTATIONS[name]
    src = bundle / file
    if not src.is_file():
        return None
    text = src.read_text(encoding="utf-8", errors="replace")
    new = how(text)
    if new == text:
        return None
    copy = into / name / bundle.name
    shutil.copytree(bundle, copy)
    (copy / file).write_text(new, encoding="utf-8")
    return copy
