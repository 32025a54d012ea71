"""A bundle of a launch across nodes (bot.core.bundle.node_bundles, bot.core.ranks.weigh_bundle, read from disk by
bot.adapters.bundle.read_nodes and `gpubot diagnose`): rank 0's files at the top, each other rank's in
`node-NAME/`, `ranks.txt`, and a Slurm job's `scontrol show job -o` in `scontrol.txt`; the verdict names the odd
rank with its node, and Slurm's word on an ended or pending job wins."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bot.adapters.bundle import read_bundle, read_nodes
from bot.cli import main as cli_main
from bot.core.bundle import node_bundles, observation_from_files
from bot.core.diagnose import diagnose
from bot.core.ranks import parse_ranks, weigh_bundle

SLURM = Path(__file__).parent.parent / "fixtures" / "slurm"
RANK0_LOG = ("[2026-12-01 10:00:00 TP0] Load weight begin. avail mem=139.00 GB\n"
             "[2026-12-01 10:02:00 TP0] Load weight end. type=X, dtype=torch.bfloat16, avail mem=60.00 GB, "
             "mem usage=79.00 GB.\n")
RANK1_LOG = "[2026-12-01 10:00:00 TP8] Load weight begin. avail mem=139.00 GB\n"


def _files(rank1_silent: float = 900.0, rank0_silent: float = 780.0) -> dict[str, str]:
    def observed(silent: float) -> str:
        return json.dumps({"elapsed_s": 930, "log_silent_s": silent, "log_growing": False, "process_alive": True,
                           "port_open": False, "health": "refused"})
    return {"server.log": RANK0_LOG, "observed.json": observed(rank0_silent),
            "node-gpu-07/server.log": RANK1_LOG, "node-gpu-07/observed.json": observed(rank1_silent),
            "ranks.txt": "0 gpu-03\n1 gpu-07\n"}


def _weigh(files: dict[str, str]):
    top = observation_from_files(files)
    nodes = node_bundles(files)
    return weigh_bundle(diagnose(top), top, nodes.rank0, nodes.ranks, nodes.scontrol)


def test_ranks_txt_and_the_node_folders_are_read():
    assert parse_ranks("0 gpu-03\n1 gpu-07\nnot a line\n99999 x\n") == {0: "gpu-03", 1: "gpu-07"}
    nodes = node_bundles(_files())
    assert nodes and nodes.rank0 == "gpu-03"
    ((rank, node, obs),) = nodes.ranks
    assert (rank, node, obs.log_silent_s, obs.process_alive) == (1, "gpu-07", 900.0, True)
    assert not node_bundles({"server.log": RANK0_LOG})  # a bundle of one host has none


def test_the_rank_silent_first_is_named_with_its_node():
    v = _weigh(_files())
    assert v.verdict == "silent_hang", v
    assert "Odd one out: rank 1 on node gpu-07" in v.summary, v.summary
    assert v.evidence[0].startswith("rank 0 on gpu-03: running, log silent for 13m00s")
    assert v.evidence[1].startswith("rank 1 on gpu-07: running, log silent for 15m00s, last line `")
    # the same silence on both: nobody is named
    assert "Odd one out" not in _weigh(_files(rank1_silent=780.0)).summary


def test_slurms_word_wins_for_an_ended_or_pending_job():
    files = _files()
    files["scontrol.txt"] = (SLURM / "timeout.txt").read_text()
    v = _weigh(files)
    assert v.verdict == "time_limit" and "time limit" in v.summary
    assert v.evidence[0].startswith("`scontrol show job 3`: JobState=TIMEOUT Reason=TimeLimit")
    assert any(line.startswith("rank 1 on gpu-07") for line in v.evidence)
    files["scontrol.txt"] = (SLURM / "pending.txt").read_text()
    v = _weigh(files)
    assert v.verdict == "loading" and "Not a hang" in v.summary
    files["scontrol.txt"] = (SLURM / "running.txt").read_text()
    v = _weigh(files)
    assert v.verdict == "silent_hang" and v.evidence[2].startswith("`scontrol show job 5`: JobState=RUNNING")


def test_gpubot_diagnose_reads_the_node_folders_from_disk(tmp_path):
    for rel, text in _files().items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "node-gpu-09").mkdir()  # a folder with no bundle files is left out
    nodes = read_nodes(tmp_path)
    assert [(k, n) for k, n, _ in nodes.ranks] == [(1, "gpu-07")] and nodes.rank0 == "gpu-03"
    assert read_bundle(tmp_path).log_silent_s == 780.0
    result = CliRunner().invoke(cli_main, ["diagnose", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert got["verdict"] == "silent_hang" and "rank 1 on node gpu-07" in got["summary"]


def test_a_node_name_is_shown_inert_whatever_its_folder_or_ranks_txt_holds():
    from bot.core.ranks import node_label

    assert node_label("gpu-03\x1b[31m\nINJECTED\r") == "gpu-03INJECTED"
    assert node_label("\x07\x1b[2J") == "?" and len(node_label("n" * 500)) == 100
    assert parse_ranks("0 \x1b]0;title\x07gpu-01\n") == {0: "gpu-01"}
