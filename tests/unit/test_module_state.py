"""No module-level mutable state outside the composition root (bot/wiring.py): every module of `bot` and `handlers`
is read for module-level names bound to a mutable container (a list, dict or set display or comprehension, or a
call of a mutable constructor such as `dict()`, `defaultdict()`, `deque()` or `threading.Lock()`) and for `global`
statements anywhere. Constants are tuples, frozensets and `types.MappingProxyType`s; state lives on objects the
composition root builds. Allowed: `__all__` (Python's own convention), and caches of pure functions
(`functools.cache`/`lru_cache`), which can change no result.

The one module excused, `bot/demo/fake_pynvml/pynvml.py`, stands in for a third-party module whose own API is
module state (`nvmlInit` / `nvmlShutdown`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED_FILES = {"bot/wiring.py", "bot/demo/fake_pynvml/pynvml.py"}
ALLOWED_NAMES = {"__all__"}
MUTABLE_CALLS = {"dict", "list", "set", "bytearray", "defaultdict", "OrderedDict", "Counter", "deque", "ChainMap",
                 "Lock", "RLock", "Event", "Condition", "Semaphore", "BoundedSemaphore", "local", "Queue",
                 "WeakValueDictionary", "WeakKeyDictionary", "WeakSet"}
MUTABLE_DISPLAYS = (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)

pytestmark = pytest.mark.timeout(60)


def _mutable(value: ast.expr) -> bool:
    if isinstance(value, MUTABLE_DISPLAYS):
        return True
    if isinstance(value, ast.BinOp):  # [None] * n, {...} | {...}
        return _mutable(value.left) or _mutable(value.right)
    if isinstance(value, ast.Call):
        f = value.func
        return (f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)) in MUTABLE_CALLS
    return False


def module_state(source: str) -> list[str]:
    """`line: what` for each module-level binding of a mutable container and each `global` statement in
    `source` (Python text)."""
    found = []
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        names = [ast.unparse(t) for t in targets]
        if _mutable(value) and not set(names) <= ALLOWED_NAMES:
            found.append(f"{node.lineno}: {', '.join(names)} = {ast.unparse(value)[:60]}")
    found += [f"{n.lineno}: global {', '.join(n.names)}" for n in ast.walk(tree) if isinstance(n, ast.Global)]
    return found


def _modules() -> list[Path]:
    return sorted(p for pkg in ("bot", "handlers") for p in (ROOT / pkg).rglob("*.py"))


def test_no_module_level_mutable_state_outside_the_composition_root():
    modules = _modules()
    assert len(modules) > 100, "the packages were found"
    found = {rel: hits for p in modules
             if (rel := p.relative_to(ROOT).as_posix()) not in ALLOWED_FILES and (hits := module_state(p.read_text()))}
    assert not found, found


def test_the_scan_finds_each_kind_of_state():
    planted = """
__all__ = ["x"]
CACHE = {}
SEEN: set[str] = set()
ROWS = [None] * 4
LOCK = threading.Lock()
BY_NAME = {k: 1 for k in "ab"}
DONE = collections.defaultdict(list)
FINE = frozenset({"a"})
ALSO_FINE = types.MappingProxyType({"a": 1})
TUPLE = (1, 2)

def f():
    global CACHE
    local = {}
"""
    hits = module_state(planted)
    assert [h.split(":")[0] for h in hits] == ["3", "4", "5", "6", "7", "8", "14"], hits
    assert module_state(planted.replace("__all__", "NAMES")) [0].startswith("2: NAMES")
