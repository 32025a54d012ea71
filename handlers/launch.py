"""`/launch VARIANT [host=HOST] [param=value ...]`: pre-launch checks, then the server in its own session,
with its own incident thread (a root message in the channel, edited in place as the state changes)."""

from __future__ import annotations

from bot.core.commands import slash
from bot.core.grammar import CommandCall
from bot.core.lifecycle import LaunchError
from bot.present.views import launch_outcome_view
from handlers import args
from handlers.context import Context, Role
from handlers.reply import Reply, UserError
from handlers.spec import CommandSpec

USAGE = slash("launch", "VARIANT [host=HOST] [param=value ...]")


async def handle(call: CommandCall, ctx: Context) -> Reply:
    """Start one launch of a variant; the answer goes into its new thread. Refusals say what holds what."""
    if len(call.args) != 1:
        known = ", ".join(ctx.config.variants) or "(none configured)"
        flags = [a for a in call.args[1:] if a.startswith("-")]
        if flags:  # `--flag=value` is a word here: params are `name=value`
            raise args.bad(f"`{flags[0][:40]}` is not a param: params are written `name=value`, without dashes",
                           f"{USAGE}. Variants: {known}")
        raise args.bad("name exactly one variant", f"{USAGE}. Variants: {known}")
    variant = call.args[0]
    params = dict(call.kwargs)
    host = params.pop("host", None)
    try:
        outcome = await ctx.services.launches.launch(variant, params, user=ctx.user, channel=ctx.channel, host=host)
    except LaunchError as e:
        raise UserError("Cannot launch", str(e), f"Usage: {USAGE}", audit="invalid") from None
    msg = ctx.render("launch_result", **launch_outcome_view(outcome, variant, host))
    audit = "started" if outcome.ok else ("refused" if outcome.launch is None and outcome.error is None else "failed")
    detail = ("; ".join(outcome.checks.problems) or outcome.error
              or ("exited right after it started" if outcome.exited_early else None))
    return ctx.reply(msg, launch=outcome.launch, audit=audit, detail=detail)


COMMAND = CommandSpec(
    "launch", handle, Role.OPERATOR, USAGE, "start a server variant in its own session, with an incident thread",
    slash="launch", description="Launch a server variant in its own session, with an incident thread",
    hint="VARIANT [host=HOST] [param=value ...]",
)
