"""The numbers and names the README and docs/ state are the code's (a doc that drifts fails here)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.support.paths import CASES, FIXTURES
from tests.support.split import KNOWN_MISSES, fourth_set, miss_key, split, third_set

ROOT = Path(__file__).resolve().parents[2]


def _doc(name: str) -> str:
    return " ".join((ROOT / name).read_text().split())  # wrapped lines as one


def _number(text: str, pattern: str) -> int:
    m = re.search(pattern, text)
    assert m is not None, pattern
    return int(m.group(1))


def test_the_secret_shapes_count() -> None:
    shapes = yaml.safe_load((FIXTURES / "secrets" / "shapes.yaml").read_text(encoding="utf-8"))
    assert _number(_doc("docs/commands.md"), r"the (\d+) shapes they are tested on") == len(shapes)
    security = _doc("docs/security.md")
    assert _number(security, r"The rules are tested on (\d+) shapes") == len(shapes)
    held = yaml.safe_load((FIXTURES / "secrets" / "heldout.yaml").read_text(encoding="utf-8"))
    assert _number(security, r"\(`heldout.yaml`, (\d+) shapes") == len(held)
    near = yaml.safe_load((FIXTURES / "secrets" / "near_misses.yaml").read_text(encoding="utf-8"))
    assert _number(security, r"none of the (\d+) near misses") == len(near)


def test_the_case_corpus_counts() -> None:
    bundles = sorted(p for p in CASES.iterdir() if p.is_dir())
    _shared, rule_writing, _held_out = split(bundles)
    rule_writing += third_set(bundles)[0] + fourth_set(bundles)
    text = _doc("docs/watching.md")
    assert _number(text, r"has (\d+) bundles built from public bug reports") == len(bundles)
    xfails = sum(1 for b in rule_writing if miss_key(b) in KNOWN_MISSES)  # tests/unit/test_bundles.py's strict xfails
    assert _number(text, r"the (\d+) `xfailed` of a test run") == xfails


def test_every_doc_page_the_readme_links_exists_and_links_back() -> None:
    readme = (ROOT / "README.md").read_text()
    pages = re.findall(r"\]\((docs/[a-z-]+\.md)\)", readme)
    assert {"docs/commands.md", "docs/watching.md", "docs/security.md", "docs/operations.md",
            "docs/configuration.md", "docs/development.md"} <= set(pages)
    for page in pages:
        assert "(../README.md)" in (ROOT / page).read_text(), page


def test_the_readme_keeps_the_two_commands_and_which_library_does_what() -> None:
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^\./dev \w+", quick, re.M) == ["./dev demo", "./dev test"]
    assert "## Which library does what" in readme and "connections:write" in readme
    assert "permissions.operators" in readme
