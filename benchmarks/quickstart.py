"""Time the quickstart and check it against its promise: `layerwise fit --config configs/quickstart.yaml` finishes in
at most 180 s and reaches a last-layer validation accuracy of at least 0.95.

Runs exactly that command (``python -m layerwise fit --config <repo>/configs/quickstart.yaml``, with this
interpreter) in a fresh working directory, so its ``runs/`` folder lands there and not in the repository, measures
the wall time of the whole process (start-up and imports included, as a user sees it), then reads the last
``<log_dir>/layerwise/val_epoch_<EEE>.json`` the analysis callback wrote and takes ``accuracy[-1]``, the shared
head's accuracy at the last layer over the whole validation split.

Exit status: 0 when both bounds hold, 1 when one is missed, 2 when the fit fails or writes no summary.

    .venv/bin/python benchmarks/quickstart.py
    .venv/bin/python benchmarks/quickstart.py --run-dir /tmp/qs       # keep the run (TensorBoard logs, checkpoints)
    .venv/bin/python benchmarks/quickstart.py -- --trainer.max_epochs 2   # extra CLI arguments (a smoke run)
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import torch

from layerwise.results import is_summary, summary_order

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _record import load_now, record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "quickstart.yaml"
MAX_SECONDS = 180.0
MIN_ACCURACY = 0.95


def last_summary(run_dir: Path) -> Optional[Path]:
    """The ``val_epoch_<EEE>_step_<SSSSSSS>.json`` of the latest validation anywhere under ``run_dir``, or None."""
    summaries = [path for path in run_dir.rglob("layerwise/val_epoch_*.json") if is_summary(path)]
    return max(summaries, key=summary_order, default=None)


def run_fit(run_dir: Path, extra: list[str]) -> tuple[int, float, Path]:
    """Run the quickstart fit in ``run_dir``; return its exit status, wall seconds and the path of its output."""
    command = [sys.executable, "-m", "layerwise", "fit", "--config", str(CONFIG), *extra]
    print("running:", " ".join(command), f"(in {run_dir})", flush=True)
    log = run_dir / "fit.log"
    with log.open("w") as output:
        start = time.perf_counter()
        status = subprocess.call(command, cwd=run_dir, stdout=output, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
    return status, seconds, log


def report(seconds: float, summary_path: Path, load_before: Optional[float] = None, shipped: bool = True) -> bool:
    """Print the figures against the bounds (and record them for README when the shipped config ran); True when
    both hold."""
    summary = json.loads(summary_path.read_text())
    accuracy = summary["accuracy"][-1]
    layers = summary["layers"]
    time_ok = seconds <= MAX_SECONDS
    accuracy_ok = accuracy is not None and accuracy >= MIN_ACCURACY
    print(f"summary: {summary_path} (epoch {summary['epoch']}, {summary['num_samples']} validation samples)")
    print(f"wall time            {seconds:8.1f} s    bound <= {MAX_SECONDS:.0f} s     {'ok' if time_ok else 'MISSED'}")
    shown = "n/a" if accuracy is None else f"{accuracy:.4f}"
    status = "ok" if accuracy_ok else "MISSED"
    print(f"val accuracy, layer {layers[-1]} {shown:>8}      bound >= {MIN_ACCURACY:.2f}    {status}")
    per_layer = ", ".join("n/a" if value is None else f"{value:.3f}" for value in summary["accuracy"])
    print(f"val accuracy per layer (shared head): {per_layer}")
    if shipped:
        values = {
            "wall_seconds": round(seconds, 1),
            "minutes": round(seconds / 60, 2),
            "accuracy_percent": None if accuracy is None else round(100 * accuracy, 2),
            "epochs": summary["epoch"] + 1,
        }
        record("quickstart", values, load_before)
    return time_ok and accuracy_ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, help="working directory of the fit, kept (default: a temporary one)")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: extra arguments for `layerwise fit`")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')}, nproc {affinity}, torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads, cuda available: {torch.cuda.is_available()}"
    )
    if not CONFIG.exists():
        print(f"{CONFIG} does not exist", file=sys.stderr)
        return 2
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="layerwise_quickstart_"))
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        load_before = load_now()
        status, seconds, log = run_fit(run_dir.resolve(), extra)
        summary = last_summary(run_dir)
        if status != 0 or summary is None:
            tail = log.read_text(errors="replace")[-4000:]
            print(f"the fit {'exited with ' + str(status) if status else 'wrote no val_epoch_*.json'}:\n{tail}")
            return 2
        return 0 if report(seconds, summary, load_before, shipped=not extra) else 1
    finally:
        if args.run_dir is None:
            shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
