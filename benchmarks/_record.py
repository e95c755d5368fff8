"""What a benchmark measured, kept where README's numbers are checked against it.

Every number README states about speed, time or accuracy is produced by a script here. The script calls
:func:`record` with what it measured; :func:`record` writes ``benchmarks/recorded/<name>.json`` with the values and
the circumstances a reader needs to judge them: the date, the command, the commit, the machine (CPU model, cores
the process may use, torch threads) and the load (the 1-minute load average before and after the run, since other
processes on a shared machine slow a measurement down). ``tests/project/test_readme_claims.py`` reads these files and
fails when a number in README that is marked ``<!-- claim: <name>.<key> -->`` differs from the recorded value.

One file per record and machine kind: ``<name>.json`` for a run on the CPU, ``<name>_cuda_<gpu>.json`` (``_cuda_h100``,
``_cuda_h200``) for one on a GPU, the suffix added here from the device's name. A record's name is its script's name,
then its case or configuration where a script records several (``callback_overhead_deit_s``,
``compare_precision_bf16_tf32``, ``threads_40_epochs``); never a commit, a run number or a date. A re-run replaces the
file; git keeps the earlier ones (``tests/project/test_benchmark_results.py`` checks the names).
"""

import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).resolve().parent / "recorded"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    # A copy of the tree without git (the device machine) names its commit in LAYERWISE_COMMIT.
    if os.environ.get("LAYERWISE_COMMIT"):
        return os.environ["LAYERWISE_COMMIT"]
    try:
        result = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=RECORDED.parent
        )
    except OSError:
        return "unknown"
    return result.stdout.strip() or "unknown"


def machine() -> dict[str, Any]:
    """The machine a measurement ran on, and its load right now (1-minute load average)."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "load_average_1min": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def gpu_kind(device_name: str) -> str:
    """A GPU's suffix from its name: ``_cuda_h100`` for "NVIDIA H100 80GB HBM3", ``_cuda_h200`` for "NVIDIA H200"."""
    model = re.search(r"\b([A-Z]+\d+[A-Z]*)\b", device_name)
    return f"_cuda_{model.group(1).lower() if model else 'gpu'}"


def machine_kind(device: str = "cpu") -> str:
    """The record's suffix for a run on ``device``: "" on a CPU, :func:`gpu_kind` of the GPU on CUDA."""
    if not str(device).startswith("cuda"):
        return ""
    import torch

    return gpu_kind(torch.cuda.get_device_name(0))


def record(name: str, values: dict[str, Any], load_before: float | None = None, device: str = "cpu") -> Path:
    """Write ``benchmarks/recorded/<name><machine kind>.json``: ``values``, date, command, commit, machine and load.

    ``device`` is where the measured work ran; a CUDA device adds its kind to the name (:func:`machine_kind`).
    """
    RECORDED.mkdir(exist_ok=True)
    entry = {
        "values": values,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", *[Path(sys.argv[0]).as_posix().split("/layerwise/")[-1], *sys.argv[1:]]]),
        "commit": _commit(),
        "machine": {**machine(), "load_average_1min_before": load_before},
    }
    path = RECORDED / f"{name}{machine_kind(device)}.json"
    path.write_text(json.dumps(entry, indent=1) + "\n")
    print(f"recorded -> {path.relative_to(RECORDED.parent.parent)}")
    return path


def load_now() -> float | None:
    """The 1-minute load average, to pass to :func:`record` as ``load_before``."""
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
