"""Argument parsing shared by every command: counts, pids, hosts and launches, with ONE answer for each
kind of mistake (an unknown host always gets the list of hosts)."""

from __future__ import annotations

import re

from bot.core.grammar import CommandCall
from bot.core.lifecycle import LaunchError
from bot.core.models import Launch
from bot.core.shell import MAX_PID, parse_pid
from handlers.context import Context, Source
from handlers.reply import UserError


def bad(detail: str, usage: str) -> UserError:
    """The answer to a malformed argument: what was wrong, and the usage line (audited as invalid)."""
    return UserError("Bad arguments", detail, f"Usage: {usage}", audit="invalid")


def no_kwargs(call: CommandCall, usage: str, allowed: frozenset[str] = frozenset()) -> None:
    """Raise UserError when `call` has key=value arguments other than `allowed`."""
    unknown = sorted(set(call.kwargs) - allowed)
    if unknown:
        raise bad(f"{call.name} takes no {', '.join(k + '=' for k in unknown)} argument", usage)


def is_number(word: str) -> bool:
    """True for a word of ASCII digits (Unicode digits such as '²' are not numbers here)."""
    return word.isascii() and word.isdigit()


def count(text: str, lo: int, hi: int, what: str, usage: str) -> int:
    """`text` as an integer in lo..hi, or UserError naming `what` and the range."""
    t = (text or "").strip()
    if not is_number(t) or len(t) > 12 or not lo <= int(t) <= hi:
        raise bad(f"{what} must be {lo}..{hi}", usage)
    return int(t)


def pid(text: str, usage: str) -> int:
    """A process id (2..MAX_PID: pid 1 is init, never ours to kill), or UserError."""
    n = parse_pid(text, lowest=2)
    if n is None:
        raise bad(f"pid= must be a process id (2..{MAX_PID})", usage)
    return n


def host(ctx: Context, name: str | None) -> str:
    """A configured host: `name`, else the default host, else the only host. UserError listing the known
    hosts otherwise (the one "unknown host" answer)."""
    from bot.services.hosts import UnknownHost  # here: bot.services.hosts imports the SSH library (asyncssh)

    try:
        return ctx.services.hosts.resolve_host(name)
    except UnknownHost as e:
        what = repr(name[:60]) if name else "no host given and no default host"
        raise UserError("Unknown host", what, f"Known hosts: {', '.join(e.known) or '(none configured)'}",
                        audit="invalid") from None


def hosts(ctx: Context, names: list[str], group: str | None) -> list[str]:
    """The hosts a command names: those of host group `group` (when given) with the hosts `names` names; without a
    group, `names`, or every configured host when `names` is empty or `all`. Each once, in order. UserError for
    an unknown host or group, or no hosts at all."""
    names = [n for n in names if n.lower() != "all"] if group is not None or len(names) == 1 else names
    if group is not None:
        members = ctx.config.group_hosts(group)
        if not members and group in ctx.config.host_groups:
            raise UserError("Empty host group", f"no host joins {group[:60]!r} (`group: {group[:60]}`)",
                            "Give a host `group:` in the config, or name another group.", audit="invalid")
        if not members:
            known = ", ".join(ctx.config.host_groups) or "none are configured (host_groups:)"
            raise UserError("Unknown host group", repr(group[:60]), f"Host groups: {known}", audit="invalid")
        return list(dict.fromkeys([host(ctx, n) for n in names] + members))
    if not names:
        every = ctx.config.host_names()
        if not every:
            raise UserError("No hosts", "no hosts are configured", "Add hosts to the config file.")
        return every
    return list(dict.fromkeys(host(ctx, n) for n in names))


def is_launch_ref(word: str) -> bool:
    """True for a word that names a launch by its id: `12`, `#12` or `base#12`."""
    _prefix, _sep, num = word.rpartition("#")
    return is_number(num)


def launch(ctx: Context, ref: str | None, usage: str, *, allow_only_live: bool = True) -> Launch:
    """The launch `ref` names (`12`, `base#12`, a variant: its live launch), or without `ref` the launch of
    this thread (and, when `allow_only_live`, the only live launch). UserError naming the live launches."""
    r = ctx.request
    try:
        la = ctx.services.launches.find(ref, channel=r.channel_id, thread_ts=r.thread_ts,
                                        allow_only_live=allow_only_live)
    except LaunchError as e:
        raise UserError("Cannot pick a launch", str(e), f"Usage: {usage}", audit="invalid") from None
    if r.source == Source.BUTTON and not la.live:
        _refuse_replaced(ctx, la, usage)
    return la


def _refuse_replaced(ctx: Context, la: Launch, usage: str) -> None:
    """A button of an ended launch whose thread now has a newer live launch (a relaunch replaced it): refuse,
    naming the live one; the button never acts on another launch."""
    if not la.channel or not la.thread_ts:
        return
    newest = ctx.services.launches.thread_launch(la.channel, la.thread_ts)
    if newest is None or newest.id == la.id or not newest.live:
        return
    words = []
    for w in usage.split():
        if "[" in w or "=" in w or w.isupper():
            break
        words.append(w)
    command = " ".join(words) or usage.split()[0]
    raise UserError(f"{la.name} has ended", f"{newest.name} is live in this thread: {command} {newest.name}?",
                    f"This button belongs to {la.name}. Use {newest.name}'s own buttons, or type "
                    f"`{command} {newest.id}`.", audit="stale", launch_id=la.id)


#: What reads as a number a person meant, valid or not (`-3`, `1e9`, `2.5`, `+4`).
_NUMBER_LIKE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def launch_and_number(call: CommandCall, usage: str) -> tuple[str | None, str | None]:
    """Split positional args into (a launch reference, a number): `N`, `LAUNCH`, `LAUNCH N`, `N N` (the first
    is the launch id). UserError for more than that."""
    if len(call.args) == 2 and not is_number(call.args[1]) and _NUMBER_LIKE.fullmatch(call.args[1]):
        return call.args[0], call.args[1]  # `LAUNCH -3`, `LAUNCH 1e9`: a bad number, said as such by its check
    nums = [a for a in call.args if is_number(a)]
    refs = [a for a in call.args if not is_number(a)]
    if len(nums) == 2 and not refs:
        refs, nums = [nums[0]], [nums[1]]
    if len(nums) > 1 or len(refs) > 1:
        raise bad("expected at most a launch and a number", usage)
    return (refs[0] if refs else None), (nums[0] if nums else None)
