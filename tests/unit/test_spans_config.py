"""Variants across nodes in the config: the checks of a Slurm variant and of a multi-host one (bot.config.checks.
spans_problems, through parse_config), the ranks' template variables (render_launch), and the batch script's rank
logs and tags (bot.core.slurm.batch_script), and how a node of a Slurm job that is no host of the config is reached
(HostService.job_node)."""

from __future__ import annotations

import shlex

import pytest

from bot.config import ConfigError, parse_config, render_launch
from bot.core.slurm import SbatchSpec, batch_script

HOST = {"address": "10.0.0.5", "user": "u", "known_hosts": "/etc/kh", "log_dirs": ["/logs"]}
CMD = "serve --nnodes {{ nnodes }} --node-rank {{ node_rank }} --dist-init-addr {{ master_addr }}:{{ master_port }}"


def _data(**variant) -> dict:
    return {"hosts": {"login": {**HOST, "runner": "slurm"}, "a": dict(HOST), "b": {**HOST, "address": "10.0.0.6"},
                      "c": {**HOST, "log_dirs": ["/other"]}},
            "variants": {"v": {"command": CMD, **variant}}}


def _errors(**variant) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        parse_config(_data(**variant))
    return ei.value.errors


def test_a_slurm_variant_and_a_multi_host_variant_are_valid():
    cfg = parse_config(_data(host="login", nodes=2, gpus_per_node=8, partition="gpu", time="4:00:00"))
    v = cfg.resolved_variant("v")
    assert cfg.runner_of(v) == "slurm" and v.master_port == 29500
    cfg = parse_config(_data(hosts=["a", "b"], gpus=[0, 1]))
    v = cfg.resolved_variant("v")
    assert cfg.runner_of(v) == "ssh" and v.host == "a"


@pytest.mark.parametrize(("variant", "words"), [
    ({"host": "login", "nodes": 2, "gpus": [0, 1]}, "gpus_per_node: Slurm picks a Slurm job's GPUs"),
    ({"host": "login", "nodes": 0}, "nodes"),
    ({"host": "login", "time": "soon"}, "time: must be minutes"),
    ({"host": "login", "extra_sbatch": ["--wrap=id"]}, "--wrap is (a prefix of) an option gpubot sets"),
    ({"host": "a", "nodes": 2}, "nodes: only a Slurm variant reads nodes"),
    ({"hosts": ["a", "nosuch"]}, "nosuch"),
    ({"hosts": ["a", "b"], "host": "b"}, "host: b is not the first of `hosts`"),
    ({"hosts": ["a", "c"]}, "need the same first `log_dirs` entry"),
    ({"hosts": ["a", "b"], "gpu_count": 2}, "gpu_count: a multi-host variant uses fixed `gpus`"),
])
def test_what_a_variant_across_nodes_may_not_say(variant, words):
    errors = _errors(**variant)
    assert any(words in e for e in errors), errors


def test_each_rank_renders_its_own_rank_the_first_hosts_address_and_a_log_beside_rank_0s():
    cfg = parse_config(_data(hosts=["a", "b"], gpus=[0]))
    r0 = render_launch(cfg, "v", {}, launch_id=3, host="a", tag="3-0123456789ab", rank=0)
    r1 = render_launch(cfg, "v", {}, launch_id=3, host="b", tag="3-0123456789ab-r1", rank=1)
    assert "--nnodes 2 --node-rank 0 --dist-init-addr 10.0.0.5:29500" in r0.command
    assert "--nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.5:29500" in r1.command
    assert r0.log_path == "/logs/gpubot-v-3-0123456789ab.log"
    assert r1.log_path == "/logs/gpubot-v-3-0123456789ab-rank1.log"
    assert r1.env["GPUBOT_LAUNCH"] == "3-0123456789ab-r1"


def test_a_slurm_launch_leaves_the_ranks_variables_to_the_nodes():
    cfg = parse_config(_data(host="login", nodes=2, gpus_per_node=1))
    r = render_launch(cfg, "v", {}, launch_id=4, host="login", tag="4-0123456789ab", slurm=True)
    assert '--nnodes "${GPUBOT_NNODES}" --node-rank "${GPUBOT_NODE_RANK}"' in r.command
    assert '--dist-init-addr "${GPUBOT_MASTER_ADDR}":29500' in r.command


def test_the_batch_script_sends_each_ranks_output_to_its_log_and_tags_its_processes():
    script = batch_script(SbatchSpec(nodes=2, gpus_per_node=1), "serve", job_name="v-4", output="/logs/v-batch.log",
                          env={"GPUBOT_LAUNCH": "4-ab"}, master_port=29500, log_path="/logs/v.log",
                          rank_logs=("/logs/v-rank", ".log"), tag_var="GPUBOT_LAUNCH", workdir="/data/run x")
    assert "cd '/data/run x' || exit 1" in script.splitlines()
    step = script.splitlines()[-1]
    assert 'GPUBOT_LAUNCH="${GPUBOT_LAUNCH}-r$SLURM_NODEID"' in step
    assert "exec >>/logs/v.log 2>&1" in step and '>>/logs/v-rank"$SLURM_NODEID".log' in step


def test_a_multi_host_variant_whose_first_host_has_no_address_is_warned_about():
    from bot.config.checks import config_warnings

    data = _data(hosts=["l1", "l2"], gpus=[0])
    data["hosts"].update({"l1": {"local": True, "log_dirs": ["/logs"]}, "l2": {"local": True, "log_dirs": ["/logs"]}})
    warnings = config_warnings(parse_config(data))
    assert any("variants.v.hosts: its first host l1 has no `address`" in w for w in warnings), warnings
    assert not any("master_addr" in w for w in config_warnings(parse_config(_data(hosts=["a", "b"], gpus=[0]))))


def test_a_job_node_the_config_does_not_have_is_reached_through_its_login_node():
    from bot.adapters.slurm import SrunExecutor
    from bot.services.hosts import HostService

    hosts = HostService(parse_config(_data(host="login", nodes=2)))
    name = hosts.job_node("login", "12", "gpu-9")
    assert name == "gpu-9@login:job12" and hosts.job_node("login", "12", "gpu-9") == name
    cfg = hosts.host_config(name)
    assert cfg.log_dirs == ["/logs"] and not cfg.local and not cfg.probe_agent and not cfg.use_nvml
    ex = hosts.executor(name)
    assert isinstance(ex, SrunExecutor) and ex.login is hosts.executor("login")
    # the command reaches the node quoted once for the login node's shell
    words = shlex.split(ex.step_command("echo 'a b'; exit 3"))
    assert words == ["srun", "--overlap", "--quiet", "--chdir=/", "--jobid=12", "--nodelist=gpu-9", "--nodes=1",
                     "--ntasks=1", "sh", "-c", "echo 'a b'; exit 3"]
    assert hosts.host_config("a").log_dirs == ["/logs"]
    with pytest.raises(KeyError):
        hosts.host_config("gpu-9")
    with pytest.raises(KeyError):
        hosts.job_node("nope", "13", "gpu-9")
    # job 12 of another cluster's login node is another node: never the first cluster's executor
    data = _data(host="login", nodes=2)
    data["hosts"]["login2"] = {**HOST, "address": "10.0.0.9", "runner": "slurm"}
    hosts = HostService(parse_config(data))
    one, two = hosts.job_node("login", "12", "gpu-9"), hosts.job_node("login2", "12", "gpu-9")
    assert one != two and hosts.executor(two).login is hosts.executor("login2")


def test_the_nodes_of_old_jobs_are_forgotten(monkeypatch):
    from bot.services import hosts as hosts_module

    monkeypatch.setattr(hosts_module, "JOB_NODES_KEPT", 4)
    hosts = hosts_module.HostService(parse_config(_data(host="login", nodes=2)))
    first = hosts.executor(hosts.job_node("login", "1", "n1"))
    names = [hosts.job_node("login", str(job), node) for job in (1, 2, 3) for node in ("n1", "n2")]
    assert hosts.executor(names[-1]).node == "n2"
    with pytest.raises(KeyError):  # job 1's nodes went first
        hosts.host_config(names[0])
    assert hosts.host_config(names[2]).log_dirs == ["/logs"]
    again = hosts.job_node("login", "1", "n1")  # asked for again: made again
    assert again == names[0] and hosts.executor(again) is not first
