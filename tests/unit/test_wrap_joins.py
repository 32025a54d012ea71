"""What the hard-wrap and outer-prefix readers must NOT do (from an adversarial review of issue 44's readers): join
genuine lines that only happen to share a length, take an engine's or the kernel's words for an outer prefix, or mix
two clocks. Each case is a shape real logs have; the reader must leave it as separate lines with its words."""

from __future__ import annotations

from bot.core.diagnose.lines import normalise

HEARTBEAT = ("INFO 06-30 13:54:%02d [loggers.py:118] Engine 000: Running: 0 reqs, Waiting: 0 reqs, "
             "GPU KV cache usage: 0.0%%")


def _texts(lines: list[str]) -> list[str]:
    return [x.text for x in normalise(lines)]


def test_an_exception_after_heartbeats_of_one_length_stays_its_own_line():
    lines = [HEARTBEAT % s for s in (10, 20, 30)] + ["ValueError: bad config value for max_model_len"]
    assert _texts(lines)[-1] == "ValueError: bad config value for max_model_len"
    assert len(_texts(lines)) == 4


def test_a_line_one_shorter_than_the_width_is_not_joined_to_a_capitalised_line():
    lines = [HEARTBEAT % s for s in (10, 20, 30)] + [(HEARTBEAT % 40)[:-1], "Killed"]
    assert _texts(lines)[-1] == "Killed"


def test_rows_padded_to_one_width_are_no_terminal_cut():
    rows = [f"{x:<120}" for x in ("INFO 06-30 13:54:10 [core.py:1] step", "INFO 06-30 13:54:11 [core.py:1] step two",
                                  "INFO 06-30 13:54:12 [core.py:1] step three")]
    lines = [*rows, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 960.00 MiB"]
    assert _texts(lines)[-1].startswith("torch.OutOfMemoryError")


def test_an_nvidia_smi_box_and_the_error_after_it_stay_apart():
    box = ["+-----------------------------------------------------------------------------------------+",
           "| NVIDIA-SMI 550.54.15              Driver Version: 550.54.15      CUDA Version: 12.4     |",
           "|-----------------------------------------+------------------------+----------------------+",
           "+-----------------------------------------------------------------------------------------+"]
    out = _texts([*box, "RuntimeError: CUDA error: an illegal memory access was encountered"])
    assert out[-1] == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_the_kernels_words_under_a_journal_prefix_are_kept():
    lines = [f"Mar 27 17:40:3{i} gpu-node-3 kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=1, name=python3"
             for i in range(3)]
    out = normalise(lines)
    assert len(out) == 3 and all(x.text.startswith("NVRM: Xid (PCI:0000:01:00): 79") for x in out)


def test_kubectl_stamps_give_every_line_one_clock():
    lines = ["2026-12-07T10:00:00.123456789Z INFO 12-07 10:00:00 [core.py:1] started",
             "2026-12-07T10:00:01.123456789Z some engine line without its own time",
             "2026-12-07T11:00:02.123456789Z RuntimeError: CUDA error: an illegal memory access was encountered"]
    out = normalise(lines)
    assert [x.ts_kind for x in out] == ["iso", "iso", "iso"]
    assert out[2].ts - out[0].ts == 3602.0
