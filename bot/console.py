"""The same commands in a terminal: `gpubot console --config FILE`, and the demo's output.

Interactive when stdin is a terminal (prompt `gpubot> `); otherwise one command per line, each answer
printed as plain text, so sessions can be scripted. Lines look like `/gpu status`, `/probe host pgid=1`,
`probe host pgid=1`, `!probe ...` or `@gpubot probe ...`; `#` starts a comment line; `wait SECONDS` lets
time pass (readiness checks run and their alerts print as they happen); `quit` / `exit` end the session.
Everything a button can do can be typed: `confirm 12`, `cancel 12`, `relaunch 7`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from bot.config import Config
from bot.core.grammar import CommandCall, CommandParseError, Grammar
from bot.present.actions import click_command
from bot.present.render import Message
from bot.wiring import Runtime, build_runtime
from handlers import CONSOLE_USER, Request, Source, deliver

log = logging.getLogger(__name__)

#: The console's channel id (it has no Slack channel).
CONSOLE_CHANNEL = "console"
#: Longest `wait`, seconds.
MAX_WAIT_S = 3600.0


class ConsoleSurface:
    """A Surface that prints plain text to `out`; message ids are increasing integers as strings. Attached
    files (charts, long logs, stack dumps, evidence) are saved under `attach_dir` (default: a fresh
    temporary folder, made at the first file), and the path of each saved file is printed. A message's buttons
    are printed as what to type instead (`[Kill] !kill #7 --yes`), with the install's thread `prefix`."""

    def __init__(self, out: TextIO, attach_dir: Path | None = None, *, prefix: str = "!"):
        self.out = out
        self.attach_dir = attach_dir
        self.prefix = prefix
        self._ids = itertools.count(1)
        self._files = itertools.count(1)

    def save(self, filename: str, content: bytes) -> Path:
        """Write one attachment (its base name, numbered so nothing is overwritten) and return its path.
        Raises OSError when the folder cannot be written."""
        if self.attach_dir is None:
            self.attach_dir = Path(tempfile.mkdtemp(prefix="gpubot-attachments-"))
        self.attach_dir.mkdir(parents=True, exist_ok=True)
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", Path(filename).name)[:120] or "file"
        path = self.attach_dir / f"{next(self._files):03d}-{safe}"
        path.write_bytes(content)
        return path

    def _attach(self, filename: str, content: bytes) -> None:
        try:
            where = f"saved to {self.save(filename, content)}"
        except OSError as e:
            where = f"not saved: {e}"
        print(f"[attached {filename}, {len(content)} bytes, {where}]", file=self.out)

    async def post(self, channel: str, message: Message, *, thread_ts: str | None = None) -> str | None:
        """Print the message text (and what to type for each of its buttons) and save its attached files. Returns a
        fresh id."""
        print(message.text, file=self.out)
        typed = button_commands(message.blocks or [], self.prefix)
        if typed:
            print("Buttons, typed here: " + " · ".join(f"[{label}] {cmd}" for label, cmd in typed), file=self.out)
        for name, data in message.files:
            self._attach(name, data)
        self.out.flush()
        return str(next(self._ids))

    async def post_ephemeral(self, channel: str, user: str, message: Message, *,
                             thread_ts: str | None = None) -> str | None:
        """The console has one reader: the same as `post`."""
        return await self.post(channel, message, thread_ts=thread_ts)

    async def update(self, channel: str, ts: str, message: Message) -> bool:
        """Print the first line of the new version of an earlier message (e.g. a launch's new state); the
        console never showed message ids, so none is printed."""
        print(f"[earlier message updated] {message.text.splitlines()[0] if message.text else ''}", file=self.out)
        return True

    async def delete(self, channel: str, ts: str) -> bool:
        """Nothing to delete on a terminal. Returns True."""
        return True

    async def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
                     title: str | None = None) -> bool:
        """Save the file and print where."""
        self._attach(filename, content)
        return True


def button_commands(blocks: list[dict], prefix: str) -> list[tuple[str, str]]:
    """(label, command to type) for each gpubot button in Block Kit `blocks` (bot.present.actions: the command a
    click stands for, written with the thread `prefix`), in order; other buttons are left out."""
    out = []
    for block in blocks:
        for el in block.get("elements", []) if block.get("type") == "actions" else []:
            cmd = click_command(str(el.get("action_id", "")), str(el.get("value", "")))
            if cmd is not None:
                out.append((str((el.get("text") or {}).get("text", "")), f"{prefix}{cmd}"))
    return out


def parse_console_line(grammar: Grammar, line: str, *, bot_name: str = "gpubot",
                       prefix: str = "!") -> CommandCall | None:
    """Parse one console line into a CommandCall; None for blank and comment lines. `/cmd ...` is a slash
    command (by this install's names), `@gpubot ...` (or `@BOT_NAME ...`) a mention, anything else a command with
    or without the thread prefix (`prefix`, the config's `slack.command_prefix`; `!` is always taken too).

    Raises CommandParseError for unparseable input.
    """
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    if text.startswith("/"):
        cmd, _, rest = text.partition(" ")
        try:
            return grammar.parse_slash(cmd, rest)
        except CommandParseError:
            text = text[1:]
    for name in dict.fromkeys(("@" + bot_name.lower(), "@gpubot")):
        if text.lower().startswith((name + " ", name + "\t")) or text.lower() == name:
            text = text[len(name):].strip()
            break
    for p in dict.fromkeys((prefix, "!")):
        if p and text.startswith(p):
            text = text[len(p):]
            break
    return grammar.parse_command(text, raw=line.strip())


async def run_command_line(line: str, runtime: Runtime, user_id: str = CONSOLE_USER) -> bool:
    """Run one console line through the dispatcher and print its answer on the runtime's surface. Returns
    False when the line asks to quit."""
    if line.strip().lower() in ("quit", "exit"):
        return False
    words = line.split()
    if words and words[0].lower() == "wait":
        if len(words) == 2 and words[1].isascii() and words[1].replace(".", "", 1).isdigit():
            # scripted sessions: let time pass so readiness checks run and their alerts print
            await asyncio.sleep(min(float(words[1]), MAX_WAIT_S))
        else:
            out = getattr(runtime.surface, "out", sys.stdout)
            print(f"usage: wait SECONDS (a number, at most {MAX_WAIT_S:.0f}): lets the checks run", file=out)
        return True
    try:
        call: CommandCall | CommandParseError | None = parse_console_line(
            runtime.dispatcher.grammar, line, bot_name=runtime.config.slack.bot_name,
            prefix=runtime.config.slack.command_prefix)
    except CommandParseError as e:
        call = e
    if call is None:
        return True
    request = Request(user_id=user_id, channel_id=CONSOLE_CHANNEL, source=Source.CONSOLE)
    await deliver(runtime.surface, await runtime.dispatcher.run(request, call))
    return True


def console_runtime(config: Config, out: TextIO, **options: object) -> Runtime:
    """A runtime whose answers print to `out` (see bot.wiring.build_runtime for `options`)."""
    surface = ConsoleSurface(out, prefix=config.slack.command_prefix)
    return build_runtime(config, surface=surface, threads=False, **options)  # type: ignore[arg-type]


def run_interactive(config: Config) -> int:
    """Prompt `gpubot> ` on the terminal until `quit` or Ctrl-D, with line editing (readline).

    Ctrl-C abandons the current line or command and returns to the prompt. Returns exit code 0."""
    try:
        import readline  # noqa: F401 - gives input() line editing and history
    except ImportError:
        pass
    loop = asyncio.new_event_loop()
    runtime = console_runtime(config, sys.stdout)
    loop.run_until_complete(runtime.start(settle_heap=True))
    print("gpubot console: type `help`, `quit` or Ctrl-D to leave.")
    try:
        while True:
            try:
                line = input("gpubot> ")
            except EOFError:
                print()
                break
            except KeyboardInterrupt:
                print()
                continue
            try:
                if not loop.run_until_complete(run_command_line(line, runtime)):
                    break
            except KeyboardInterrupt:
                print("\n(interrupted)")
    finally:
        loop.run_until_complete(runtime.close())
        loop.close()
    return 0


async def run_console(config: Config, *, stdin: TextIO | None = None, out: TextIO | None = None,
                      runtime: Runtime | None = None) -> int:
    """Read commands from `stdin` (one per line, as from a pipe) until EOF or `quit`; print each command
    (`> CMD`) and its answer to `out`; readiness checks run meanwhile and print their alerts. Returns exit
    code 0."""
    stdin = stdin or sys.stdin
    out = out or sys.stdout
    own = runtime is None
    runtime = runtime or console_runtime(config, out)
    await runtime.start()
    try:
        while True:
            line = await asyncio.to_thread(stdin.readline)
            if line == "":
                break
            if line.strip() and not line.lstrip().startswith("#"):
                print(f"> {line.strip()}", file=out)
            if not await run_command_line(line, runtime):
                break
            print("", file=out)
    finally:
        if own:
            await runtime.close()
    return 0
