"""`!bundle [LAUNCH]`: collect a bundle in the diagnose format from the launch's host (log tail, ps, nvidia-smi
table and CSV, listening sockets, health, dmesg when readable, py-spy dumps, observed.json from two probes),
redacted, attached to the thread as a tar.gz, with the verdict `gpubot diagnose` reaches on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bot.core.commands import thread
from bot.core.grammar import CommandCall
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

if TYPE_CHECKING:
    from bot.services.bundles import Bundle

USAGE = thread("bundle", "[LAUNCH]")


def offline_verdict(bundle: Bundle) -> tuple[str, str | None]:
    """(verdict, phase) `gpubot diagnose` gives on the bundle's files, read from memory as it reads them from disk."""
    from bot.core.bundle import node_bundles, observation_from_files  # here: the diagnosis compiles on import
    from bot.core.diagnose import diagnose
    from bot.core.ranks import weigh_bundle

    files = {n: d.decode("utf-8", "replace") for n, d in bundle.files.items()}
    top = observation_from_files(files)
    v = diagnose(top)
    nodes = node_bundles(files)  # a launch across nodes: every rank's folder and Slurm's word weigh in
    if nodes:
        v = weigh_bundle(v, top, nodes.rank0, nodes.ranks, nodes.scontrol)
    return v.verdict, v.phase


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Collect the bundle (a few seconds: two probes apart), attach it as `NAME.tar.gz`; an unreachable host is a
    clear error in the thread."""
    from bot.services.bundles import CollectError  # here: the services import the SSH library and the database

    args.no_kwargs(call, USAGE)
    if len(call.args) > 1:
        raise args.bad("name at most one launch", USAGE)
    la = args.launch(ctx, call.args[0] if call.args else None, USAGE)  # reads only: the only live launch will do
    try:
        bundle = await ctx.services.bundles.collect(launch=la, user=ctx.user, channel=ctx.channel)
    except CollectError as e:
        raise UserError(f"Bundle of {la.name}", str(e), audit="error", thread_ts=ctx.thread_for(la),
                        launch_id=la.id) from None
    verdict, phase = offline_verdict(bundle)
    msg = ctx.services.renderer.notice(
        f"Bundle of {la.name}",
        f"{len(bundle.files)} files from {bundle.host}, redacted; diagnosed offline: {verdict}"
        + (f" in {phase}" if phase else "") + f". Unpack and run `gpubot diagnose {bundle.name}`.")
    msg.files.append((f"{bundle.name}.tar.gz", bundle.tar_gz()))
    return ctx.reply(msg, launch=la)


COMMAND = CommandSpec("bundle", handle, Role.OPERATOR, USAGE,
                      "collect a diagnose bundle of a launch (log, ps, GPUs, ports, stacks) as a tar.gz")
