"""How right `gpubot diagnose` is on the SEALED case bundles of issue 44: totals and weakness classes only.

The sealed bundles (tests/fixtures/sealed/*.tar.gz, README.md there) were written by helpers who never read the
diagnosis code, from public reports no other bundle uses, and packed without anyone who writes rules seeing them.
This script unpacks them into a temporary folder, diagnoses each exactly as `gpubot diagnose DIR --json` does
(read_bundle, diagnose, then the other nodes' folders and Slurm's word: weigh_bundle), and prints:

- the totals: verdict, phase, quotes and all three right ("fully right"), and false alarms on the controls
  (bundles that expect `ready`, `loading` or `exited` and get an alarm verdict);
- per weakness class (the `classes` tags of expected.json) and per engine: how many bundles, how many fully right,
  and how many got the verdict, the phase or the quotes wrong.

It never prints a bundle's name, source, verdict or quote, so the seal holds: run it once per issue, at its end, on the
code before and after (`python -m benchmarks sealed_corpus --tree BEFORE --tree .`). `--dir FOLDER` scores a folder of
unpacked bundles instead (to try this script on bundles that are not sealed).

    python -m benchmarks.sealed_corpus [--dir FOLDER]
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    from bot.adapters.bundle import diagnose_bundle
except ImportError:  # a tree from before diagnose_bundle (--tree): the same steps, as gpubot diagnose took them there
    from bot.adapters.bundle import read_bundle, read_nodes
    from bot.core.diagnose import diagnose
    from bot.core.ranks import weigh_bundle

    def diagnose_bundle(directory: Path):  # type: ignore[no-redef]
        obs = read_bundle(directory)
        v = diagnose(obs)
        nodes = read_nodes(directory)
        return weigh_bundle(v, obs, nodes.rank0, nodes.ranks, nodes.scontrol) if nodes else v

SEALED = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "sealed"
#: Verdicts that raise no alarm: a control expects one of them, and an alarm verdict on it is a false alarm.
QUIET = frozenset({"ready", "loading", "exited"})


def verdict_of(bundle: Path) -> dict[str, object]:
    """What `gpubot diagnose BUNDLE --json` prints, as a dict."""
    return diagnose_bundle(bundle).to_dict()


def score(bundle: Path) -> dict[str, object]:
    """{verdict_ok, phase_ok, quotes_ok, full, control, alarm, classes, engine} of one bundle."""
    exp = json.loads((bundle / "expected.json").read_text(encoding="utf-8"))
    try:
        got = verdict_of(bundle)
    except Exception as e:  # a crash is a miss, counted, never a stop
        got = {"verdict": f"crash:{type(e).__name__}", "phase": None, "evidence": []}
    joined = "\n".join(str(x) for x in got.get("evidence") or [])
    r = {"verdict_ok": got["verdict"] == exp["verdict"], "phase_ok": got["phase"] == exp.get("phase"),
         "quotes_ok": all(q in joined for q in exp.get("evidence_must_mention") or [])}
    r["full"] = r["verdict_ok"] and r["phase_ok"] and r["quotes_ok"]
    r["control"] = exp["verdict"] in QUIET
    r["alarm"] = r["control"] and got["verdict"] not in QUIET
    r["classes"] = list(exp.get("classes") or ["(untagged)"])
    r["engine"] = exp.get("engine") or "(untagged)"
    return r


@contextmanager
def unpacked(folder: Path | None, round_: str | None = None) -> Iterator[list[Path]]:
    """The bundle folders to score: those of `folder`, or the sealed archives unpacked into a temporary folder."""
    if folder is not None:
        yield sorted(p for p in folder.iterdir() if (p / "expected.json").is_file())
        return
    with tempfile.TemporaryDirectory(prefix="gpubot-sealed-") as tmp:
        root = Path(tmp)
        for archive in sorted(SEALED.glob(f"{round_}-*.tar.gz" if round_ else "*.tar.gz")):
            with tarfile.open(archive) as tar:
                tar.extractall(root / archive.name.removesuffix(".tar.gz"), filter="data")
        yield sorted(p.parent for p in root.rglob("expected.json"))


def newest_round() -> str | None:
    """The newest sealed set's name (`44b` of `44b-S5.tar.gz`: the longest, then greatest, prefix), or None."""
    rounds = {p.name.split("-", 1)[0] for p in SEALED.glob("*-*.tar.gz")}
    return max(rounds, key=lambda r: (len(r), r)) if rounds else None


def _row(label: str, rows: list[dict[str, object]]) -> str:
    n = len(rows)
    full = sum(1 for r in rows if r["full"])
    wrong = {k: sum(1 for r in rows if not r[k]) for k in ("verdict_ok", "phase_ok", "quotes_ok")}
    return (f"  {label:<30} {n:>3}  fully right {full:>3} ({100 * full / max(1, n):3.0f} %)   wrong: verdict "
            f"{wrong['verdict_ok']:>2}, phase {wrong['phase_ok']:>2}, quotes {wrong['quotes_ok']:>2}")


def main() -> None:
    """Score the bundles and print the totals and weakness classes."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="score a folder of unpacked bundles instead")
    ap.add_argument("--round", default=newest_round(), help="the sealed set to score: archives ROUND-*.tar.gz "
                    "(default: the newest, %(default)s; an earlier round is spent once it was scored)")
    a = ap.parse_args()
    print(f"sealed round {a.round}" if a.dir is None else f"bundles of {a.dir}")
    import bot  # which tree is scored: the bot package this run imported

    print(f"bot from {Path(bot.__file__).resolve().parents[1]}")
    with unpacked(a.dir, a.round) as bundles:
        rows = [score(b) for b in bundles]
    n = len(rows)
    if not n:
        print("no bundles found")
        return
    c = {k: sum(1 for r in rows if r[k]) for k in ("verdict_ok", "phase_ok", "quotes_ok", "full")}
    controls = [r for r in rows if r["control"]]
    print(f"sealed bundles {n}: verdict {c['verdict_ok']}/{n}, phase {c['phase_ok']}/{n}, quotes {c['quotes_ok']}/{n}, "
          f"fully right {c['full']}/{n} ({100 * c['full'] / n:.0f} %); false alarms "
          f"{sum(1 for r in controls if r['alarm'])}/{len(controls)} controls")
    by_class: dict[str, list[dict[str, object]]] = defaultdict(list)
    by_engine: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in rows:
        for cls in r["classes"]:  # type: ignore[attr-defined]
            by_class[str(cls)].append(r)
        by_engine[str(r["engine"])].append(r)
    print("weakness classes (bundles tagged with the class):")
    for cls, rs in sorted(by_class.items(), key=lambda kv: (-sum(1 for r in kv[1] if not r["full"]), kv[0])):
        print(_row(cls, rs))
    print("engines:")
    for eng, rs in sorted(by_engine.items()):
        print(_row(eng, rs))


if __name__ == "__main__":
    main()
