"""Phases by milestones (issue 24): each engine's real start-up log (tests/fixtures/startup/, copied from public
reports, with the phases a reader sees in it written down beside it in expected.json by someone who had not read
the rules) gives its phases in order, line by line: the phase `scan_log` reports for every prefix of the log
never goes back, and the phases it passes through are the expected ones, in that order."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.core.diagnose import SIGNATURES, scan_log

STARTUP = Path(__file__).resolve().parents[1] / "fixtures" / "startup"
EXPECTED: dict = json.loads((STARTUP / "expected.json").read_text())

#: Where gpubot's reading differs from the one written beside the logs, the phases it gives and why. Strict: a log
#: that comes to agree fails the test until it is taken off this list.
DISAGREE = {
    "sglang.log": (["comm_init", "weight_loading", "kv_cache_alloc", "cuda_graph_capture", "warmup", "serving"],
                   "SGLang's HTTP server listens before its own warm-up request: gpubot keeps the launch in warmup "
                   "(from the scheduler's `max_total_num_tokens=` line) until it serves; serving is always last"),
    "vllm-v1.log": (["comm_init", "weight_loading", "kv_cache_alloc", "cuda_graph_capture", "warmup", "serving"],
                    "vLLM V1 runs torch.compile inside the memory-profiling run that sizes the KV cache, so its "
                    "compile lines are kv_cache_alloc (with a 20-minute grace); `init engine (profile, create kv "
                    "cache, warmup model) took` and the API server's start are warmup"),
}


def phases_seen(lines: list[str]) -> list[str]:
    """The phases scan_log reports as the log grows one line at a time (its phase, or the phase it finished), a
    phase repeated only when another came between (so a phase that goes back shows)."""
    seen: list[str] = []
    for n in range(1, len(lines) + 1):
        scan = scan_log(lines[:n])
        phase = scan.phase or scan.finished_phase
        if phase is not None and (not seen or seen[-1] != phase):
            seen.append(phase)
    return seen


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_an_engine_s_real_start_up_log_gives_its_phases_in_order(name):
    lines = (STARTUP / name).read_text(encoding="utf-8", errors="replace").splitlines()
    seen = phases_seen(lines)
    order = scan_log(lines).phase_order  # the engine's own start-up order, where it has one
    assert seen == sorted(seen, key=order.index), f"{name}: the phase went back: {seen} (order {order})"
    if name in DISAGREE:
        ours, why = DISAGREE[name]
        assert seen != EXPECTED[name]["phases"], f"{name} now agrees with expected.json: take it off DISAGREE"
        assert seen == ours, f"{name}: {seen} ({why})"
    else:
        assert seen == EXPECTED[name]["phases"], f"{name}: {seen} (expected {EXPECTED[name]['phases']})"


def test_every_engine_with_a_milestone_table_has_a_start_up_log():
    engines = {name.split(".")[0].split("-")[0] for name in EXPECTED}
    assert {"sglang", "vllm", "tgi", "trtllm", "llamacpp", "lmdeploy", "generic"} <= engines, engines


def test_tgi_and_trtllm_read_their_phases_in_their_own_order_and_others_in_the_common_one():
    def order(text: str) -> tuple[str, ...]:
        return scan_log(text.splitlines()).phase_order

    tgi = order("2025-04-14T15:51:57Z INFO text_generation_launcher: Starting Webserver")
    assert tgi.index("warmup") < tgi.index("kv_cache_alloc")
    trt = order("[TensorRT-LLM][INFO] Refreshed the MPI local session")
    assert trt.index("warmup") < trt.index("cuda_graph_capture")
    assert order("[2025-03-08 12:29:11 TP3] Init torch distributed begin.") == SIGNATURES.phase_order


def test_a_phase_order_that_is_not_every_phase_once_is_refused():
    from bot.core.diagnose import load_signatures
    from bot.core.diagnose.signatures import _engine_parts

    with pytest.raises(ValueError, match="phase_order: must list the phases"):
        _engine_parts({"e": {"phase_order": ["comm_init", "serving"]}}, SIGNATURES.phase_order)
    assert load_signatures().engine_order["tgi"][2] == "warmup"
