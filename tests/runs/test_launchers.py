"""Every trainer command under every launcher a user has, to its last line: the real ``layerwise`` entry point.

Each cell runs ``layerwise fit``, ``validate``, ``test`` and ``predict`` as a user types them (the shipped
quickstart config, cut to a couple of batches) in fresh processes, under one process, DDP x2 (``ddp``: Lightning
re-runs the command for rank 1), ``ddp_spawn`` x2 (``configs/trainer/ddp_cpu.yaml``), FSDP2 x2
(``configs/trainer/fsdp_gpu.yaml`` with CPU stand-ins for its GPU flags) and README's two-node ``torchrun`` line
simulated with one process per node. Each command must end with rc 0 on every process and exactly one closing line,
and write what the one-process run writes: the fit trains with ``lr=0`` (the weights stay as seeded, so the data
order of the distributed sampler cannot make the runs differ), so every summary equals the one-process summary to
1e-6, and the early-exit predictions are the same rows.

Every cell is ``slow`` (``pytest -m slow tests/runs/test_launchers.py``, run by ``.ci/run``): the one-process reference
and ``ddp`` alone took 95 s of the default suite, which must stay within ten minutes on two cores. FSDP2 also evaluates
its own fit's sharded ``last.ckpt/`` folder in place: ``validate`` and ``test`` land beside that run, labelled by the
checkpoint's epoch and step (read here from the folder's ``meta.pt`` with torch itself), as they do for every single-
file checkpoint.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import assert_json_close, free_port

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart.yaml"
CUT = [
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=2",
    "--model.init_args.optimizer.init_args.lr=0.0",
    "--model.init_args.optimizer.init_args.weight_decay=0.0",
]
WRITER = [
    "--trainer.callbacks+=layerwise.callbacks.EarlyExitPredictionWriter",
    "--trainer.callbacks.threshold=0.5",
]
COMMANDS = ("fit", "validate", "test", "predict")
TIMEOUT_S = 240

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="launches processes as on a Linux node")


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MASTER_", "LOCAL_RANK", "WORLD_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", WANDB_MODE="offline")
    return env


def launcher_options(launcher: str) -> list[str]:
    """The flags (and configs) that put a command under ``launcher``; the GPU configs with their CPU stand-ins."""
    if launcher == "one":
        return []
    if launcher == "ddp":  # configs/trainer/ddp_gpu.yaml's strategy on two CPU processes
        return ["--trainer.devices=2", "--trainer.strategy=ddp"]
    if launcher == "ddp_spawn":
        return ["--config", str(REPO / "configs/trainer/ddp_cpu.yaml")]
    if launcher == "fsdp":  # stand-ins: the CPU for the GPUs, 2 processes for 8, float32 for bf16-mixed
        return [
            "--config",
            str(REPO / "configs/trainer/fsdp_gpu.yaml"),
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
            "--trainer.strategy.init_args.data_parallel_size=2",
            "--trainer.precision=32-true",
        ]
    if launcher == "torchrun":  # README's line: ddp_gpu.yaml, num_nodes=2; 1 CPU process per node for 8 GPUs
        return [
            "--config",
            str(REPO / "configs/trainer/ddp_gpu.yaml"),
            "--trainer.accelerator=cpu",
            "--trainer.precision=32-true",
            "--trainer.num_nodes=2",
            "--trainer.devices=1",
        ]
    raise ValueError(launcher)


def run_command(cwd: Path, launcher: str, command: str, extra: list[str]) -> list[subprocess.CompletedProcess]:
    """``layerwise COMMAND`` under ``launcher`` in ``cwd``; the finished processes (two for ``torchrun``)."""
    arguments = [command, "--config", str(QUICKSTART), *CUT, *launcher_options(launcher), *extra]
    if launcher != "torchrun":
        entry = [str(Path(sys.executable).with_name("layerwise")), *arguments]
        return [subprocess.run(entry, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S)]
    port = free_port()
    nodes = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"),
                *(f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}"),
                *("-m", "layerwise", *arguments),
            ],
            cwd=cwd,
            env=environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    finished = []
    for node in nodes:
        try:
            stdout, stderr = node.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in nodes:
                other.kill()
            raise
        finished.append(subprocess.CompletedProcess(node.args, node.returncode, stdout, stderr))
    return finished


CLOSING = {
    "fit": r"^layerwise fit: \d+ epochs?, step \d+;",
    "validate": r"^layerwise validate: checkpoint .* -> ",
    "test": r"^layerwise test: checkpoint .* -> ",
    "predict": r"^layerwise predict: checkpoint .*: .* predictions written to ",
}


def check_finished(processes: list[subprocess.CompletedProcess], command: str) -> str:
    """rc 0 everywhere and exactly one closing line among all processes' output; that line."""
    for process in processes:
        assert process.returncode == 0, f"rc {process.returncode}\n{process.stdout[-3000:]}\n{process.stderr[-6000:]}"
    lines = [line for p in processes for line in p.stdout.splitlines() if re.match(CLOSING[command], line)]
    everything = "\n".join(p.stdout for p in processes)
    assert len(lines) == 1, f"{len(lines)} closing lines of `layerwise {command}`:\n{everything[-4000:]}"
    return lines[0]


def summaries(folder: Path) -> dict[str, dict]:
    """Every summary under ``folder`` by file name, without the ``run_id`` (which run wrote it)."""
    found = {}
    for path in sorted(folder.rglob("layerwise/*.json")):
        found[path.name] = {k: v for k, v in json.loads(path.read_text()).items() if k != "run_id"}
    return found


def run_cell(root: Path, launcher: str) -> dict:
    """Every command under ``launcher`` in ``root``: fit, then validate/test/predict of the one-process checkpoint."""
    root.mkdir(parents=True)
    results: dict = {"lines": {}}
    fitted = run_command(root, launcher, "fit", [])
    results["lines"]["fit"] = check_finished(fitted, "fit")
    results["fit"] = summaries(root / "runs" / "quickstart" / "version_0")
    assert results["fit"], f"no summary under {root}"
    layers = sorted((root / "runs" / "quickstart" / "version_0" / "layers").iterdir())
    events = [len(list(folder.glob("events.out.tfevents.*"))) for folder in layers]
    assert layers and events == [1] * len(layers), events  # TensorBoard's run per layer, written by global rank zero
    return results


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The one-process run of every command: the summaries and predictions the other launchers must equal."""
    root = tmp_path_factory.mktemp("one")
    results = run_cell(root / "fit", "one")
    checkpoint = root / "fit" / "runs" / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file()
    results["checkpoint"] = checkpoint
    return merged(results, evaluate(root, "one", checkpoint))


def evaluate(root: Path, launcher: str, checkpoint: Path) -> dict:
    """``validate``, ``test`` and ``predict`` of ``checkpoint`` under ``launcher``, each in its own folder."""
    results: dict = {"lines": {}}
    for command in ("validate", "test", "predict"):
        folder = root / command
        folder.mkdir(parents=True)
        extra = [f"--ckpt_path={checkpoint}"]
        if command == "predict":
            extra += [*WRITER, f"--trainer.callbacks.output_path={folder / 'exits.csv'}"]
        else:  # next to the checkpoint's run would mix the launchers' results: this folder instead
            extra += [f"--trainer.logger.init_args.save_dir={folder / 'runs'}"]
        processes = run_command(folder, launcher, command, extra)
        results["lines"][command] = check_finished(processes, command)
        if command != "predict" and launcher != "one":  # one line on exactness, not Lightning's advice of devices=1
            assert "and the analysis counts each sample once" in "\n".join(p.stdout for p in processes)
            assert "replicates some samples" not in "\n".join(p.stderr for p in processes)  # Lightning's words
        if command == "predict":
            results[command] = (folder / "exits.csv").read_text()
        else:
            results[command] = summaries(folder / "runs")
            assert results[command], f"no {command} summary under {folder}"
    return results


def merged(fitted: dict, evaluated: dict) -> dict:
    """The results of a fit and of the evaluations, their closing lines together."""
    return {**fitted, **evaluated, "lines": {**fitted["lines"], **evaluated["lines"]}}


def check_equal(actual: dict, expected: dict) -> None:
    for command in COMMANDS:
        if command == "predict":
            assert actual[command] == expected[command], "the early-exit predictions differ"
        else:
            assert sorted(actual[command]) == sorted(expected[command])
            assert_json_close(actual[command], expected[command], atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_one_process_every_command_ends_with_its_closing_line(reference):
    assert set(reference["lines"]) == set(COMMANDS)
    assert "val/acc" in reference["lines"]["fit"] and "summaries" in reference["lines"]["fit"]
    assert reference["predict"].startswith("index,prediction,exit_layer,target")


@pytest.mark.parametrize(
    "launcher",
    [pytest.param(launcher, marks=pytest.mark.slow) for launcher in ("ddp", "ddp_spawn", "fsdp", "torchrun")],
)
def test_every_command_under_the_launcher_ends_and_equals_one_process(tmp_path, reference, launcher):
    results = merged(run_cell(tmp_path / "fit", launcher), evaluate(tmp_path, launcher, reference["checkpoint"]))
    check_equal(results, reference)
    assert "nothing was trained" not in results["lines"]["fit"]
    if launcher == "fsdp":
        check_evaluated_in_place(tmp_path / "fit", launcher)


def check_evaluated_in_place(root: Path, launcher: str) -> None:
    """``validate``/``test``/``predict`` of the fit's own (sharded) ``last.ckpt`` beside its run, at its epoch/step."""
    import torch

    run = root / "runs" / "quickstart" / "version_0"
    checkpoint = run / "checkpoints" / "last.ckpt"
    meta = torch.load(checkpoint / "meta.pt", map_location="cpu", weights_only=False) if checkpoint.is_dir() else {}
    assert meta, f"{checkpoint} is not a sharded checkpoint folder"
    epoch, step = int(meta["epoch"]), int(meta["global_step"])
    assert step > 0
    label = f"epoch {epoch}, step {step}"
    for command in ("validate", "test", "predict"):
        extra = [f"--ckpt_path={checkpoint}"]
        if command == "predict":
            extra += [*WRITER, f"--trainer.callbacks.output_path={root / 'exits.csv'}"]
        processes = run_command(root, launcher, command, extra)
        line = check_finished(processes, command)
        assert f"checkpoint {checkpoint} ({label})" in line, line
        stderr = "\n".join(p.stderr for p in processes)
        assert "dirpath" not in stderr, stderr[-3000:]
        if command == "predict":
            continue
        folder = run / f"{command}_epoch_{epoch:03d}_step_{step:07d}"
        assert line.endswith(f"-> {folder}"), line
        stage, words = ("val", "validation") if command == "validate" else ("test", "test")
        assert f"layerwise {words}, {label}:" in "\n".join(p.stdout for p in processes)  # the console table
        assert (folder / "layerwise" / f"{stage}_epoch_{epoch:03d}_step_{step:07d}.json").is_file()
        assert not (root / "runs" / "quickstart" / "version_1").exists(), "the evaluation went into a new version"
