"""`!stack [LAUNCH] [--native]`: py-spy stack dump of every process of a launch, summarised in the thread
with the full dump attached."""

from __future__ import annotations

from bot.core.commands import thread
from bot.core.grammar import CommandCall
from bot.present.stackdump import stack_dump_message
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

USAGE = thread("stack", "[LAUNCH] [--native]")


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Dump the launch's processes; missing py-spy, missing ptrace permission and sudo refusals each get a
    clear message per process."""
    from bot.services.stacks import StackDumpError  # here: the services import the SSH library and the database

    args.no_kwargs(call, USAGE)
    if len(call.args) > 1:
        raise args.bad("name at most one launch", USAGE)
    la = args.launch(ctx, call.args[0] if call.args else None, USAGE)  # reads only: the only live launch will do
    native = "native" in call.flags
    try:
        dump = await ctx.services.stacks.dump(la, native=native, user=ctx.user, channel=ctx.channel)
    except StackDumpError as e:
        raise UserError(f"Stack dump of {la.name}", str(e), audit="error", thread_ts=ctx.thread_for(la),
                        launch_id=la.id) from None
    msg = stack_dump_message(ctx.services.renderer, dump.host, dump.dumps, native=native)
    return ctx.reply(msg, launch=la, audit="ok" if dump.ok else "error")


COMMAND = CommandSpec("stack", handle, Role.OPERATOR, USAGE,
                      "py-spy stack dump of every process of a launch, as a file", aliases=("stackdump",),
                      flags=frozenset({"native"}))
