"""Secrets never survive into anything posted."""

from __future__ import annotations

import string

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.models import GpuProcess, GpuReading, GpuSection, LogInfo, ProcessInfo, Snapshot
from bot.redact import MASK, redact
from bot.render import render
from bot.views import probe_view, status_view

CASES = [
    ("python -m vllm.entrypoints.openai.api_server --api-key sk-abcdefghijklmnopqrstu --port 8000",
     "sk-abcdefghijklmnopqrstu"),
    ("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUv python serve.py", "hf_AbCdEfGhIjKlMnOpQrStUv"),
    ("curl -H 'Authorization: Bearer abc.def.ghi-123456' http://x", "abc.def.ghi-123456"),
    ("SLACK_BOT_TOKEN=xoxb-1234-5678-abcdefgh gpubot run", "xoxb-1234-5678-abcdefgh"),
    ("server_args=ServerArgs(api_key='supersecret123', port=8000)", "supersecret123"),
    ("--password=hunter2hunter2", "hunter2hunter2"),
    ("DB_PASSWORD=p4ss", "p4ss"),
    ("git clone https://user:ghp_abcdefghijklmnopqrstuvwxyz0123@github.com/x", "ghp_abcdefghijklmnopqrstuvwxyz0123"),
    ("AWS_ACCESS_KEY_ID=AKIAABCDEFGHIJKLMNOP", "AKIAABCDEFGHIJKLMNOP"),
]


def test_known_secret_forms_are_masked_and_names_kept():
    for text, secret in CASES:
        out = redact(text)
        assert secret not in out, (text, out)
        assert MASK in out


def test_harmless_text_is_untouched():
    for text in ("--port 8000 --tp-size 8", "[TP0] Load weight end. avail mem=21.34 GB", "tokenizer_path='/x'",
                 "max_new_tokens=256 pad_token_id=0", "--max-tokens 100", "#tokens: 1000000"):
        assert redact(text) == text


def _snapshot(secret_args: str, secret_line: str) -> Snapshot:
    snap = Snapshot(host="h", clock=1000.0)
    snap.processes = [ProcessInfo(pid=10, ppid=1, pgid=10, sid=10, stat="Sl", args=secret_args)]
    snap.all_process_count = 1
    snap.gpu = GpuSection(ok=True, gpus=[GpuReading(index=0, name="NVIDIA H200", memory_used_mib=1,
                                                     memory_total_mib=2)],
                          processes=[GpuProcess(pid=10, used_memory_mib=1, gpu_index=0)])
    snap.log = LogInfo(path="/x.log", exists=True, size_bytes=1, mtime=999.0, lines=1, tail=[secret_line])
    snap.errors = [f"note {secret_line}"]
    return snap


_token = st.text(alphabet=string.ascii_letters + string.digits, min_size=20, max_size=40)


@settings(max_examples=300, deadline=None)
@given(tok=_token, kind=st.sampled_from(["hf_", "sk-", "xoxb-", "xapp-1-", "env", "flag", "bearer"]))
def test_planted_secrets_never_survive_any_template(tok, kind):
    if kind == "env":
        secret, args = tok, f"python serve.py OPENAI_API_KEY={tok}"
    elif kind == "flag":
        secret, args = tok, f"python -m sglang.launch_server --api-key {tok} --port 1"
    elif kind == "bearer":
        secret, args = tok, f"curl -H 'Authorization: Bearer {tok}' localhost"
    else:
        secret = kind + tok
        args = f"python serve.py {secret}"
    snap = _snapshot(args, f"ERROR auth failed for {args}")
    for msg in (render("probe", **probe_view(snap, "pgid=10")), render("status", **status_view([snap]))):
        assert secret not in msg.text
        assert secret not in str(msg.blocks)
