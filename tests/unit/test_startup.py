"""Start-up: `gpubot --version`, `gpubot diagnose DIR` and `gpubot check-config FILE` import only what they use.

Each command runs in a fresh interpreter under `python -X importtime`, whose stderr names every module imported;
the test asserts which libraries are NOT among them (no wall-clock times: those depend on the machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "tests" / "fixtures" / "cases" / "00-sglang-tp8-silent-after-load"
EXAMPLE_CONFIG = ROOT / "deploy" / "config.example.yaml"

#: Libraries none of the three commands needs: the database, SSH, charts, Slack, HTTP, the secret box.
NEVER = ("sqlalchemy", "asyncssh", "matplotlib", "numpy", "slack_bolt", "slack_sdk", "aiohttp", "cryptography")
#: gpubot modules that only a running bot (or a bundle collection) needs.
NEVER_BOT = ("bot.services", "bot.adapters.remote", "bot.adapters.store.db", "bot.slack", "bot.present.chart",
             "handlers.dispatch")


def _imported(*args: str) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """(every module `python -m bot.cli ARGS` imported, the finished process)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "bot.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    modules = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "click" in modules, proc.stderr[-2000:]  # the -X importtime report was read
    return modules, proc


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules of `modules` that are one of `names` or inside one of them."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_version_imports_click_and_little_else():
    modules, proc = _imported("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("gpubot "), proc.stderr[-2000:]
    assert _loaded(modules, NEVER + NEVER_BOT) == []
    # not even the config schema, YAML, templates, the diagnosis, the redaction rules, the scheduler or asyncio
    assert _loaded(modules, ("pydantic", "yaml", "jinja2", "apscheduler", "asyncio", "bot.config", "bot.core",
                             "bot.wiring", "handlers")) == []


def test_diagnose_imports_the_diagnosis_only():
    modules, proc = _imported("diagnose", str(CASE))
    assert proc.returncode == 0 and proc.stdout.startswith("verdict: silent_hang"), proc.stderr[-2000:]
    assert "bot.core.diagnose.rules" in modules and "yaml" in modules  # it did diagnose (signatures.yaml)
    assert _loaded(modules, NEVER + NEVER_BOT) == []
    # a bundle is redacted when it is collected; reading one redacts nothing, so the redaction rules stay out,
    # and so do the config (pydantic), templates, the scheduler, the command table and asyncio
    assert _loaded(modules, ("bot.core.redact", "pydantic", "jinja2", "apscheduler", "asyncio", "bot.config",
                             "bot.wiring", "handlers")) == []


def test_check_config_imports_no_database_ssh_chart_or_slack():
    modules, proc = _imported("check-config", str(EXAMPLE_CONFIG))
    assert proc.returncode == 0 and proc.stdout.startswith(f"{EXAMPLE_CONFIG}: OK"), proc.stderr[-2000:]
    assert {"pydantic", "yaml", "jinja2", "handlers.table"} <= modules  # the schema, templates, command names
    assert _loaded(modules, NEVER + NEVER_BOT) == []
    # the digest_cron is checked with APScheduler's cron trigger; its SQLAlchemy job store is not loaded
    assert "apscheduler.triggers.cron" in modules
    assert _loaded(modules, ("apscheduler.jobstores.sqlalchemy",)) == []
    # the command table does not compile the diagnosis' signatures
    assert _loaded(modules, ("bot.core.diagnose",)) == []


def test_handlers_exports_every_public_name_lazily():
    """handlers re-exports lazily (PEP 562) and still has every name of its __all__, from the right module."""
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys, handlers\n"
         "assert 'handlers.dispatch' not in sys.modules\n"
         "missing = [n for n in handlers.__all__ if getattr(handlers, n, None) is None]\n"
         "assert not missing, missing\n"
         "assert handlers.Dispatcher.__module__ == 'handlers.dispatch' and len(handlers.COMMANDS) > 10\n"
         "from handlers import args, Reply\n"
         "assert args.__name__ == 'handlers.args' and Reply.__module__ == 'handlers.reply'\n"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_store_package_imports_sqlalchemy_only_when_used():
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys\n"
         "from bot.adapters.store import DatabaseUnavailable\n"
         "from bot.adapters.store.db import DatabaseUnavailable as same\n"
         "assert same is DatabaseUnavailable\n"
         "import bot.adapters.store as s\n"
         "assert callable(s.default_url) and 'sqlalchemy' in sys.modules\n"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = subprocess.run(
        [sys.executable, "-c",
         "import sys\n"
         "from bot.adapters.store import DatabaseUnavailable, Store\n"
         "assert 'sqlalchemy' not in sys.modules, 'importing the store package loaded SQLAlchemy'\n"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
