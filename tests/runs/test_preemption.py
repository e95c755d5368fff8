"""A preempted fit says so and resumes to the same numbers: the real ``layerwise fit`` stopped by SIGTERM (or
SIGUSR1) mid-epoch and at an epoch's end, on one process and on two (``ddp`` and ``ddp_spawn`` over gloo, README's
two-node ``torchrun`` with one process per node, FSDP2 with its sharded ``last.ckpt`` folder), then resumed with the
command its closing line gives.

The fit is a tiny quickstart (alternating aligned training of a 2-block ViT with dropout and stochastic depth, on
shuffled digits, every epoch analysed): a resume that lost the random states, the data order or the position in the
epoch changes the weights and the summaries. The signal is sent at a chosen step by the test-only callback
``signals.SignalAt`` (``tests/signals.py``). The stopped process exits 128 + the signal's number (each node's
``torchrun`` exits 1, its failure report naming that code) and its last line names the stop and the resume command;
the resumed run's final ``last.ckpt`` weights and every summary equal those of the uninterrupted run bit for bit (the
issue asks 1e-12; the CPU kernels are deterministic). The two-process cases are ``slow`` (``.ci/run`` runs them:
``pytest -m slow tests/runs/test_preemption.py``).
"""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import TRAINING_ONLY, assert_json_close, free_port

from layerwise.engines.checkpoint import consolidate_sharded

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
STEPS_PER_EPOCH, EPOCHS = 4, 3
CONFIG = f"""
seed_everything: 0
threads: 1
trainer:
  accelerator: cpu
  devices: 1
  max_epochs: {EPOCHS}
  limit_train_batches: {STEPS_PER_EPOCH}
  limit_val_batches: 2
  log_every_n_steps: 1
  enable_progress_bar: false
  enable_model_summary: false
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger
    init_args: {{save_dir: runs, name: tiny, default_hp_metric: false}}
  callbacks:
    - class_path: layerwise.callbacks.LayerwiseAnalysis
      init_args: {{every_n_epochs: 1, log_figures: false}}
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{monitor: val/acc, mode: max}}
    - class_path: lightning.pytorch.callbacks.ModelCheckpoint
      init_args: {{filename: last, enable_version_counter: false}}
model:
  class_path: layerwise.lightning_modules.AlternatingAligned
  init_args:
    backbone:
      class_path: layerwise.features.TimmViT
      init_args:
        {{model_name: vit_tiny_patch16_224, img_size: 8, patch_size: 2, in_chans: 1, embed_dim: 16, depth: 2,
         num_heads: 2, num_classes: 10, pooling: mean, drop_rate: 0.1, drop_path_rate: 0.1}}
    optimizer:
      class_path: torch.optim.AdamW
      init_args: {{lr: 0.01}}
    lr_scheduler:
      class_path: layerwise.lightning_modules.WarmupCosineLR
      init_args: {{warmup_epochs: 1, max_epochs: {EPOCHS}}}
data:
  class_path: layerwise.datamodules.DigitsDataModule
  init_args: {{batch_size: 32}}
"""
DDP = ["--trainer.devices=2", "--trainer.strategy=ddp"]
FSDP = [  # configs/trainer/fsdp_gpu.yaml with the CPU stand-ins of tests/runs/test_launchers.py
    "--config",
    str(REPO / "configs/trainer/fsdp_gpu.yaml"),
    "--trainer.accelerator=cpu",
    "--trainer.devices=2",
    "--trainer.strategy.init_args.data_parallel_size=2",
    "--trainer.precision=32-true",
]
TORCHRUN = ["--trainer.num_nodes=2", "--trainer.devices=1", "--trainer.strategy=ddp"]  # one process per "node"
LAUNCHERS = {
    "one": [],
    "ddp": DDP,
    "ddp_spawn": ["--config", str(REPO / "configs/trainer/ddp_cpu.yaml")],
    "fsdp": FSDP,
    "torchrun": TORCHRUN,
}
STOPPED = re.compile(
    r"^layerwise fit: stopped by (SIG\w+) (.*) \(step (\d+)\); resumable checkpoint (\S+); resume with: (.*)$"
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="signals and launchers as on a Linux node")


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MASTER_", "LOCAL_RANK", "WORLD_"))}
    path = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])  # tests/: signals.SignalAt
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=path)
    return env


def layerwise(cwd: Path, arguments: list[str], launcher: str = "one") -> subprocess.CompletedProcess:
    """``layerwise ARGUMENTS`` in ``cwd``; under ``torchrun``: two nodes of one process each, their torchrun agents
    launched as README's line does on two machines, their output joined (node 1's first, so that global rank 0's last
    line comes last) and the exit code they share (-1 when they differ)."""
    if launcher != "torchrun":
        entry = [str(Path(sys.executable).with_name("layerwise")), *arguments]
        return subprocess.run(entry, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)
    port = free_port()
    nodes = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"),
                *(f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}"),
                *("-m", "layerwise", *arguments),
            ],
            **dict(cwd=cwd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        )
        for node in (0, 1)
    ]
    outputs = []
    try:
        outputs = [node.communicate(timeout=TIMEOUT_S) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    codes = {node.returncode for node in nodes}
    stdout = outputs[1][0] + outputs[0][0]
    stderr = f"--- node 0\n{outputs[0][1]}\n--- node 1\n{outputs[1][1]}"
    return subprocess.CompletedProcess(nodes[0].args, codes.pop() if len(codes) == 1 else -1, stdout, stderr)


def fit(cwd: Path, extra: list[str], launcher: str = "one") -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    (cwd / "tiny.yaml").write_text(CONFIG)
    return layerwise(cwd, ["fit", "--config", "tiny.yaml", *LAUNCHERS[launcher], *extra], launcher)


def signal_at(step: int, name: str = "SIGTERM", rank: int = 0, target: str = "process") -> list[str]:
    return [
        "--trainer.callbacks+=signals.SignalAt",
        f"--trainer.callbacks.step={step}",
        f"--trainer.callbacks.signal={name}",
        f"--trainer.callbacks.rank={rank}",
        f"--trainer.callbacks.target={target}",
    ]


def outcome(run: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict]]:
    """The final ``last.ckpt`` weights (a sharded FSDP2 folder gathered on this process) and every summary of
    ``run`` (by file name)."""
    last = run / "checkpoints" / "last.ckpt"
    if last.is_dir():
        weights = consolidate_sharded(last)["state_dict"]
    else:
        weights = torch.load(last, map_location="cpu", weights_only=True)["state_dict"]
    summaries = {path.name: json.loads(path.read_text()) for path in sorted((run / "layerwise").glob("*.json"))}
    return weights, summaries


def assert_same_run(resumed: Path, uninterrupted: Path, validations: int = EPOCHS) -> None:
    weights, summaries = outcome(resumed)
    reference_weights, reference_summaries = outcome(uninterrupted)
    assert weights.keys() == reference_weights.keys()
    for name, reference in reference_weights.items():  # bit for bit on the CPU (the bound: 1e-12)
        torch.testing.assert_close(weights[name], reference, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert sorted(summaries) == sorted(reference_summaries) and len(summaries) == validations
    for name, reference in reference_summaries.items():
        assert_json_close(summaries[name], reference, atol=0, where=name)


def last_line(process: subprocess.CompletedProcess) -> str:
    lines = process.stdout.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, Path]:
    """The uninterrupted fits, made once: one process, and (made on first use) two."""
    made: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("uninterrupted")

    def run(launcher: str) -> Path:
        if launcher not in made:
            finished = fit(root / launcher, [], launcher)
            assert finished.returncode == 0, finished.stderr[-4000:]
            assert last_line(finished).startswith(f"layerwise fit: {EPOCHS} epochs, step {EPOCHS * STEPS_PER_EPOCH};")
            made[launcher] = root / launcher / "runs" / "tiny" / "version_0"
        return made[launcher]

    return run


def stop_and_resume(
    cwd: Path, launcher: str, step: int, name: str = "SIGTERM", rank: int = 0, target: str = "process"
) -> str:
    """Stop a fit under ``launcher`` at ``step`` by ``name`` sent to ``rank``'s ``target`` (its process or its
    launcher: then at a later step, whenever the launcher's signal reaches the workers), check how it stopped,
    resume it with the command its closing line gives; the stop's line."""
    stopped = fit(cwd, signal_at(step, name, rank, target), launcher)
    signum = getattr(signal, name)
    output = f"rc {stopped.returncode}\n{stopped.stdout[-3000:]}\n{stopped.stderr[-5000:]}"
    if launcher == "torchrun":  # each node's torchrun exits 1, naming its worker's exit code or the signal it got
        node_0, node_1 = stopped.stderr.split("--- node 1\n")
        assert stopped.returncode == 1 and f"exitcode  : {128 + signum} " in node_0, output
        said = f"exitcode  : {128 + signum} " if target == "process" else f"Received {signum} death signal"
        assert said in node_1, output
    else:
        assert stopped.returncode == 128 + signum, output
    line = last_line(stopped)
    match = STOPPED.match(line)
    assert match, f"not a stop line: {line!r}\n{output}"
    assert match.group(1) == name
    if target == "process":
        assert int(match.group(3)) == step
    else:  # a step boundary after the launcher passed the signal on, before the fit's end
        assert step <= int(match.group(3)) < EPOCHS * STEPS_PER_EPOCH
    assert sum(bool(STOPPED.match(x)) for x in stopped.stdout.splitlines()) == 1, "one closing line, on rank 0 only"
    command = shlex.split(match.group(5))
    assert command[-2:] == ["--ckpt_path", "last"]
    if launcher == "torchrun":  # every node's own torchrun options, then the command
        assert command[:4] == ["torchrun", "…", "-m", "layerwise"], command
        command = command[3:]
    assert command[0] == "layerwise"
    assert Path(match.group(4)) == Path("runs/tiny/version_0/checkpoints/last.ckpt")
    summaries_before = {path.name: path.read_text() for path in (cwd / "runs/tiny/version_0/layerwise").glob("*.json")}
    resumed = layerwise(cwd, command[1:], launcher)
    assert resumed.returncode == 0, f"rc {resumed.returncode}\n{resumed.stdout[-3000:]}\n{resumed.stderr[-5000:]}"
    assert last_line(resumed).startswith(f"layerwise fit: {EPOCHS} epochs, step {EPOCHS * STEPS_PER_EPOCH};")
    assert not (cwd / "runs/tiny/version_1").exists(), "the resumed fit continues in the run it resumes"
    torchruns = stopped.stderr.count("errors.ChildFailedError: \n") + stopped.stderr.count("api.SignalException: ")
    assert stopped.stderr.count("Traceback") == torchruns, stopped.stderr[-5000:]
    assert "Traceback" not in resumed.stderr, resumed.stderr[-5000:]
    assert "not empty" not in resumed.stderr, resumed.stderr
    for name_, text in summaries_before.items():  # written before the stop: kept as they were
        assert (cwd / "runs/tiny/version_0/layerwise" / name_).read_text() == text
    assert not list((cwd / "runs/tiny/version_0").rglob("*.earlier-*")), "nothing moved aside: each written once"
    _, summaries = outcome(cwd / "runs/tiny/version_0")
    assert len({summary["run_id"] for summary in summaries.values()}) == 1, "one run, before and after the stop"
    return line


@pytest.mark.parametrize(
    ("step", "where"),
    [(6, "in epoch 1 after batch 2"), pytest.param(4, "at the end of epoch 0", marks=pytest.mark.slow)],
    ids=["mid-epoch", "epoch-boundary"],  # the boundary in .ci/run's slow list: 15 s of the default run
)
def test_a_fit_stopped_by_sigterm_resumes_to_the_uninterrupted_run(uninterrupted, tmp_path, step, where):
    line = stop_and_resume(tmp_path, "one", step)
    assert where in line
    assert_same_run(tmp_path / "runs/tiny/version_0", uninterrupted("one"))


@pytest.mark.slow  # in .ci/run's slow list: 20 s and 13 s of the default run
def test_a_signal_before_a_validation_inside_the_epoch_stops_after_it(tmp_path):
    """With a validation every 2 batches, SIGTERM at step 6 (a validation follows it) stops after step 7."""
    every_2 = ["--trainer.val_check_interval=2"]
    reference = fit(tmp_path / "uninterrupted", every_2)
    assert reference.returncode == 0, reference.stderr[-4000:]
    stopped = fit(tmp_path / "stopped", [*every_2, *signal_at(6)])
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-4000:]
    assert "in epoch 1 after batch 3 (step 7)" in last_line(stopped)
    resumed = layerwise(tmp_path / "stopped", shlex.split(STOPPED.match(last_line(stopped)).group(5))[1:])
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    run, reference_run = (tmp_path / folder / "runs/tiny/version_0" for folder in ("stopped", "uninterrupted"))
    _, summaries = outcome(reference_run)
    assert len(summaries) == 2 * EPOCHS  # two validations an epoch: the one after step 6 too
    assert_same_run(run, reference_run, validations=2 * EPOCHS)


@pytest.mark.slow  # in .ci/run's slow list: 20 s and 13 s of the default run
def test_sigusr1_stops_a_fit_the_same_way(uninterrupted, tmp_path):
    """SLURM's ``--signal=SIGUSR1@90`` warning: the same stop, exit 138."""
    stop_and_resume(tmp_path, "one", 7, "SIGUSR1")
    assert_same_run(tmp_path / "runs/tiny/version_0", uninterrupted("one"))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("launcher", "step", "rank"),
    [("ddp", 6, 1), ("ddp", 8, 0), ("ddp_spawn", 6, 1)],
    ids=["mid-epoch-signal-to-rank-1", "epoch-boundary-signal-to-rank-0", "ddp_spawn-mid-epoch"],
)
def test_a_ddp_fit_stopped_on_one_rank_stops_every_rank_and_resumes(uninterrupted, tmp_path, launcher, step, rank):
    """Two processes (``ddp`` over gloo, and ``ddp_spawn``, whose parent exits with its workers' code): a signal to
    either rank stops both at the same step, both save."""
    stop_and_resume(tmp_path, launcher, step, rank=rank)
    assert_same_run(tmp_path / "runs/tiny/version_0", uninterrupted(launcher))


@TRAINING_ONLY
def test_lightnings_slurm_requeue_still_runs_on_sigusr1(tmp_path, monkeypatch):
    """Under SLURM with ``SLURMEnvironment(auto_requeue=True)``: Lightning's SIGUSR1 handler still saves its
    ``hpc_ckpt_1.ckpt`` and calls ``scontrol requeue <job>`` (a stand-in on PATH records it), and the fit then stops
    with layerwise's checkpoint and exit code 138."""
    from helpers import fitted_module, train_loader, trainer
    from lightning.pytorch.plugins.environments import SLURMEnvironment
    from signals import SignalAt

    from layerwise.cli.preemption import Preempted, Preemption

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "scontrol.txt"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for name, value in dict(
        SLURM_NTASKS="1", SLURM_JOB_NAME="fit", SLURM_JOB_ID="4242", SLURM_PROCID="0", SLURM_LOCALID="0",
        SLURM_NODEID="0", SLURM_NODELIST="node1",
    ).items():  # fmt: skip
        monkeypatch.setenv(name, value)
    preemption = Preemption(["fit", "--config", "run.yaml"])
    job = trainer(
        tmp_path,
        [SignalAt(3, "SIGUSR1"), preemption],
        plugins=[SLURMEnvironment(auto_requeue=True)],
        max_epochs=2,
        limit_val_batches=0,
    )
    with pytest.raises(Preempted) as stopped:
        job.fit(fitted_module(), train_loader(96, batch_size=16))
    assert stopped.value.code == 128 + signal.SIGUSR1
    assert (tmp_path / "scontrol.txt").read_text().split() == ["requeue", "4242"]
    assert (tmp_path / "hpc_ckpt_1.ckpt").is_file(), "Lightning's own checkpoint"
    saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert saved["global_step"] == 3 and len(saved["layerwise_random_states"]) == 1
    named = tmp_path / "checkpoints" / "last.ckpt"  # no ModelCheckpoint: `--ckpt_path last` would find nothing
    assert stopped.value.line.endswith(f"resume with: layerwise fit --config run.yaml --ckpt_path {named}")


@TRAINING_ONLY
def test_a_sigterm_lightning_caught_before_the_loops_still_saves_and_says_so(tmp_path):
    """SIGTERM between Lightning's handler registration and the training loop: Lightning alone would end the fit
    with exit 0 at its next check; here it is a preemption at the first step."""
    from helpers import fitted_module, train_loader, trainer
    from lightning.pytorch import Callback

    from layerwise.cli.preemption import Preempted, Preemption

    class CaughtByLightning(Callback):
        def on_train_start(self, trainer, pl_module):
            os.kill(os.getpid(), signal.SIGTERM)  # Lightning's handler still holds SIGTERM here

    job = trainer(tmp_path, [CaughtByLightning(), Preemption(["fit"])], max_epochs=1, limit_val_batches=0)
    with pytest.raises(Preempted) as stopped:
        job.fit(fitted_module(), train_loader(64, batch_size=16))
    assert stopped.value.code == 143 and "in epoch 0 after batch 1 (step 1)" in stopped.value.line
    assert torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1


@pytest.mark.slow  # in .ci/run's slow list
@pytest.mark.parametrize(
    ("launcher", "step", "target"),
    [("torchrun", 6, "process"), ("torchrun", 5, "launcher"), ("fsdp", 6, "process")],
    ids=["torchrun-signal-to-node-1-worker", "torchrun-signal-to-node-1-torchrun", "fsdp2-signal-to-rank-1"],
)
def test_a_two_node_torchrun_or_fsdp2_fit_stopped_on_one_rank_stops_every_rank_and_resumes(
    uninterrupted, tmp_path, launcher, step, target
):
    """README's two-node ``torchrun`` (one process per node, gloo) and FSDP2 (``configs/trainer/fsdp_gpu.yaml`` on two
    CPU processes, its ``last.ckpt`` a sharded folder): a SIGTERM to rank 1 (or to node 1's torchrun, which passes it
    on to its worker) stops both ranks at the same step, both save; the resume (under torchrun, each node's torchrun
    running the command the line gives) ends with the uninterrupted run's weights and summaries."""
    stop_and_resume(tmp_path, launcher, step, rank=1, target=target)
    assert_same_run(tmp_path / "runs/tiny/version_0", uninterrupted(launcher))
