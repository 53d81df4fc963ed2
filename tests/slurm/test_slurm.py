"""slurm/: the sbatch templates run on a real one-node Slurm cluster that this module starts and stops.

The cluster (slurm/local_cluster.sh: munged, slurmctld, slurmd, all state in a temporary directory)
runs the unmodified templates with a tiny CPU config: torchrun with two gloo processes. CI installs
Slurm first (.ci/install_slurm.sh) and the cluster tests must run there; on a developer machine
without Slurm they skip. Every wait has a deadline, and the daemons are stopped even when a test fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest
import torch

from flashtrain import checkpoint as ckpt
from flashtrain.config import compose_config
from flashtrain.tracking import run_id
from flashtrain.trainer import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLURM_DIR = os.path.join(ROOT, "slurm")
STEPS = 40
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}
# A signal sent when the step-5 checkpoint appears must land before step 40. The debug model's steps
# take ~15 ms (the 35 steps left can end before the signal gets through); this one's take ~250 ms on
# two CPU cores, so the signal has about 8 s to arrive.
CPU_RUN = [
    "debug=cpu", "trainer.device=cpu", f"trainer.max_steps={STEPS}", "trainer.checkpoint_interval=5",
    "model.n_layer=4", "model.d_model=128", "model.max_seq_len=256", "trainer.seq_len=256", "trainer.batch_size=4",
]  # fmt: skip


# ---- the cluster ------------------------------------------------------------------------------------


def _missing_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the test cluster's slurmd must run as root"
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol") if shutil.which(b) is None]
    return f"{', '.join(missing)} not installed (run .ci/install_slurm.sh)" if missing else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Cluster:
    state: str
    env: dict  # environment for Slurm commands and the jobs they submit
    work: str  # submit directory: the jobs' logs land here
    cache: str  # data cache shared by every job


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    missing = _missing_slurm()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the Slurm tests, but {missing}")
        pytest.skip(f"no Slurm on this machine: {missing}")
    base = tmp_path_factory.mktemp("slurm")
    state = str(base / "cluster")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
        "FLASHTRAIN_SLURMCTLD_PORT": str(_free_port()),
        "FLASHTRAIN_SLURMD_PORT": str(_free_port()),
        "SLURM_CONF": os.path.join(state, "slurm.conf"),
        "FLASHTRAIN_ROOT": ROOT,
        "PYTHON": sys.executable,
        "WANDB_SILENT": "true",
        "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
    }
    script = os.path.join(SLURM_DIR, "local_cluster.sh")
    try:
        subprocess.run(
            [script, "start", state], env=env, check=True, timeout=120, capture_output=True, text=True
        )
        yield Cluster(state, env, str(base / "work"), str(base / "cache"))
    except subprocess.CalledProcessError as e:
        pytest.fail(f"the test cluster did not start:\n{e.stderr}")
    finally:
        subprocess.run([script, "stop", state], env=env, timeout=120, capture_output=True)


def _scontrol_job(cluster: Cluster, job: str) -> dict:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job], env=cluster.env, capture_output=True, text=True, timeout=30
    ).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out.splitlines()[0])) if out.strip() else {}


def submit(cluster: Cluster, template: str, overrides: list[str], sbatch_args=(), **env) -> str:
    os.makedirs(cluster.work, exist_ok=True)
    cmd = ["sbatch", "--parsable", *sbatch_args, os.path.join(SLURM_DIR, template), *overrides]
    result = subprocess.run(
        cmd, env={**cluster.env, **env}, cwd=cluster.work, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, f"sbatch failed: {result.stderr}"
    return result.stdout.strip().split(";")[0]


def job_log(cluster: Cluster, job: str, name: str = "flashtrain") -> str:
    path = os.path.join(cluster.work, f"{name}-{job}.out")
    return open(path).read() if os.path.exists(path) else "(no log yet)"


def wait_until(cluster: Cluster, job: str, done, timeout: float, what: str) -> dict:
    """Poll the job until done(job info) holds; on the deadline cancel it and fail with its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _scontrol_job(cluster, job)
        if info and done(info):
            return info
        time.sleep(0.25)
    subprocess.run(["scancel", job], env=cluster.env, timeout=30)
    pytest.fail(
        f"job {job}: no '{what}' within {timeout:.0f}s; state {info.get('JobState')}\n{job_log(cluster, job)}"
    )


def wait_done(cluster: Cluster, job: str, timeout: float = 150) -> dict:
    return wait_until(cluster, job, lambda i: i["JobState"] in TERMINAL, timeout, "end")


def final_history(run_dir: str) -> list[float]:
    state = torch.load(os.path.join(ckpt.latest_checkpoint(run_dir), "train_state.pt"), weights_only=True)
    return list(state["history"])


# ---- runs on the cluster ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def uninterrupted(cluster):
    """The multi-node template on one node (c10d rendezvous at the first node's address), two processes."""
    out = os.path.join(cluster.work, "runs")
    job = submit(
        cluster,
        "multi_node.sbatch",
        [*CPU_RUN, f"data.cache_dir={cluster.cache}"],
        ["--nodes=1", "--gpus-per-node=0", "--cpus-per-task=2"],
        NPROC_PER_NODE="2",
        OUT_DIR=out,
        RUN_NAME="straight",
    )
    info = wait_done(cluster, job)
    return job, info, os.path.join(out, "straight")


@pytest.mark.timeout(200)
def test_template_job_completes_with_a_checkpoint(cluster, uninterrupted):
    job, info, run_dir = uninterrupted
    log = job_log(cluster, job)
    assert info["JobState"] == "COMPLETED", log
    assert "rendezvous 127.0.0.1" in log and "2 processes" in log
    assert os.path.basename(ckpt.latest_checkpoint(run_dir)) == f"step_{STEPS:07d}"
    meta = ckpt.read_meta(ckpt.latest_checkpoint(run_dir))
    assert meta["config"]["parallel"]["strategy"] == "ddp"  # the launcher chose DDP for 2 processes
    history = final_history(run_dir)
    assert len(history) == STEPS and history[-1] < history[0]


@pytest.mark.timeout(300)
def test_requeue_before_a_checkpoint_then_usr1_mid_run_ends_like_the_uninterrupted_run(
    cluster, uninterrupted
):
    out = os.path.join(cluster.work, "runs")
    run_dir = os.path.join(out, "preempted")
    job = submit(
        cluster,
        "single_node.sbatch",
        [*CPU_RUN, f"data.cache_dir={cluster.cache}", "logger.kind=wandb"],
        ["--gpus-per-node=0", "--cpus-per-task=2"],
        NPROC_PER_NODE="2",
        OUT_DIR=out,
        RUN_NAME="preempted",
    )
    # 1. An admin's requeue while the job starts: there is no checkpoint yet, the rerun starts fresh.
    # RUNNING and the template's first line printed: a requeue before that line would leave no trace
    # of the first attempt in the log, and the attempts below are counted from it
    wait_until(
        cluster,
        job,
        lambda i: i["JobState"] == "RUNNING" and re.search(r"^job \d+ on ", job_log(cluster, job), re.M),
        60,
        "RUNNING with its first log line",
    )
    assert ckpt.latest_checkpoint(run_dir) is None
    subprocess.run(["scontrol", "requeue", job], env=cluster.env, check=True, timeout=30)
    # 2. Slurm's preemption warning mid-run (what --signal=USR1@N sends): checkpoint, requeue, resume.
    wait_until(
        cluster,
        job,
        lambda i: (
            i["Restarts"] == "1" and os.path.exists(os.path.join(run_dir, "checkpoints", "step_0000005"))
        ),
        120,
        "second attempt's step-5 checkpoint",
    )
    subprocess.run(["scancel", "--signal=USR1", job], env=cluster.env, check=True, timeout=30)
    info = wait_done(cluster, job, timeout=200)
    log = job_log(cluster, job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "2", log

    attempts = re.split(r"^job \d+ on ", log, flags=re.M)[1:]  # the template's first line, once per attempt
    assert len(attempts) == 3, log
    assert "has no checkpoint yet, starting at step 0" in attempts[1]
    assert "preemption signal received" in attempts[1] and "resumed from" in attempts[2]
    stopped = re.search(r"preemption signal received: checkpointing at step (\d+)", log)
    resumed = re.search(r"resumed from \S+step_(\d+) at step (\d+)", log)
    assert stopped and resumed and int(stopped[1]) == int(resumed[2]) < STEPS, log
    assert "requeued Slurm job" in log

    _, _, straight_dir = uninterrupted
    assert final_history(run_dir) == final_history(straight_dir)  # bit-for-bit on CPU: nothing was lost

    wandb_dir = os.path.join(run_dir, "wandb")
    runs = [d for d in os.listdir(wandb_dir) if d.startswith("offline-run-")]
    assert len(runs) >= 2 and all(r.endswith(run_id("preempted")) for r in runs)  # one W&B run, continued


@pytest.mark.timeout(200)
def test_bad_input_fails_with_one_message_and_starts_nothing(cluster):
    cpu = [*CPU_RUN, f"data.cache_dir={cluster.cache}"]
    small = ["--gpus-per-node=0", "--cpus-per-task=1"]
    out = os.path.join(cluster.work, "bad")
    cases = {
        # the GPU template as written (bar the CPU count), on a node whose GPUs torch cannot see
        submit(
            cluster,
            "single_node.sbatch",
            ["debug=cpu"],
            ["--gpus-per-node=2", "--cpus-per-task=1"],
            OUT_DIR=out,
        ): ("the job asks for 2 GPU processes per node, but this node shows 0 GPUs to torch"),
        submit(cluster, "single_node.sbatch", cpu, small, OUT_DIR="/proc/flashtrain"): (
            "cannot write the run directory /proc/flashtrain/"
        ),
        submit(cluster, "single_node.sbatch", [*cpu, "trainer.run_name=x"], small, OUT_DIR=out): (
            "'trainer.run_name=x': the launcher sets trainer.run_name"
        ),
    }
    for job, message in cases.items():
        info = wait_done(cluster, job, timeout=90)
        log = job_log(cluster, job)
        assert info["JobState"] == "FAILED" and message in log and "Traceback" not in log, log
    assert not os.path.exists(os.path.join(out, "x")) and not any(
        os.path.exists(os.path.join(out, d, "checkpoints")) for d in os.listdir(out)
    )


@pytest.mark.timeout(200)
def test_sweep_array_runs_one_member_per_task(cluster):
    out = os.path.join(cluster.work, "sweep")
    job = submit(
        cluster,
        "single_node.sbatch",
        ["debug=cpu", "trainer.device=cpu", "trainer.max_steps=2", f"data.cache_dir={cluster.cache}"],
        ["--array=0-1", "--gpus-per-node=0", "--cpus-per-task=1", "--job-name=sw"],
        NPROC_PER_NODE="1",
        OUT_DIR=out,
        SWEEP="optim.lr=1e-3,3e-4",
    )
    lrs = {}
    for task in (0, 1):
        info = wait_done(cluster, f"{job}_{task}")
        assert info["JobState"] == "COMPLETED", job_log(cluster, f"{job}_{task}", "sw")
        meta = ckpt.read_meta(ckpt.latest_checkpoint(os.path.join(out, f"sw-{job}_{task}")))
        lrs[task] = meta["config"]["optim"]["lr"]
    assert lrs == {0: 1e-3, 1: 3e-4}


# ---- without a cluster ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "script, message",
    [
        ("single_node.sbatch", "submit it with 'sbatch slurm/single_node.sbatch"),
        ("multi_node.sbatch", "submit it with 'sbatch slurm/multi_node.sbatch"),
        ("launch.sh", "not inside a Slurm job (SLURM_JOB_ID is unset)"),
    ],
)
def test_outside_slurm_each_entry_point_says_how_to_submit(script, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(
        ["bash", os.path.join(SLURM_DIR, script), "debug=cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr


def test_documented_torchrun_commands_single_node_and_two_nodes_agree(tmp_path):
    # slurm/README.md's commands on CPU: one node with two processes, and two "nodes" (two torchrun
    # agents on this machine) with one process each, meeting at a c10d rendezvous: both are dp=2.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
    run = [
        "debug=cpu",
        "parallel=ddp",
        "trainer.device=cpu",
        "trainer.max_steps=3",
        f"data.cache_dir={tmp_path}/c",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    train = os.path.join(ROOT, "train.py")

    def train_args(name):
        return [train, *run, f"trainer.out_dir={tmp_path}/runs", f"trainer.run_name={name}"]

    single = [*torchrun, "--standalone", "--nproc-per-node=2", *train_args("one-node")]
    subprocess.run(single, env=env, check=True, timeout=180, capture_output=True)
    port = _free_port()
    multi = [
        *torchrun, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=two-nodes", *train_args("two-nodes"),
    ]  # fmt: skip
    logs = [open(tmp_path / f"agent{i}.log", "w+") for i in range(2)]  # files: a full pipe would block
    agents = [subprocess.Popen(multi, env=env, stdout=log, stderr=subprocess.STDOUT) for log in logs]
    try:
        for agent, log in zip(agents, logs, strict=True):
            if agent.wait(timeout=180) != 0:
                log.seek(0)
                pytest.fail(f"torchrun agent failed:\n{log.read()[-3000:]}")
    finally:
        for agent, log in zip(agents, logs, strict=True):
            if agent.poll() is None:
                agent.kill()
            log.close()
    one, two = (final_history(f"{tmp_path}/runs/{name}") for name in ("one-node", "two-nodes"))
    assert len(one) == 3 and one == two


def _sweep_module():
    spec = importlib.util.spec_from_file_location("slurm_sweep", os.path.join(SLURM_DIR, "sweep.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_members_follow_hydra_multirun_order(capsys):
    sweep = _sweep_module()
    members = sweep.sweep_members(["+sweep=lr", "trainer.seed=1,2", "debug=cpu"])
    # configs/sweep/lr.yaml's values first, then the command line's, as `train.py -m` runs them
    assert [(m[0], m[2]) for m in members] == [
        (f"optim.lr={lr}", f"trainer.seed={seed}") for lr in (0.001, 0.0006, 0.0003) for seed in (1, 2)
    ]
    assert all(m[1] == "+sweep=lr" and m[3] == "debug=cpu" for m in members)
    assert sweep.main(["--task", "6", "+sweep=lr", "trainer.seed=1,2"]) == 1
    assert "submit with sbatch --array=0-5" in capsys.readouterr().err


def _cfg(tmp_path, *overrides):
    return compose_config(
        ["debug=cpu", f"trainer.out_dir={tmp_path}/runs", f"data.cache_dir={tmp_path}/cache", *overrides]
    )


def test_signal_during_the_first_step_checkpoints_step_1_and_auto_resume_finishes_the_same(
    tmp_path, monkeypatch
):
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"):
        monkeypatch.delenv(var, raising=False)  # never requeue the job pytest itself may run in
    run = ["trainer.max_steps=4", "model.dropout=0.1"]
    straight = Trainer(_cfg(tmp_path, "trainer.run_name=whole", *run))
    expected = straight.fit()
    trainer = Trainer(_cfg(tmp_path, "trainer.run_name=early", "trainer.resume=auto", *run))
    assert trainer.step == 0  # auto with no checkpoint: a fresh start, not an error
    first_step = trainer.train_step

    def signalled_step():
        os.kill(os.getpid(), signal.SIGUSR1)  # arrives while step 1 runs, before any checkpoint exists
        trainer.train_step = first_step
        return first_step()

    trainer.train_step = signalled_step
    assert trainer.fit() == expected[:1] and trainer.preempted
    assert os.path.basename(ckpt.latest_checkpoint(trainer.run_dir)) == "step_0000001"
    resumed = Trainer(_cfg(tmp_path, "trainer.run_name=early", "trainer.resume=auto", *run))
    assert resumed.step == 1 and resumed.fit() == expected


@pytest.mark.parametrize("value, stored", [("true", "true"), ("False", "false"), ("auto", "auto")])
def test_resume_modes(tmp_path, value, stored):
    assert _cfg(tmp_path, f"trainer.resume={value}").trainer.resume == stored


def test_resume_mode_typo_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.resume='always'; choose false .* true .* or auto"):
        _cfg(tmp_path, "trainer.resume=always")
