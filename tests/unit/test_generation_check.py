"""The generation check (issue 24): its config (presets, shorthand, custom path and body), the probe's request
validation and the script part run for real against a local HTTP server (the body reaches it intact, whatever
shell metacharacters it holds), when the watcher runs it (`generation_due`), how failures in a row count
(`generation_streak`), the liveness verdicts it gives (`judge_serving`), and the engine stats lines that show a
stuck engine behind a live /health (`stalled_stats`, in the liveness check and in `diagnose`)."""

from __future__ import annotations

import http.server
import json
import shutil
import threading
from typing import ClassVar

import pytest
from pydantic import ValidationError

from bot.config import VariantConfig
from bot.core.bundle import _observed
from bot.core.diagnose import Observation, diagnose, stalled_stats
from bot.core.probe import ProbeRequest, ProbeRequestError, assemble_snapshot, build_script, new_nonce, split_sections
from bot.core.records import CheckRecord
from bot.core.serving import generation_due, generation_streak, judge_serving
from tests.unit.test_probe_script import probe, run_sh

# --- config -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "path", "body"), [
    ("sglang", "/health_generate", None),
    ("openai", "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "temperature": 0}),
    ("tgi", "/generate", {"inputs": "Hi", "parameters": {"max_new_tokens": 1}}),
    ({"preset": "openai", "model": "qwen"}, "/v1/completions",
     {"prompt": "Hi", "max_tokens": 1, "temperature": 0, "model": "qwen"}),
    ({"path": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}},
     "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    ({"preset": "sglang", "path": "/generate_ping"}, "/generate_ping", None),
])
def test_a_generation_check_is_a_preset_or_a_path_and_body(value, path, body):
    check = VariantConfig.model_validate({"command": "x", "generate": value}).generate
    got_path, got_body = check.request()
    assert got_path == path
    assert (json.loads(got_body) if got_body is not None else None) == body


@pytest.mark.parametrize(("value", "message"), [
    ("vllm", "Input should be 'sglang', 'openai', 'tgi' or 'custom'"),
    ({"preset": "custom"}, "needs a `path`"),
    ({"path": "/v1/x y"}, "must be a path like /v1/completions"),
    ({"path": "http://evil/x"}, "must be a path like /v1/completions"),
    ({"preset": "openai", "timeout_s": 0}, "must be > 0"),
    ({"preset": "openai", "timeout_s": 0.5}, "must be 1..300 seconds"),
    ({"preset": "openai", "timeout_s": 301}, "must be 1..300 seconds"),
    ({"preset": "openai", "failures": 0}, "greater than or equal to 1"),
    ({"preset": "openai", "body": {"prompt": "x" * 5000}}, "at most 4096 characters"),
    ({"preset": "openai", "grace_s": -1}, "must be > 0"),
    ({"preset": "openai", "model": "m" * 201}, "at most 200 characters"),
])
def test_a_bad_generation_check_is_refused_with_a_message(value, message):
    with pytest.raises(ValidationError) as e:
        VariantConfig.model_validate({"command": "x", "generate": value})
    assert message in str(e.value)


def test_extends_keeps_the_parent_s_generation_check():
    from bot.config import Config

    cfg = Config.model_validate({"hosts": {"h": {"local": True}}, "variants": {
        "base": {"host": "h", "command": "x", "generate": "openai"},
        "child": {"extends": "base", "port": 8001},
        "other": {"extends": "base", "generate": {"preset": "sglang", "timeout_s": 5}}}})
    assert cfg.resolved_variant("child").generate.preset == "openai"
    other = cfg.resolved_variant("other").generate
    assert (other.preset, other.timeout_s) == ("sglang", 5.0)


# --- the probe's part -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    ({"generate_path": "/x y"}, "generation path"),
    ({"generate_path": "/" + "a" * 300}, "generation path"),
    ({"generate_path": "/g", "generate_body": "x" * 9000}, "at most 8192 bytes"),
    ({"generate_path": "/g", "generate_body": "a\x00b"}, "at most 8192 bytes"),
    ({"generate_path": "/g", "generate_body": "\ud800"}, "at most 8192 bytes"),
    ({"generate_path": "/g", "generate_timeout_s": 0.5}, "1..300 seconds"),
])
def test_a_bad_generation_request_is_refused(fields, message):
    with pytest.raises(ProbeRequestError, match=message):
        ProbeRequest(port=8000, **fields).validate()


class _Generate(http.server.BaseHTTPRequestHandler):
    """POST /v1/completions: 200 and the body it got is kept; GET /hang: no answer for 5 s; GET /health: 200."""

    bodies: ClassVar[list[bytes]] = []

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        type(self).bodies.append(self.rfile.read(n))
        self.send_response(200 if self.path == "/v1/completions" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        if self.path == "/hang":
            threading.Event().wait(5)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def generate_server():
    _Generate.bodies = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Generate)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _run(port: int, **fields):
    req, policy = probe(port=port, gpu=False, health_timeout_s=2, **fields)
    nonce = new_nonce()
    script = build_script(req, nonce, policy)
    return script, assemble_snapshot("local", req, split_sections(run_sh(script), nonce), policy=policy)


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_body_reaches_the_server_intact_whatever_shell_characters_it_holds(generate_server, tmp_path):
    pwned = tmp_path / "pwned"
    body = json.dumps({"prompt": f"it's $(touch {pwned}) `touch {pwned}` \"q\" \\ ; | & @x\n", "max_tokens": 1})
    script, snap = _run(generate_server, generate_path="/v1/completions", generate_body=body, generate_timeout_s=5)
    assert _Generate.bodies == [body.encode()]
    assert snap.generate is not None and snap.generate.status == "ok", snap.generate
    assert snap.health is not None and snap.health.status == "ok"
    assert "--data-binary @-" in script and not pwned.exists()


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_a_generation_that_does_not_answer_in_time_is_a_timeout_and_health_still_reads(generate_server):
    _script, snap = _run(generate_server, generate_path="/hang", generate_timeout_s=1)
    assert snap.generate is not None and snap.generate.status == "timeout", snap.generate
    assert snap.generate.url.endswith("/hang")
    assert snap.health is not None and snap.health.status == "ok"


def test_no_generation_part_unless_asked():
    req, policy = probe(port=8000, gpu=False)
    assert "b generate" not in build_script(req, new_nonce(), policy)


# --- when it runs, and how failures count -------------------------------------------------------------------


def rec(t: float, progress: float, generate: str | None = None, **kw) -> CheckRecord:
    return CheckRecord(t=t, last_progress_t=progress, generate=generate, **kw)


def test_it_runs_on_the_first_check_after_ready():
    assert generation_due([], step_s=60, grace_s=60, interval_s=600)


def test_it_runs_every_check_once_the_previous_check_found_the_log_silent_for_the_grace():
    # the log last moved at t=1000; the check at t=1070 found it silent for 70 s
    assert generation_due([rec(1000, 990, "ok"), rec(1070, 1000)], step_s=60, grace_s=60, interval_s=600)
    # with the defaults (grace 60 s, a check every 60 s), a log that moves between checks does not make it run
    assert not generation_due([rec(1000, 990, "ok"), rec(1060, 1059)], step_s=60, grace_s=60, interval_s=600)


def test_while_the_log_moves_it_waits_for_its_interval():
    recent = [rec(1000, 1000, "ok"), rec(1060, 1059), rec(1120, 1119)]
    assert not generation_due(recent, step_s=60, grace_s=300, interval_s=600)
    assert not generation_due([*recent, rec(1500, 1499)], step_s=60, grace_s=300, interval_s=600)  # 500 + 60 < 600
    assert generation_due([*recent, rec(1560, 1559)], step_s=60, grace_s=300, interval_s=600)  # 560 + 60 >= 600


def test_after_a_failure_it_runs_until_it_answers_again():
    assert generation_due([rec(1000, 1000, "timeout"), rec(1060, 1059)], step_s=60, grace_s=300, interval_s=600)


def test_a_failed_check_record_does_not_count():
    assert generation_due([CheckRecord.failed(1000, "unreachable")], step_s=60, grace_s=300, interval_s=600)


def test_the_streak_counts_generation_failures_in_a_row_skipping_checks_without_one():
    records = [rec(1, 1, "timeout"), rec(2, 2, "ok"), rec(3, 3, "timeout"), rec(4, 4), rec(5, 5, "http_500")]
    assert generation_streak(records) == 2
    assert generation_streak([*records, rec(6, 6, "ok")]) == 0
    assert generation_streak([rec(1, 1)]) == 0


# --- the verdicts ------------------------------------------------------------------------------------------------


def serving_obs(**kw) -> Observation:
    base = {"process_alive": True, "port_open": True, "health": "ok", "log_silent_s": 120.0, "log_lines": []}
    return Observation(**{**base, **kw})


def judge(obs: Observation, states: list[str | None], **kw):
    records = [rec(float(i), 0.0, s, health="ok", port_open=True) for i, s in enumerate(states)]
    return judge_serving(obs, [], records, failures_needed=3, hang_silence_s=60, **kw)


def test_health_ok_while_generation_times_out_twice_with_a_silent_log_is_a_serving_hang():
    v = judge(serving_obs(generate="timeout"), ["ok", "timeout", "timeout"], generate_failures=2)
    assert (v.verdict, v.phase) == ("silent_hang", "serving"), v
    assert v.summary.startswith("Serving hang: the health endpoint answers, but generation times out (2 checks")
    assert "the generation check failed 2 checks in a row (now: timed out)" in v.evidence


def test_one_generation_timeout_is_not_yet_an_alert():
    v = judge(serving_obs(generate="timeout"), ["ok", "timeout"], generate_failures=2)
    assert v.verdict == "ready" and "generation check: timed out" in v.evidence


def test_a_generation_timeout_while_the_log_moves_is_a_busy_server_not_an_alert():
    v = judge(serving_obs(generate="timeout", log_silent_s=5.0), ["timeout", "timeout"], generate_failures=2)
    assert (v.verdict, v.phase) == ("ready", "serving"), v
    assert "generation check: timed out" in v.evidence


def test_sglang_s_503_from_health_generate_with_a_silent_log_is_a_serving_hang():
    v = judge(serving_obs(generate="http_503"), ["http_503", "http_503"], generate_failures=2)
    assert (v.verdict, v.phase) == ("silent_hang", "serving"), v


def test_a_generation_check_that_answers_500_is_unhealthy():
    v = judge(serving_obs(generate="http_500"), ["http_500", "http_500"], generate_failures=2)
    assert v.verdict == "unhealthy" and "(now: HTTP 500)" in v.summary


def test_a_generation_that_answers_is_ready_and_says_so():
    v = judge(serving_obs(generate="ok"), ["timeout", "ok"], generate_failures=1)
    assert v.verdict == "ready" and "generation check: ok" in v.evidence


def test_a_failing_health_endpoint_keeps_its_own_verdict():
    records = [rec(float(i), 0.0, "timeout", health="timeout", port_open=True) for i in range(3)]
    v = judge_serving(serving_obs(health="timeout", generate="timeout"), [], records, failures_needed=3,
                      hang_silence_s=60, generate_failures=2)
    assert v.verdict == "silent_hang" and "health endpoint times out" in v.summary


def test_the_observed_json_of_a_bundle_carries_the_generation_check():
    notes: list[str] = []
    obs = _observed({"process_alive": True, "health": "ok", "generate": "timeout"}, notes)
    assert obs["generate"] == "timeout" and not notes
    obs = _observed({"generate": "stuck"}, notes)
    assert "generate" not in obs and any("generate is not one of" in n for n in notes)


# --- stats lines that show a stuck engine ------------------------------------------------------------------

VLLM = ("INFO 05-11 18:07:{s:02d} [loggers.py:111] Engine 000: Avg prompt throughput: {p} tokens/s, Avg generation "
        "throughput: {g} tokens/s, Running: {r} reqs, Waiting: 0 reqs, GPU KV cache usage: 0.1%")
SGLANG = ("[2026-01-01 10:00:{s:02d} TP0] Decode batch. #running-req: {r}, #token: 900, token usage: 0.01, "
          "gen throughput (token/s): {g}, #queue-req: 0")
HEALTH = 'INFO:     127.0.0.1:41662 - "GET /health HTTP/1.1" 200 OK'


def vllm(s, g="0.0", r=1, p="0.0"):
    return VLLM.format(s=s, g=g, r=r, p=p)


@pytest.mark.parametrize(("lines", "stalled"), [
    ([vllm(0), HEALTH, vllm(10), HEALTH, vllm(20)], [4, 2, 0]),
    ([SGLANG.format(s=s, r=2, g="0.00") for s in (0, 10, 20)], [2, 1, 0]),
    ([vllm(0), vllm(10, g="35.2"), vllm(20), vllm(30)], []),  # the newest run is 2 lines: not enough
    ([vllm(0), vllm(10), vllm(20, r=0)], []),  # no request running at the newest
    ([vllm(0), vllm(10), vllm(20, p="120.5")], []),  # a long prompt being read is work
    # vLLM V1 counts prompt tokens only once a prefill completes: a KV-cache usage that grows is a long prefill
    ([VLLM.format(s=s, p="0.0", g="0.0", r=1).replace("0.1%", kv) for s, kv in ((0, "18.0%"), (10, "37.0%"),
                                                                               (20, "55.0%"))], []),
    ([HEALTH, HEALTH], []),
])
def test_stalled_stats_needs_the_newest_lines_to_show_requests_running_and_no_token(lines, stalled):
    got = stalled_stats(lines)
    assert (got if len(got) >= 3 else []) == stalled


def test_a_live_check_that_reads_stuck_stats_lines_is_a_serving_hang_though_health_answers():
    lines = [vllm(0), HEALTH, vllm(10), HEALTH, vllm(20), HEALTH]
    v = judge_serving(serving_obs(log_silent_s=0.0), lines, [rec(1.0, 1.0, health="ok")], failures_needed=3,
                      hang_silence_s=60)
    assert (v.verdict, v.phase) == ("silent_hang", "serving"), v
    assert "Running: 1 reqs" in v.evidence[0] and v.summary.endswith("while the health endpoint answers.")


def test_stats_lines_that_show_tokens_keep_a_live_check_ready():
    lines = [vllm(0, g="40.1"), HEALTH, vllm(10, g="39.7"), HEALTH, vllm(20, g="41.0")]
    v = judge_serving(serving_obs(log_silent_s=0.0), lines, [rec(1.0, 1.0, health="ok")], failures_needed=3,
                      hang_silence_s=60)
    assert v.verdict == "ready", v


def test_diagnose_a_request_taken_in_then_only_probes_for_the_grace_is_a_serving_hang():
    lines = ["INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)",
             "INFO 02-12 15:20:24 logger.py:37] Received request chatcmpl-1: prompt: 'hi', params: SamplingParams()",
             HEALTH, HEALTH]
    v = diagnose(serving_obs(log_lines=lines, log_silent_s=900.0))
    assert (v.verdict, v.phase) == ("silent_hang", "serving"), v
    text = "\n".join(v.evidence)
    assert "Received request chatcmpl-1" in text and '"GET /health HTTP/1.1" 200 OK' in text
    # the same log, not yet silent for the serving grace, is serving
    assert diagnose(serving_obs(log_lines=lines, log_silent_s=30.0)).verdict == "ready"
    # a line the engine logged for it after the request (a finished request), or the access line of its answer,
    # means it was served: an idle server after it is no hang
    done = [*lines[:2], "INFO 02-12 15:20:26 engine.py:267] Finished request chatcmpl-1.", *lines[2:]]
    assert diagnose(serving_obs(log_lines=done, log_silent_s=900.0)).verdict == "ready"
    answered = [*lines[:2], 'INFO:     10.0.0.5:33816 - "POST /v1/chat/completions HTTP/1.1" 200 OK', *lines[2:]]
    assert diagnose(serving_obs(log_lines=answered, log_silent_s=900.0)).verdict == "ready"


def test_diagnose_tgi_s_request_span_is_logged_when_it_ends_so_an_idle_tgi_is_serving():
    lines = ["2025-04-14T15:52:02Z INFO text_generation_router::server: router/src/server.rs:2266: Connected",
             '2025-04-14T15:53:00Z INFO generate{parameters=GenerateParameters { max_new_tokens: Some(20) } '
             'total_time="1.2s" validation_time="1ms" queue_time="0.1ms" inference_time="1.2s"}: '
             "text_generation_router::server: router/src/server.rs:322: Success"]
    assert diagnose(serving_obs(log_lines=lines, log_silent_s=3600.0)).verdict == "ready"


def test_diagnose_a_bundle_whose_generation_check_timed_out_with_a_silent_log_is_a_serving_hang():
    v = diagnose(serving_obs(generate="timeout", log_silent_s=1800.0, log_lines=[HEALTH]))
    assert (v.verdict, v.phase) == ("silent_hang", "serving"), v
    assert v.summary.startswith("Serving hang: the health endpoint answers, but generation gets no token")
    assert diagnose(serving_obs(generate="timeout", log_silent_s=10.0, log_lines=[HEALTH])).verdict == "ready"
    assert diagnose(serving_obs(generate="ok", log_silent_s=1800.0, log_lines=[HEALTH])).verdict == "ready"


def test_diagnose_a_warning_while_the_server_answers_is_no_failure():
    lines = ["[INFO] Listening on http://0.0.0.0:8080",
             "WARNING: failed to allocate 17088.03 MB of pinned memory: out of memory", "[INFO] request served"]
    assert diagnose(serving_obs(log_lines=lines, log_silent_s=1.0, health=None)).verdict == "ready"
    # the same warning from a server that died is still read
    gone = diagnose(Observation(log_lines=lines, process_alive=False))
    assert gone.verdict == "crashed" and "pinned memory" in gone.summary, gone  # host memory: no CUDA OOM


@pytest.mark.parametrize(("line", "verdict"), [
    ("gpu-host-1:2105:2301 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<43271> with status=12 "
     "opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 hca mlx5_0", "nccl_error"),
    ("[rank0]:[W311 18:21:36.413404 CUDAGuardImpl.h:122] Warning: CUDA warning: an illegal memory access was "
     "encountered (function destroyEvent)", "cuda_error"),
])
def test_diagnose_an_nccl_or_cuda_fault_logged_as_a_warning_while_serving_is_still_a_failure(line, verdict):
    lines = ["INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)", line, HEALTH]
    assert diagnose(serving_obs(log_lines=lines, log_silent_s=900.0)).verdict == verdict


# --- long blocks keep both ends ---------------------------------------------------------------------------


def test_a_long_traceback_keeps_its_outermost_and_innermost_frames_and_its_message():
    frames = [f'  File "/srv/app/mod{i}.py", line {i + 10}, in step_{i}\n    step_{i + 1}()' for i in range(20)]
    lines = ["[2026-01-01 10:00:00 TP0] Load weight begin. avail mem=70.00 GB", "Traceback (most recent call last):",
             *"\n".join(frames).splitlines(),
             "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. " + "detail " * 100 + "END"]
    v = diagnose(Observation(log_lines=lines, process_alive=False))
    assert v.verdict == "oom"
    text = "\n".join(v.evidence)
    chain = next(e for e in v.evidence if e.startswith("traceback ("))
    # the call path keeps both ends: where the program entered and where it failed, each with its code line
    assert chain.index("step_0: `step_1()`") < chain.index("…") < chain.index("step_19: `step_20()`"), chain
    # the over-long message line keeps its head (what failed) and its tail (its last words)
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in text and "END`" in text
    assert "Traceback (most recent call last)" not in text


def test_a_hang_counts_only_the_checks_that_got_no_token_and_an_error_gets_its_own_next_steps():
    v = judge(serving_obs(generate="timeout"), ["http_500"] * 12 + ["timeout", "timeout"], generate_failures=2)
    assert v.verdict == "silent_hang" and "(2 checks in a row)" in v.summary, v
    v = judge(serving_obs(generate="http_500"), ["timeout", "http_500", "http_500"], generate_failures=2)
    assert v.verdict == "unhealthy" and "3 checks in a row" in v.summary  # any failure counts here
    assert not any("health endpoint fails" in s for s in v.next_steps), v.next_steps
    assert any("one-token request fails" in s for s in v.next_steps)
