"""The import contracts (pyproject.toml, import-linter) hold on the code and fail on each deliberate violation; and
no function where the rules live (the diagnose package, the watcher) is over 60 lines.

Each case copies the two root packages and pyproject.toml into a temporary directory, plants one violation (a new
module, or one import line added to an existing module) and runs import-linter there: the contract it names must be
reported broken. Skipped where import-linter is not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")

pytestmark = [pytest.mark.timeout(120)]
needs_lint = pytest.mark.skipif(LINT is None, reason="import-linter (lint-imports) is not installed")

IO_CONTRACT = "No I/O library in core, present or config"
HANDLERS_CONTRACT = "handlers never import bot.adapters"
DIAGNOSE_CONTRACT = "The diagnose package's order"
LAYERS_CONTRACT = "Layers: cli"


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    assert LINT is not None
    return subprocess.run([LINT, "--no-cache"], cwd=root, capture_output=True, text=True, timeout=100,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the packages the contracts name, and of pyproject.toml."""
    root = tmp_path_factory.mktemp("contracts")
    for pkg in ("bot", "handlers"):
        shutil.copytree(ROOT / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def _verdicts(out: str) -> dict[str, str]:
    """Contract name -> KEPT or BROKEN, from lint-imports' summary (names wrap over lines there)."""
    summary = " ".join(out.split("Contracts:")[0].split("dependencies.")[-1].split())
    summary = summary.lstrip("-").strip()
    found = re.findall(r"(.+?) (KEPT|BROKEN)(?: |$)", summary)
    return {name.strip(): verdict for name, verdict in found}


@needs_lint
def test_the_contracts_hold_on_the_code(tree: Path) -> None:
    res = _lint(tree)
    assert res.returncode == 0, res.stdout + res.stderr
    verdicts = _verdicts(res.stdout)
    assert len(verdicts) == 5 and set(verdicts.values()) == {"KEPT"}, verdicts


@pytest.mark.parametrize(("where", "line", "contract"), [
    ("bot/core/_planted.py", "import subprocess", IO_CONTRACT),
    ("bot/core/_planted.py", "import socket", IO_CONTRACT),
    ("bot/core/_planted.py", "import sqlite3", IO_CONTRACT),
    ("bot/core/_planted.py", "import pynvml", IO_CONTRACT),
    ("bot/core/_planted.py", "import cryptography", IO_CONTRACT),
    ("bot/present/_planted.py", "import socket", IO_CONTRACT),
    ("bot/config/_planted.py", "import sqlite3", IO_CONTRACT),
    ("bot/core/_planted.py", "import asyncssh", IO_CONTRACT),
    ("handlers/_planted.py", "import bot.adapters.store", HANDLERS_CONTRACT),
    ("handlers/_planted.py", "from bot.adapters.remote import SSHExecutor", HANDLERS_CONTRACT),
    ("bot/core/diagnose/observation.py", "import bot.core.diagnose.rules", DIAGNOSE_CONTRACT),
    ("bot/core/diagnose/logscan.py", "import bot.core.diagnose.evidence", DIAGNOSE_CONTRACT),
    ("bot/core/models.py", "import bot.services.hosts", LAYERS_CONTRACT),
])
@needs_lint
def test_a_planted_violation_breaks_its_contract(tree: Path, where: str, line: str, contract: str) -> None:
    path = tree / where
    before = path.read_text() if path.exists() else None
    path.write_text((before or "") + f"\n{line}  # planted by the test\n")
    try:
        res = _lint(tree)
    finally:
        if before is None:
            path.unlink()
        else:
            path.write_text(before)
    assert res.returncode != 0, res.stdout
    broken = [name for name, verdict in _verdicts(res.stdout).items() if verdict == "BROKEN"]
    assert any(name.startswith(contract) for name in broken), (contract, res.stdout)


@pytest.mark.parametrize("where", ["bot/core/diagnose", "bot/services/watch.py", "bot/services/watch_spans.py"])
def test_no_function_over_60_lines_where_the_rules_live(where: str) -> None:
    import ast

    path = ROOT / where
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    long = [f"{f.relative_to(ROOT)}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for f in files for node in ast.walk(ast.parse(f.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno is not None and node.end_lineno - node.lineno + 1 > 60]
    assert long == []
