"""Tests for bot.core.grammar with the vocabulary of the command table: slash commands, mentions, prefix
messages, quoting, Slack escapes, every command on every route, fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.config import NAME_RE, Config
from bot.core.grammar import MAX_COMMAND_CHARS, CommandCall, CommandParseError, strip_mention
from handlers import COMMANDS, grammar
from handlers.derive import slash_keys

BOT = "UBOT123"
G = grammar(Config())
parse_slash = G.parse_slash
#: Slash command -> the command it runs when its text names none.
SLASH_DEFAULTS = {f"/{key}": default for key, (default, _router) in slash_keys().items()}
#: Every command name and alias: each is a `/gpu` subcommand and a `!`/mention word.
GPU_SUBCOMMANDS = sorted(G.vocabulary.words)


def msg(text: str, bot: str | None = BOT, prefix: str = "!") -> CommandCall | None:
    return G.parse_message(text, bot_user_id=bot, prefix=prefix)


# --- slash commands -------------------------------------------------------------------------------


def test_gpu_empty_is_status():
    call = parse_slash("/gpu", "")
    assert call.name == "status" and call.args == [] and call.kwargs == {} and call.flags == set()
    assert parse_slash("/gpu", None).name == "status"  # type: ignore[arg-type]
    assert parse_slash("/gpu", "   ").name == "status"


def test_gpu_status_all():
    call = parse_slash("/gpu", "status all")
    assert (call.name, call.args, call.kwargs) == ("status", ["all"], {})
    assert call.raw == "/gpu status all"  # as typed, with its slash command
    assert call.word == "status"


def test_gpu_status_host():
    call = parse_slash("/gpu", "status h1")
    assert (call.name, call.args) == ("status", ["h1"])


def test_gpu_probe():
    call = parse_slash("/gpu", "probe h1 pgid=5")
    assert (call.name, call.args, call.kwargs) == ("probe", ["h1"], {"pgid": "5"})


def test_gpu_help():
    call = parse_slash("/gpu", "help")
    assert call.name == "help" and call.args == []


def test_gpubot_empty_is_help():
    assert parse_slash("/gpubot", "").name == "help"


def test_probe_slash():
    call = parse_slash("/probe", "h1 pid=3 log=/x")
    assert (call.name, call.args, call.kwargs) == ("probe", ["h1"], {"pid": "3", "log": "/x"})
    assert call.raw == "/probe h1 pid=3 log=/x"


def test_probe_slash_no_host():
    call = parse_slash("/probe", "pgid=123")
    assert (call.name, call.args, call.kwargs) == ("probe", [], {"pgid": "123"})


def test_probe_first_word_is_not_a_subcommand():
    # /probe never reinterprets its first word: "status" is a host-name argument here
    call = parse_slash("/probe", "status")
    assert (call.name, call.args) == ("probe", ["status"])


def test_gpu_host_word_kept():
    call = parse_slash("/gpu", "gpu-host-1")
    assert call.name == "gpu-host-1"
    assert call.word == "gpu-host-1"
    assert call.args == []


def test_gpu_host_word_keeps_case():
    call = parse_slash("/gpu", "GPU-Host-1 extra")
    assert call.name == "gpu-host-1"
    assert call.word == "GPU-Host-1"
    assert call.args == ["extra"]


def test_gpu_kwarg_first_goes_to_default():
    call = parse_slash("/gpu", "pgid=5")
    assert call.name == "status" and call.kwargs == {"pgid": "5"}


def test_gpu_flag_first_goes_to_default():
    call = parse_slash("/gpu", "--yes")
    assert call.name == "status" and call.flags == {"yes"}


def test_slash_command_name_case_and_spaces():
    assert parse_slash("/GPU", "status").name == "status"
    assert parse_slash(" /probe ", "h1").name == "probe"


def test_subcommand_case_insensitive():
    call = parse_slash("/gpu", "PROBE h1")
    assert call.name == "probe" and call.word == "PROBE"


@pytest.mark.parametrize("cmd", sorted(SLASH_DEFAULTS))
def test_every_slash_command_has_default(cmd):
    call = parse_slash(cmd, "")
    assert call.name == SLASH_DEFAULTS[cmd]


def test_unknown_slash_command():
    with pytest.raises(CommandParseError, match="unknown slash command /deploy"):
        parse_slash("/deploy", "x")


def test_flags():
    call = parse_slash("/probe", "h1 --yes --dry-run pid=1")
    assert call.flags == {"yes", "dry-run"}
    assert call.args == ["h1"]
    assert call.kwargs == {"pid": "1"}


@pytest.mark.parametrize("word", ["--", "--Yes", "--1x", "-y", "--a_b"])
def test_non_flags_are_args(word):
    call = parse_slash("/probe", f"h1 {word}")
    assert call.flags == set()
    assert call.args == ["h1", word]


def test_kwargs_normalised():
    call = parse_slash("/probe", "h1 Health-Path=/h LOG=/a")
    assert call.kwargs == {"health_path": "/h", "log": "/a"}


def test_kwarg_value_may_contain_equals_and_be_empty():
    call = parse_slash("/probe", "h1 match=a=b log=")
    assert call.kwargs == {"match": "a=b", "log": ""}


def test_duplicate_key_is_error():
    with pytest.raises(CommandParseError, match="pid= given twice"):
        parse_slash("/probe", "h1 pid=1 pid=2")


def test_duplicate_key_after_normalisation_is_error():
    with pytest.raises(CommandParseError, match="health_path= given twice"):
        parse_slash("/probe", "h1 health-path=/a HEALTH_PATH=/b")


def test_quoted_values():
    call = parse_slash("/probe", "h1 match='python -m sglang' log=\"/data/my logs/x.log\"")
    assert call.kwargs == {"match": "python -m sglang", "log": "/data/my logs/x.log"}


@pytest.mark.parametrize("text", ["h1 match='unclosed", 'h1 match="unclosed', "h1 trailing\\"])
def test_unbalanced_quotes(text):
    with pytest.raises(CommandParseError) as ei:
        parse_slash("/probe", text)
    message = str(ei.value)
    assert message.startswith("could not parse the command: ")
    assert "check your quotes" in message


def test_nul_is_error():
    with pytest.raises(CommandParseError, match="NUL"):
        parse_slash("/probe", "h1 match=a\x00b")
    with pytest.raises(CommandParseError, match="NUL"):
        msg("!probe h1\x00")


def test_too_long_is_error():
    text = "h1 match=" + "a" * (MAX_COMMAND_CHARS)
    with pytest.raises(CommandParseError, match=rf"too long \({len(text)} characters; at most {MAX_COMMAND_CHARS}\)"):
        parse_slash("/probe", text)


def test_exactly_max_length_ok():
    text = "h1 match=" + "a" * (MAX_COMMAND_CHARS - len("h1 match="))
    assert len(text) == MAX_COMMAND_CHARS
    assert parse_slash("/probe", text).kwargs["match"] == "a" * (MAX_COMMAND_CHARS - 9)


def test_slack_entities_unescaped():
    call = parse_slash("/probe", "h1 match=&lt;init&gt; log=/a&amp;b")
    assert call.kwargs == {"match": "<init>", "log": "/a&b"}


def test_slack_entities_unescaped_once():
    # "&amp;lt;" is how Slack sends a literal "&lt;": it must become "&lt;", not "<"
    call = parse_slash("/probe", "h1 match=&amp;lt;")
    assert call.kwargs == {"match": "&lt;"}


def test_smart_quotes():
    call = parse_slash("/probe", "h1 match=\u201cpython -m vllm\u201d log=\u2018/a b\u2019")
    assert call.kwargs == {"match": "python -m vllm", "log": "/a b"}


def test_raw_keeps_original_text():
    text = "h1 match=&lt;x&gt;"
    assert parse_slash("/probe", text).raw == f"/probe {text}"


def test_shell_metacharacters_are_plain_text():
    call = parse_slash("/probe", "h1 match='$(id)' log=/tmp/`x` ; rm")
    assert call.kwargs == {"match": "$(id)", "log": "/tmp/`x`"}
    assert call.args == ["h1", ";", "rm"]


def test_hash_is_not_a_comment():
    call = parse_slash("/probe", "h1 match=#1 #2")
    assert call.kwargs == {"match": "#1"} and call.args == ["h1", "#2"]


def test_bad_command_name():
    with pytest.raises(CommandParseError, match="is not a command name"):
        parse_slash("/gpu", "$(reboot)")


@pytest.mark.parametrize("host", ["gpu01.example.com", "8xh200", "h200-node-with-a-rather-long-name-01"])
def test_gpu_host_shorthand_accepts_every_valid_host_name(host):
    assert NAME_RE.match(host)
    call = parse_slash("/gpu", host)
    assert call.word == host


# --- messages -------------------------------------------------------------------------------------


def test_mention_probe():
    call = msg(f"<@{BOT}> probe h1 pgid=123")
    assert call is not None
    assert (call.name, call.args, call.kwargs) == ("probe", ["h1"], {"pgid": "123"})
    assert call.raw == f"<@{BOT}> probe h1 pgid=123"


def test_mention_with_label_and_spaces():
    call = msg(f"  <@{BOT}|gpubot>   status   h1 ")
    assert call is not None and (call.name, call.args) == ("status", ["h1"])


def test_mention_other_user_is_not_for_us():
    assert msg("<@UOTHER> probe h1") is None


def test_mention_without_known_bot_id_accepts_any():
    call = msg("<@UANY> probe h1", bot=None)
    assert call is not None and call.name == "probe"


def test_mention_alone_is_help():
    call = msg(f"<@{BOT}>")
    assert call is not None and call.name == "help" and call.args == []


def test_mention_gpu_forms():
    c1 = msg(f"<@{BOT}> gpu status all")
    assert c1 is not None and (c1.name, c1.args) == ("status", ["all"])
    c2 = msg(f"<@{BOT}> gpu h1")  # an unknown word after `gpu`: the dispatcher reads it as a host
    assert c2 is not None and (c2.name, c2.word, c2.args) == ("h1", "h1", [])
    c3 = msg(f"<@{BOT}> /probe h1")
    assert c3 is not None and (c3.name, c3.args) == ("probe", ["h1"])


def test_mention_later_in_text_is_not_a_command():
    assert msg(f"hey <@{BOT}> probe h1") is None


def test_prefix_probe():
    call = msg("!probe h1 pgid=123")
    assert call is not None and (call.name, call.args, call.kwargs) == ("probe", ["h1"], {"pgid": "123"})


def test_prefix_gpu_status():
    call = msg("!gpu status")
    assert call is not None and call.name == "status" and call.args == []


def test_prefix_gpu_alone_is_status_and_gpubot_is_help():
    c = msg("!gpu")
    assert c is not None and c.name == "status"
    c = msg("!gpubot")
    assert c is not None and c.name == "help"


def test_prefix_gpu_subcommands():
    for sub in ("status", "probe", "help"):
        assert sub in GPU_SUBCOMMANDS
        c = msg(f"!gpu {sub} h1")
        assert c is not None and c.name == sub and c.args == ["h1"]


def test_prefix_with_leading_whitespace():
    c = msg("   !probe h1")
    assert c is not None and c.name == "probe"


@pytest.mark.parametrize("text", ["! probe h1", "!", "!\tprobe", "!\nprobe"])
def test_prefix_followed_by_space_is_not_a_command(text):
    assert msg(text) is None


@pytest.mark.parametrize("text", ["hello team", "the GPU is stuck", "probe h1", "", "   ", "gpu status"])
def test_plain_messages_are_ignored(text):
    assert msg(text) is None


def test_custom_prefix_and_empty_prefix():
    c = msg("?probe h1", prefix="?")
    assert c is not None and c.name == "probe"
    assert msg("!probe h1", prefix="?") is None
    assert msg("probe h1", prefix="") is None


def test_message_flags_and_quotes():
    c = msg("!probe h1 match=\u201csglang serve\u201d --yes")
    assert c is not None and c.kwargs == {"match": "sglang serve"} and c.flags == {"yes"}


def test_message_unbalanced_quote_is_error():
    with pytest.raises(CommandParseError, match="check your quotes"):
        msg(f"<@{BOT}> probe h1 match='oops")


def test_message_duplicate_key_is_error():
    with pytest.raises(CommandParseError, match="given twice"):
        msg("!probe h1 port=1 port=2")


def test_message_too_long_is_error():
    with pytest.raises(CommandParseError, match="too long"):
        msg("!probe " + "x" * MAX_COMMAND_CHARS)


def test_message_slack_escapes():
    c = msg("!probe h1 match=&lt;@U1&gt;&amp;")
    assert c is not None and c.kwargs == {"match": "<@U1>&"}


def test_strip_mention():
    assert strip_mention("<@U1ABC> hi") == ("U1ABC", "hi")
    assert strip_mention("<@U1ABC|name>hi") == ("U1ABC", "hi")
    assert strip_mention("hi <@U1ABC>") == (None, "hi <@U1ABC>")
    assert strip_mention("") == (None, "")
    assert strip_mention(None) == (None, "")  # type: ignore[arg-type]


# --- fuzzing --------------------------------------------------------------------------------------

_SPECIAL = [*"ab =\"'\\!<@>|&;ltgmp-/#$`\t\n", "\u201c", "\u201d", "\u2018", "\u2019", "\x00", "&lt;", "&amp;",
            "<@UBOT123>", "probe", "gpu", "--yes", "pid="]
_texts = st.one_of(
    st.text(max_size=120),
    st.lists(st.sampled_from(_SPECIAL), max_size=40).map("".join),
    st.integers(MAX_COMMAND_CHARS - 3, MAX_COMMAND_CHARS + 3).map(lambda n: ("ab c=d " * n)[:n]),
)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([*SLASH_DEFAULTS, "/GPU", " /probe", "/nope", ""]), _texts)
def test_fuzz_parse_slash_only_raises_parse_error(command, text):
    try:
        call = parse_slash(command, text)
    except CommandParseError as e:
        assert str(e)
        return
    assert isinstance(call, CommandCall)
    assert call.name == call.name.lower()
    assert all(isinstance(a, str) for a in call.args)
    assert all(k == k.lower() and "-" not in k for k in call.kwargs)


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_texts, _texts.map(lambda t: "!" + t), _texts.map(lambda t: f"<@{BOT}> " + t)),
       st.sampled_from([BOT, None]), st.sampled_from(["!", "", "?", "gpu:"]))
def test_fuzz_parse_message_only_raises_parse_error(text, bot, prefix):
    try:
        call = G.parse_message(text, bot_user_id=bot, prefix=prefix)
    except CommandParseError as e:
        assert str(e)
        return
    assert call is None or (isinstance(call, CommandCall) and call.name == call.name.lower())


async def test_superscript_digits_are_not_numbers_anywhere(make_bot, tmp_path):
    """'²'.isdigit() is True but int('²') raises: every numeric argument must refuse it with a message."""
    cfg = Config(hosts={"h": {"address": "127.0.0.1", "known_hosts": "/nonexistent"}}, state_dir=str(tmp_path),
                 permissions={"operators": ["U0OPERATOR"]})
    bot = await make_bot(cfg)
    for text, expected in [("/probe h pid=²", "pid= must be a positive integer"), ("/kill pid=²", "pid= must be"),
                           ("!logs 1 ²", "Cannot pick a launch"), ("!snooze ²", "Cannot pick a launch"),
                           ("!confirm ²", "must be")]:
        answer = await bot.chat.say(text)
        assert answer is not None and expected in answer.text, (text, answer.text if answer else None)
        assert answer.audit in ("invalid", "refused"), (text, answer.audit)


# --- every command of the table, on every route -----------------------------------------------------

ROUTE_ARGS = "x1 k=v --f"


def _routes(word: str, own_slash: str | None) -> list[tuple[str, CommandCall | None]]:
    """Every way to type command `word` with ROUTE_ARGS, and what the grammar makes of it."""
    out = [(f"/gpu {word}", G.parse_slash("/gpu", f"{word} {ROUTE_ARGS}")),
           (f"/gpubot {word}", G.parse_slash("/gpubot", f"{word} {ROUTE_ARGS}")),
           (f"!{word}", msg(f"!{word} {ROUTE_ARGS}")),
           (f"!gpu {word}", msg(f"!gpu {word} {ROUTE_ARGS}")),
           (f"!gpubot {word}", msg(f"!gpubot {word} {ROUTE_ARGS}")),
           (f"@gpubot {word}", msg(f"<@{BOT}> {word} {ROUTE_ARGS}")),
           (f"@gpubot gpu {word}", msg(f"<@{BOT}> gpu {word} {ROUTE_ARGS}")),
           (f"{word} (console, buttons)", G.parse_command(f"{word} {ROUTE_ARGS}"))]
    if own_slash:
        out.append((f"/{own_slash}", G.parse_slash(f"/{own_slash}", ROUTE_ARGS)))
    return out


@pytest.mark.parametrize("spec", COMMANDS, ids=lambda s: s.name)
def test_every_command_means_the_same_on_every_route(spec):
    for word in (spec.name, *spec.aliases, spec.name.upper()):
        for route, call in _routes(word, spec.slash if word == spec.name else None):
            assert call is not None, route
            assert (call.name, call.args, call.kwargs, call.flags) == (spec.name, ["x1"], {"k": "v"}, {"f"}), route


def test_gpu_snooze_is_snooze_on_every_route():
    """The drift that made `!gpu snooze 5` mean `/gpu status snooze`: one vocabulary now serves every route."""
    calls = [G.parse_slash("/gpu", "snooze 5"), msg("!gpu snooze 5"), msg("!snooze 5"), msg(f"<@{BOT}> gpu snooze 5")]
    assert {(c.name, tuple(c.args)) for c in calls if c is not None} == {("snooze", ("5",))}


@pytest.mark.parametrize("spec", [c for c in COMMANDS if c.default_of or c.slash], ids=lambda s: s.name)
def test_slash_commands_default_to_their_command(spec):
    for key in filter(None, (spec.default_of, spec.slash)):
        call = G.parse_slash(f"/{key}", "k=v")
        assert (call.name, call.kwargs) == (spec.name, {"k": "v"})


def test_renamed_slash_commands_for_a_second_install():
    g = grammar(Config(slack={"slash_commands": {"gpu": "/gpu-staging", "kill": "/kill-staging"}}))
    assert g.parse_slash("/gpu-staging", "snooze 5").name == "snooze"
    assert g.parse_slash("/kill-staging", "12 --yes").args == ["12"]
    assert g.parse_slash("/probe", "h1").name == "probe"  # not renamed: its default name
    with pytest.raises(CommandParseError):
        g.parse_slash("/gpu", "status")  # the other install's command
    with pytest.raises(CommandParseError):
        g.parse_slash("/kill", "12")
    # in messages the router works under its new name only: `!gpu` is the other install's
    assert g.parse_message("!gpu-staging snooze 5", bot_user_id=None).name == "snooze"
    assert g.parse_message("!gpu snooze 5", bot_user_id=None).name == "gpu"  # not a command here
    assert not g.addresses("!gpu snooze 5", "!")


def test_chat_that_names_no_command_is_not_addressed():
    for text in ["!important: prod is down", "!nice one", "!don't do that", "!status: prod is down", "!help, anyone?",
                 "!kill. please no"]:
        assert not G.addresses(text, "!", ["gpu-host-1"]), text
    for text in ["!help", "!gpu", "!snooze 5", "!stackdump", "!gpu-host-1", "!KILL 3"]:
        assert G.addresses(text, "!", ["gpu-host-1"]), text
