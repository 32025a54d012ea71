"""The same commands in a terminal: `gpubot console --config FILE`, and the demo's output.

Interactive when stdin is a terminal (prompt `gpubot> `); otherwise one command per line, each answer
printed as plain text, so sessions can be scripted. Lines look like `/gpu status`, `/probe host pgid=1`,
`probe host pgid=1` or `!probe ...`; `#` starts a comment line; `wait SECONDS` lets time pass (readiness
checks run and their alerts print as they happen); `quit` / `exit` end the session.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
from typing import TextIO

from bot.config import Config
from bot.core.grammar import CommandCall, CommandParseError, parse_message, parse_slash
from bot.present.render import Message
from bot.services.hosts import HostService
from bot.services.launches import LaunchService, build_launch_service
from bot.services.watch import Watcher

log = logging.getLogger(__name__)


class ConsoleSurface:
    """A Surface that prints plain text to `out`; message ids are increasing integers as strings."""

    def __init__(self, out: TextIO):
        self.out = out
        self._ids = itertools.count(1)

    async def post(self, channel: str, message: Message, *, thread_ts: str | None = None) -> str | None:
        """Print the message text (and the names of attached files). Returns a fresh id."""
        print(message.text, file=self.out)
        for name, data in message.files:
            print(f"[attached {name}, {len(data)} bytes]", file=self.out)
        self.out.flush()
        return str(next(self._ids))

    async def update(self, channel: str, ts: str, message: Message) -> bool:
        """Print the first line of the new version of a message (e.g. a launch's new state)."""
        print(f"[message {ts} updated] {message.text.splitlines()[0] if message.text else ''}", file=self.out)
        return True

    async def upload(self, channel: str, filename: str, content: bytes, *, thread_ts: str | None = None,
                     title: str | None = None) -> bool:
        """Say that a file would be attached (the console does not store it)."""
        print(f"[file {filename}: {len(content)} bytes]", file=self.out)
        return True


def parse_console_line(line: str) -> CommandCall | None:
    """Parse one console line into a CommandCall; None for blank and comment lines.

    Raises CommandParseError for unparseable input.
    """
    text = line.strip()
    if not text or text.startswith("#"):
        return None
    if text.startswith("/"):
        cmd, _, rest = text.partition(" ")
        try:
            return parse_slash(cmd, rest)
        except CommandParseError:
            text = text[1:]
    if text.lower().startswith(("@gpubot ", "@gpubot\t")) or text.lower() == "@gpubot":
        text = text[len("@gpubot"):].strip()
    if not text.startswith("!"):
        text = "!" + text
    return parse_message(text, bot_user_id=None, prefix="!")


async def run_command_line(line: str, config: Config, hosts: HostService, surface: ConsoleSurface,
                           user_id: str = "console", launches: LaunchService | None = None) -> bool:
    """Run one console line and print its answer. Returns False when the line asks to quit."""
    from handlers import dispatch
    from handlers.base import CommandContext, error_message

    if line.strip().lower() in ("quit", "exit"):
        return False
    words = line.split()
    if len(words) == 2 and words[0].lower() == "wait" and words[1].isascii() and words[1].replace(".", "", 1).isdigit():
        # scripted sessions: let time pass so readiness checks run and their alerts print
        await asyncio.sleep(min(float(words[1]), 3600.0))
        return True
    try:
        call = parse_console_line(line)
    except CommandParseError as e:
        await surface.post("console", error_message("Bad command", str(e)))
        return True
    if call is None:
        return True
    ctx = CommandContext(user_id=user_id, channel_id="console", config=config, hosts=hosts, source="console",
                         surface=surface, launches=launches)
    await surface.post("console", await dispatch(call, ctx), thread_ts=ctx.reply_thread_ts)
    return True


def run_interactive(config: Config) -> int:
    """Prompt `gpubot> ` on the terminal until `quit` or Ctrl-D, with line editing (readline).

    Ctrl-C abandons the current line or command and returns to the prompt. Returns exit code 0.
    """
    try:
        import readline  # noqa: F401 - gives input() line editing and history
    except ImportError:
        pass
    loop = asyncio.new_event_loop()
    hosts = HostService(config)
    launches = build_launch_service(config, hosts)
    surface = ConsoleSurface(sys.stdout)
    watcher = Watcher(launches, surface, db_url=launches.store.url)
    loop.run_until_complete(watcher.start())
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
                if not loop.run_until_complete(run_command_line(line, config, hosts, surface, launches=launches)):
                    break
            except KeyboardInterrupt:
                print("\n(interrupted)")
    finally:
        loop.run_until_complete(watcher.stop())
        loop.run_until_complete(hosts.close())
        launches.store.close()
        loop.close()
    return 0


async def run_console(config: Config, *, stdin: TextIO | None = None, out: TextIO | None = None,
                      hosts: HostService | None = None) -> int:
    """Read commands from `stdin` (one per line, as from a pipe) until EOF or `quit`; print each command
    (`> CMD`) and its answer to `out`. Returns exit code 0."""
    stdin = stdin or sys.stdin
    out = out or sys.stdout
    own = hosts is None
    hosts = hosts or HostService(config)
    launches = build_launch_service(config, hosts)
    surface = ConsoleSurface(out)
    watcher = Watcher(launches, surface, db_url=launches.store.url)  # alerts print as they happen
    await watcher.start()
    try:
        while True:
            line = await asyncio.to_thread(stdin.readline)
            if line == "":
                break
            if line.strip() and not line.lstrip().startswith("#"):
                print(f"> {line.strip()}", file=out)
            if not await run_command_line(line, config, hosts, surface, launches=launches):
                break
            print("", file=out)
    finally:
        await watcher.stop()
        launches.store.close()
        if own:
            await hosts.close()
    return 0
